//! One request with every field a number (`engine.read` and `engine.write`): no request
//! object to read by property name, and, when it completed, a number back instead of a
//! status object with strings (TS builds that object; index.ts `completedTask`).

use ferry_core::task::TaskSnapshot;
use ferry_core::{TransferStatus, TransportKind};
use napi::bindgen_prelude::Either;

use crate::convert::{TaskStatus, TransferRequest};

/// A transport as a number from JS: 0 none, else `TransportKind`'s value.
pub(crate) fn transport_name(code: u32, what: &str) -> Result<Option<String>, ferry_core::Error> {
    match code {
        0 => Ok(None),
        1 => Ok(Some(TransportKind::Tcp.name().to_string())),
        2 => Ok(Some(TransportKind::Shm.name().to_string())),
        3 => Ok(Some(TransportKind::Rdma.name().to_string())),
        other => Err(ferry_core::Error::InvalidArgument(format!(
            "{what} must be 0 to 3, got {other}"
        ))),
    }
}

/// The request the numbers describe (checked like any other by `convert::requests`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn request(
    opcode: u32,
    local: f64,
    local_offset: f64,
    segment: f64,
    remote_buffer: f64,
    remote_offset: f64,
    length: f64,
    transport: u32,
    require_transport: u32,
) -> Result<TransferRequest, ferry_core::Error> {
    let opcode = match opcode {
        0 => "read",
        1 => "write",
        other => {
            return Err(ferry_core::Error::InvalidArgument(format!(
                "opcode must be 0 (read) or 1 (write), got {other}"
            )))
        }
    };
    Ok(TransferRequest {
        opcode: opcode.to_string(),
        local,
        local_offset: Some(local_offset),
        segment,
        remote_buffer: Some(remote_buffer),
        remote_offset: Some(remote_offset),
        length,
        transport: transport_name(transport, "transport")?,
        require_transport: transport_name(require_transport, "requireTransport")?,
    })
}

/// The outcome of one request: when it completed, `transport + 256 * attempts` (its bytes
/// are its length); otherwise its whole status.
pub struct OneOutcome(Either<f64, TaskStatus>);

impl From<TaskSnapshot> for OneOutcome {
    fn from(s: TaskSnapshot) -> Self {
        match (s.status, s.transport) {
            (TransferStatus::Completed, Some(t)) if s.transferred == s.length => Self(Either::A(
                f64::from(t as u8) + 256.0 * f64::from(s.attempts),
            )),
            _ => Self(Either::B(TaskStatus::from(s))),
        }
    }
}

impl Default for OneOutcome {
    /// What a request that was dropped unstarted reports (no Promise is left pending).
    fn default() -> Self {
        Self(Either::B(TaskStatus {
            status: u32::from(TransferStatus::Failed.raw()),
            name: TransferStatus::Failed.name().to_string(),
            transferred_bytes: 0.0,
            length: 0.0,
            transport: None,
            attempts: 0,
            code: Some("ERR_FERRY_CLOSED".to_string()),
            message: Some("the request was dropped before it started".to_string()),
        }))
    }
}

crate::ffi::to_napi_value_by_field!(OneOutcome);
