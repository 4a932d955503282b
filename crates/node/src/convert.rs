//! Conversions between JS values and core types, one file per concern under `convert/`:
//! engine options (`options`, and the per-transport `transport_options`), transfer
//! requests (`requests`), statuses and descriptions (`status`), failures (`failure`),
//! events (`events`) and counters and the threads and lanes in use (`metrics`). No decisions live here.

mod events;
mod failure;
mod metrics;
mod options;
mod requests;
mod status;
mod transport_options;

use ferry_core::{Error, ErrorCode};

pub use events::EngineEventJs;
pub use failure::FailureJs;
pub use metrics::{EngineMetrics, EngineSpreadJs};
pub use options::EngineOptions;
pub use requests::TransferRequest;
pub(crate) use requests::{hint, requests};
pub use status::{BatchStatusJs, OpenResult, RegionInfo, SegmentDesc, TaskStatusJs};

/// A failure of napi itself (making an object, a Promise) as an `ERR_FERRY_INTERNAL` JS error.
pub(crate) fn internal(e: napi::Error) -> napi::Error<String> {
    napi::Error::new(ErrorCode::Internal.name().to_string(), e.to_string())
}

/// A JS error carrying the core's stable code by name (`err.code`, set by napi: no
/// message is read to learn it).
pub(crate) fn js_error(e: Error) -> napi::Error<String> {
    napi::Error::new(e.code().to_string(), e.to_string())
}
