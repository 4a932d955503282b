//! What JS reads back: task and batch statuses, and the descriptions of local regions
//! and opened segments.

use ferry_core::handle::{HandleKind, Handles};
use ferry_core::{SegmentInfo, TaskSnapshot};
use napi_derive::napi;

/// Status of one task.
#[napi(object)]
pub struct TaskStatus {
    /// Raw status (TENT numbering).
    pub status: u32,
    /// Status name.
    pub name: String,
    /// Bytes moved (a lower bound while pending).
    pub transferred_bytes: f64,
    /// Requested bytes.
    pub length: f64,
    /// Transport of the latest attempt.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: Option<String>,
    /// Attempts made.
    pub attempts: u32,
    /// Error code when it did not complete.
    pub code: Option<String>,
    /// Error message when it did not complete.
    pub message: Option<String>,
}

impl From<TaskSnapshot> for TaskStatus {
    fn from(s: TaskSnapshot) -> Self {
        Self {
            status: u32::from(s.status.raw()),
            name: s.status.name().to_string(),
            transferred_bytes: s.transferred as f64,
            length: s.length as f64,
            transport: s.transport.map(|t| t.name().to_string()),
            attempts: s.attempts,
            code: s.error.as_ref().map(|e| e.code().to_string()),
            message: s.error.as_ref().map(|e| e.to_string()),
        }
    }
}

/// Aggregate status of a batch.
#[napi(object)]
pub struct BatchStatus {
    /// Raw status.
    pub status: u32,
    /// Status name.
    pub name: String,
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
    /// Error code otherwise.
    pub code: Option<String>,
    /// Error message otherwise.
    pub message: Option<String>,
}
