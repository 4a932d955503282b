//! Transfer requests: the `TransferRequest` objects of a call, converted into core
//! `Request`s with their handles checked to be this engine's. Opcodes and transports come
//! as numbers (lib/tables.ts has them by name).

use ferry_core::handle::{HandleKind, Handles};
use ferry_core::{Error, Opcode, Request, TransportHint};
use napi_derive::napi;

use crate::js::{numbered, opt_transport, to_u64};

/// One transfer request.
#[napi(object)]
pub struct TransferRequest {
    /// Opcode number (`Opcode`: 0 read, 1 write).
    pub opcode: f64,
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
    /// Transport number to try first, fallback allowed (`TransportKind`) [0: none].
    pub transport: Option<f64>,
    /// Transport number of the only transport that may serve the request [0: none].
    pub require_transport: Option<f64>,
    /// Check the bytes end to end with a CRC32C [the engine's `verify`].
    pub verify: Option<bool>,
}

/// The hint of a request's two transport numbers.
pub(crate) fn hint(transport: f64, require_transport: f64) -> Result<TransportHint, Error> {
    TransportHint::from_fields(
        opt_transport(transport, "transport")?,
        opt_transport(require_transport, "requireTransport")?,
    )
    .map_err(Error::InvalidArgument)
}

/// One request, its region and segment handles checked to be this engine's.
fn request(r: &TransferRequest, handles: &Handles) -> Result<Request, Error> {
    Ok(Request {
        opcode: numbered::<Opcode>(r.opcode, "opcode")?,
        local: handles.decode(HandleKind::Region, to_u64(r.local, "local")?)?,
        local_offset: to_u64(r.local_offset.unwrap_or(0.0), "localOffset")?,
        segment: handles.decode(HandleKind::Segment, to_u64(r.segment, "segment")?)?,
        remote_buffer: to_u64(r.remote_buffer.unwrap_or(0.0), "remoteBuffer")?,
        remote_offset: to_u64(r.remote_offset.unwrap_or(0.0), "remoteOffset")?,
        length: to_u64(r.length, "length")?,
        hint: hint(
            r.transport.unwrap_or(0.0),
            r.require_transport.unwrap_or(0.0),
        )?,
        verify: r.verify.unwrap_or(false),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(handles: &Handles, opcode: f64, transport: f64) -> TransferRequest {
        TransferRequest {
            opcode,
            local: handles.encode(HandleKind::Region, 1) as f64,
            local_offset: None,
            segment: handles.encode(HandleKind::Segment, 1) as f64,
            remote_buffer: None,
            remote_offset: None,
            length: 1.0,
            transport: Some(transport),
            require_transport: None,
            verify: None,
        }
    }

    #[test]
    fn out_of_range_opcodes_and_transports_are_invalid_arguments() {
        let handles = Handles::with_tag(1);
        assert!(requests(&[numbers(&handles, 1.0, 2.0)], &handles).is_ok());
        for (opcode, transport, what) in [
            (2.0, 0.0, "request 0: opcode must be 0 (read) or 1 (write), got 2"),
            (-1.0, 0.0, "request 0: opcode must be 0 (read) or 1 (write), got -1"),
            (1.0, 4.0, "request 0: transport must be 0 (none), 1 (tcp), 2 (shm) or 3 (rdma), got 4"),
            (0.0, 1e12, "request 0: transport must be 0 (none), 1 (tcp), 2 (shm) or 3 (rdma), got 1000000000000"),
        ] {
            let e = requests(&[numbers(&handles, opcode, transport)], &handles).expect_err(what);
            assert_eq!(e, Error::InvalidArgument(what.into()));
            assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT");
        }
        assert_eq!(
            hint(1.0, 1.0),
            Ok(TransportHint::Require(ferry_core::TransportKind::Tcp))
        );
        assert!(hint(1.0, 2.0).is_err(), "two different transports");
    }
}
