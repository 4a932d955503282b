//! Transfer requests: the `TransferRequest` objects of a call, converted into core
//! `Request`s with their handles checked to be this engine's.

use ferry_core::handle::{HandleKind, Handles};
use ferry_core::{Error, Opcode, Request, TransportHint, TransportKind};
use napi_derive::napi;

use crate::js::to_u64;

/// One transfer request.
#[napi(object)]
pub struct TransferRequest {
    /// "read" or "write".
    pub opcode: String,
    /// Local region id.
    pub local: f64,
    /// Offset in the local region [0].
    pub local_offset: Option<f64>,
    /// Segment handle from openSegment.
    pub segment: f64,
    /// Remote buffer id [0].
    pub remote_buffer: Option<f64>,
    /// Offset in the remote buffer [0].
    pub remote_offset: Option<f64>,
    /// Bytes to move.
    pub length: f64,
    /// Transport to try first (fallback allowed).
    pub transport: Option<String>,
    /// The only transport that may serve the request (no fallback).
    pub require_transport: Option<String>,
}

/// A transport name from JS.
pub(crate) fn transport(name: &str, what: &str) -> Result<TransportKind, Error> {
    TransportKind::parse(name).ok_or_else(|| {
        Error::InvalidArgument(format!("{what} must be tcp, shm or rdma, got {name:?}"))
    })
}

/// One request, its region and segment handles checked to be this engine's.
fn request(r: &TransferRequest, handles: &Handles) -> Result<Request, Error> {
    Ok(Request {
        opcode: Opcode::parse(&r.opcode)?,
        local: handles.decode(HandleKind::Region, to_u64(r.local, "local")?)?,
        local_offset: to_u64(r.local_offset.unwrap_or(0.0), "localOffset")?,
        segment: handles.decode(HandleKind::Segment, to_u64(r.segment, "segment")?)?,
        remote_buffer: to_u64(r.remote_buffer.unwrap_or(0.0), "remoteBuffer")?,
        remote_offset: to_u64(r.remote_offset.unwrap_or(0.0), "remoteOffset")?,
        length: to_u64(r.length, "length")?,
        hint: TransportHint::from_fields(
            r.transport
                .as_deref()
                .map(|t| transport(t, "transport"))
                .transpose()?,
            r.require_transport
                .as_deref()
                .map(|t| transport(t, "requireTransport"))
                .transpose()?,
        )
        .map_err(Error::InvalidArgument)?,
    })
}

/// Every request of a call; a bad one names its index.
pub(crate) fn requests(list: &[TransferRequest], handles: &Handles) -> Result<Vec<Request>, Error> {
    if list.is_empty() {
        return Err(Error::InvalidArgument("no requests given".into()));
    }
    list.iter()
        .enumerate()
        .map(|(i, r)| {
            request(r, handles).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("request {i}: {m}")),
                Error::ForeignHandle(m) => Error::ForeignHandle(format!("request {i}: {m}")),
                other => other,
            })
        })
        .collect()
}
