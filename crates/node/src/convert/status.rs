//! What JS reads back: task and batch statuses (statuses, transports and error codes as
//! numbers), and the descriptions of local regions and opened segments.

use ferry_core::handle::{HandleKind, Handles};
use ferry_core::{Numbered, SegmentInfo, TaskSnapshot};
use napi_derive::napi;

use super::FailureJs;

/// Status of one task, every name a number (lib/status.ts gives them their names).
#[napi(object)]
pub struct TaskStatusJs {
    /// Status number (`TransferStatus`: TENT's numbering).
    pub status: u32,
    /// Bytes moved (a lower bound while pending).
    pub transferred_bytes: f64,
    /// Requested bytes.
    pub length: f64,
    /// Transport number of the latest attempt (`TransportKind`); 0 before any.
    pub transport: u32,
    /// Attempts made.
    pub attempts: u32,
    /// Why it did not complete.
    pub error: Option<FailureJs>,
}

impl From<TaskSnapshot> for TaskStatusJs {
    fn from(s: TaskSnapshot) -> Self {
        Self {
            status: s.status.number(),
            transferred_bytes: s.transferred as f64,
            length: s.length as f64,
            transport: s.transport.map_or(0, Numbered::number),
            attempts: s.attempts,
            error: s.error.as_ref().map(FailureJs::from),
        }
    }
}

/// Aggregate status of a batch.
#[napi(object)]
pub struct BatchStatusJs {
    /// Status number.
    pub status: u32,
    /// Bytes moved.
    pub transferred_bytes: f64,
    /// Tasks in the batch.
    pub tasks: u32,
}

/// A local region as JS sees it.
#[napi(object)]
pub struct RegionInfo {
    /// Handle of the region in requests (names this engine).
    pub handle: f64,
    /// Buffer id: what peers name in `remoteBuffer`.
    pub id: f64,
    /// Length in bytes.
    pub length: f64,
}

/// A buffer of a remote segment.
#[napi(object)]
pub struct RemoteBuffer {
    /// Buffer id.
    pub id: f64,
    /// Length in bytes.
    pub length: f64,
    /// "read-only" or "read-write".
    #[napi(ts_type = "'read-only' | 'read-write'")]
    pub access: String,
    /// Transports it is registered with.
    #[napi(ts_type = "Array<'tcp' | 'shm' | 'rdma'>")]
    pub transports: Vec<String>,
}

/// An opened segment.
#[napi(object)]
pub struct SegmentDesc {
    /// Handle for requests.
    pub handle: f64,
    /// Segment name.
    pub name: String,
    /// Peer engine id (hex).
    pub engine_id: String,
    /// Exposed buffers.
    pub buffers: Vec<RemoteBuffer>,
}

impl SegmentDesc {
    /// The JS view of an opened segment, its handle encoded in this engine's space.
    pub(crate) fn new(s: SegmentInfo, handles: &Handles) -> Self {
        Self {
            handle: handles.encode(HandleKind::Segment, s.handle) as f64,
            name: s.name,
            engine_id: format!("{:016x}", s.engine_id),
            buffers: s
                .buffers
                .into_iter()
                .map(|b| RemoteBuffer {
                    id: b.id as f64,
                    length: b.length as f64,
                    access: match b.access {
                        ferry_core::Access::ReadOnly => "read-only".into(),
                        ferry_core::Access::ReadWrite => "read-write".into(),
                    },
                    transports: b.transports.iter().map(|t| t.name().to_string()).collect(),
                })
                .collect(),
        }
    }
}

/// Outcome of openSegment (a value; the TypeScript layer turns failures into rejections).
#[napi(object)]
#[derive(Default)]
pub struct OpenResult {
    /// The segment, when it opened.
    pub segment: Option<SegmentDesc>,
    /// Why it did not.
    pub error: Option<FailureJs>,
}
