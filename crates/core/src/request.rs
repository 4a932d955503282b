//! Transfer requests and their validation. Validation happens for every request of a
//! submission before anything moves: a bad request fails the whole submission with a typed
//! error and leaves no trace.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kind::{Opcode, TransportHint};
use crate::memory::{check_range, Access, Region, RegionId};
use crate::segment::{Peer, SegmentDescriptor};

impl Opcode {
    /// Parses "read" / "write".
    pub fn parse(s: &str) -> Result<Self> {
        Self::from_name(s).ok_or_else(|| {
            Error::InvalidArgument(format!("opcode must be 'read' or 'write', got {s:?}"))
        })
    }
}

/// One transfer as the user describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Read or write.
    pub opcode: Opcode,
    /// Local region id.
    pub local: RegionId,
    /// Offset in the local region.
    pub local_offset: u64,
    /// Handle of an opened segment.
    pub segment: u64,
    /// Buffer id inside the segment.
    pub remote_buffer: u64,
    /// Offset in the remote buffer.
    pub remote_offset: u64,
    /// Bytes to move.
    pub length: u64,
    /// What the request asks of the transport choice.
    pub hint: TransportHint,
}

/// A request whose every reference has been resolved and checked.
#[derive(Debug, Clone)]
pub struct ValidatedRequest {
    /// Read or write.
    pub opcode: Opcode,
    /// The local region (kept alive while the request lives).
    pub local: Arc<Region>,
    /// Offset in the local region.
    pub local_offset: u64,
    /// The peer.
    pub peer: Arc<Peer>,
    /// The descriptor the request was checked against.
    pub descriptor: Arc<SegmentDescriptor>,
    /// Buffer id inside the segment.
    pub remote_buffer: u64,
    /// Offset in the remote buffer.
    pub remote_offset: u64,
    /// Bytes to move.
    pub length: u64,
    /// What the request asks of the transport choice (decided on in `plan.rs`).
    pub hint: TransportHint,
}

/// Resolves and checks a request. `region` and `segment` look ids up in the engine's tables.
pub(crate) fn validate(
    req: &Request,
    region: impl Fn(RegionId) -> Result<Arc<Region>>,
    segment: impl Fn(u64) -> Result<(Arc<Peer>, Arc<SegmentDescriptor>)>,
) -> Result<ValidatedRequest> {
    if req.length == 0 {
        return Err(Error::InvalidArgument("length must be > 0".into()));
    }
    let local = region(req.local)?;
    check_range(req.local_offset, req.length, local.len() as u64).map_err(|e| match e {
        Error::OutOfRange(m) => Error::OutOfRange(format!("local region {}: {m}", req.local)),
        other => other,
    })?;
    let (peer, descriptor) = segment(req.segment)?;
    let buffer = descriptor
        .buffer(req.remote_buffer)
        .ok_or_else(|| Error::UnknownBuffer {
            segment: peer.name().to_string(),
            buffer: req.remote_buffer,
        })?;
    check_range(req.remote_offset, req.length, buffer.length).map_err(|e| match e {
        Error::OutOfRange(m) => Error::OutOfRange(format!(
            "remote buffer {} of {}: {m}",
            req.remote_buffer,
            peer.name()
        )),
        other => other,
    })?;
    if req.opcode == Opcode::Write && buffer.access == Access::ReadOnly {
        return Err(Error::PermissionDenied(format!(
            "remote buffer {} of {} is read-only",
            req.remote_buffer,
            peer.name()
        )));
    }
    if req.opcode == Opcode::Read && local.access() == Access::ReadOnly {
        return Err(Error::PermissionDenied(format!(
            "local region {} is read-only; it cannot receive a READ",
            req.local
        )));
    }
    Ok(ValidatedRequest {
        opcode: req.opcode,
        local,
        local_offset: req.local_offset,
        peer,
        remote_buffer: req.remote_buffer,
        remote_offset: req.remote_offset,
        length: req.length,
        hint: req.hint,
        descriptor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::TransportKind;
    use crate::memory::RegionTable;
    use crate::segment::{BufferDescriptor, SegmentTable};

    struct Fixture {
        regions: RegionTable,
        segments: SegmentTable,
        local: RegionId,
        seg: u64,
    }

    fn fixture() -> Fixture {
        let regions = RegionTable::default();
        let local = regions.allocate(4096).expect("allocate").id();
        let segments = SegmentTable::default();
        let desc = SegmentDescriptor {
            engine_id: 7,
            name: "127.0.0.1:1".into(),
            machine_id: "m".into(),
            pid: 1,
            tcp_addr: "127.0.0.1:1".into(),
            token: "00".repeat(16),
            buffers: vec![
                BufferDescriptor {
                    id: 0,
                    length: 8192,
                    access: Access::ReadWrite,
                    transports: vec![TransportKind::Tcp],
                    transport_info: Default::default(),
                },
                BufferDescriptor {
                    id: 1,
                    length: 100,
                    access: Access::ReadOnly,
                    transports: vec![TransportKind::Tcp],
                    transport_info: Default::default(),
                },
            ],
            transport_info: Default::default(),
        };
        let (peer, _) = segments.insert_with("127.0.0.1:1", |h| {
            Peer::new(h, "127.0.0.1:1".into(), desc.clone(), Default::default())
        });
        Fixture {
            regions,
            segments,
            local,
            seg: peer.handle(),
        }
    }

    fn check(f: &Fixture, req: &Request) -> Result<ValidatedRequest> {
        validate(
            req,
            |id| f.regions.get(id),
            |h| f.segments.get(h).map(|p| (p.clone(), p.descriptor())),
        )
    }

    fn good(f: &Fixture) -> Request {
        Request {
            opcode: Opcode::Write,
            local: f.local,
            local_offset: 0,
            segment: f.seg,
            remote_buffer: 0,
            remote_offset: 4096,
            length: 4096,
            hint: TransportHint::Auto,
        }
    }

    #[test]
    fn accepts_a_good_request() {
        let f = fixture();
        let v = check(&f, &good(&f)).expect("valid");
        assert_eq!(v.length, 4096);
        assert_eq!(v.peer.name(), "127.0.0.1:1");
    }

    #[test]
    fn each_kind_of_invalid_request_has_its_code() {
        let f = fixture();
        let cases: Vec<(Request, &str)> = vec![
            (
                Request {
                    length: 0,
                    ..good(&f)
                },
                "ERR_FERRY_INVALID_ARGUMENT",
            ),
            (
                Request {
                    local: 99,
                    ..good(&f)
                },
                "ERR_FERRY_UNKNOWN_REGION",
            ),
            (
                Request {
                    local_offset: 1,
                    ..good(&f)
                },
                "ERR_FERRY_OUT_OF_RANGE",
            ),
            (
                Request {
                    local_offset: u64::MAX,
                    ..good(&f)
                },
                "ERR_FERRY_OUT_OF_RANGE",
            ),
            (
                Request {
                    segment: 55,
                    ..good(&f)
                },
                "ERR_FERRY_UNKNOWN_SEGMENT",
            ),
            (
                Request {
                    remote_buffer: 9,
                    ..good(&f)
                },
                "ERR_FERRY_UNKNOWN_BUFFER",
            ),
            (
                Request {
                    remote_offset: 4097,
                    ..good(&f)
                },
                "ERR_FERRY_OUT_OF_RANGE",
            ),
            (
                Request {
                    remote_offset: u64::MAX - 1,
                    ..good(&f)
                },
                "ERR_FERRY_OUT_OF_RANGE",
            ),
            (
                Request {
                    remote_buffer: 1,
                    length: 10,
                    ..good(&f)
                },
                "ERR_FERRY_OUT_OF_RANGE",
            ),
            (
                Request {
                    remote_buffer: 1,
                    remote_offset: 0,
                    length: 10,
                    ..good(&f)
                },
                "ERR_FERRY_PERMISSION_DENIED",
            ),
        ];
        for (req, code) in cases {
            let err = check(&f, &req).expect_err("must be rejected");
            assert_eq!(err.code(), code, "{req:?}: {err}");
        }
        // Reading from a read-only remote buffer is fine.
        let read_ro = Request {
            opcode: Opcode::Read,
            remote_buffer: 1,
            remote_offset: 0,
            length: 10,
            ..good(&f)
        };
        assert!(check(&f, &read_ro).is_ok());
    }

    #[test]
    fn opcode_parsing() {
        assert_eq!(Opcode::parse("read").expect("read"), Opcode::Read);
        assert_eq!(Opcode::parse("write").expect("write"), Opcode::Write);
        assert!(Opcode::parse("copy").is_err());
    }
}
