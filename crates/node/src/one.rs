//! One request with every field a number (`engine.read` and `engine.write`): no request
//! object to read by property name, and, when it completed, a number back instead of a
//! status object (lib/status.ts `completedTask` builds that object).

use ferry_core::task::TaskSnapshot;
use ferry_core::{ErrorCode, Numbered, TransferStatus};
use napi::bindgen_prelude::Either;

use crate::convert::{FailureJs, TaskStatusJs, TransferRequest};

/// The request the numbers describe (checked like any other by `convert::requests`:
/// opcode and transports are table numbers, transport 0 none).
#[allow(clippy::too_many_arguments)]
pub(crate) fn request(
    opcode: f64,
    local: f64,
    local_offset: f64,
    segment: f64,
    remote_buffer: f64,
    remote_offset: f64,
    length: f64,
    transport: f64,
    require_transport: f64,
) -> TransferRequest {
    TransferRequest {
        opcode,
        local,
        local_offset: Some(local_offset),
        segment,
        remote_buffer: Some(remote_buffer),
        remote_offset: Some(remote_offset),
        length,
        transport: Some(transport),
        require_transport: Some(require_transport),
        // A verified request takes the general call (lib/engine.ts); the engine's
        // default still applies here.
        verify: None,
    }
}

/// The outcome of one request: when it completed, `transport + 256 * attempts` (its bytes
/// are its length); otherwise its whole status.
pub struct OneOutcome(Either<f64, TaskStatusJs>);

impl From<TaskSnapshot> for OneOutcome {
    fn from(s: TaskSnapshot) -> Self {
        match (s.status, s.transport) {
            (TransferStatus::Completed, Some(t)) if s.transferred == s.length => Self(Either::A(
                f64::from(t.number()) + 256.0 * f64::from(s.attempts),
            )),
            _ => Self(Either::B(TaskStatusJs::from(s))),
        }
    }
}

impl Default for OneOutcome {
    /// What a request that was dropped unstarted reports (no Promise is left pending).
    fn default() -> Self {
        Self(Either::B(TaskStatusJs {
            status: TransferStatus::Failed.number(),
            transferred_bytes: 0.0,
            length: 0.0,
            transport: 0,
            attempts: 0,
            error: Some(FailureJs::new(
                ErrorCode::Closed,
                "the request was dropped before it started",
            )),
        }))
    }
}

crate::ffi::to_napi_value_by_field!(OneOutcome);
