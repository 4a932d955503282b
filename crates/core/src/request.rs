//! Transfer requests and their validation. Validation happens for every request of a
//! submission before anything moves: a bad request fails the whole submission with a typed
//! error and leaves no trace.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kind::{Opcode, TransportHint};
use crate::lanes::Lent;
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
    /// Check the bytes end to end: a CRC32C of the source, checked at the destination
    /// (`verify`; `EngineConfig::verify` turns it on for every request).
    pub verify: bool,
}

/// One contiguous range a request moves: `length` bytes between `local_offset` of its
/// local region and `remote_offset` of its remote buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Offset in the local region.
    pub local_offset: u64,
    /// Offset in the remote buffer.
    pub remote_offset: u64,
    /// Bytes.
    pub length: u64,
}

/// Several spans between one region and one remote buffer, moved as one request: a block
/// list's scattered small blocks (`blocks.rs`). One task, one attempt and one completion
/// check carry them all; each transport moves the spans as it moves a request's slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gather {
    /// Read or write, for every span.
    pub opcode: Opcode,
    /// Local region id.
    pub local: RegionId,
    /// Handle of an opened segment.
    pub segment: u64,
    /// Buffer id inside the segment.
    pub remote_buffer: u64,
    /// The spans, in order (at least one).
    pub spans: Arc<[Span]>,
    /// What the request asks of the transport choice.
    pub hint: TransportHint,
    /// Check the bytes end to end: a CRC32C of the source, checked at the destination
    /// (`verify`; `EngineConfig::verify` turns it on for every request).
    pub verify: bool,
}

/// What a submission is made of: plain requests, or a block list's requests and gathers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// One contiguous range.
    One(Request),
    /// Several.
    Gather(Gather),
}

/// Something `validate` can check: a request or a gather.
pub(crate) trait Validate {
    /// The segment handle it goes to.
    fn segment(&self) -> u64;

    /// It as one plain request, when it is one (not a gather).
    fn one(&self) -> Option<&Request>;

    /// Resolves and checks it (`region` and `segment` look ids up in the engine's tables).
    fn validate(
        &self,
        region: impl Fn(RegionId) -> Result<Lent<Region>>,
        segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
    ) -> Result<ValidatedRequest>;
}

impl Validate for Request {
    fn segment(&self) -> u64 {
        self.segment
    }

    fn one(&self) -> Option<&Request> {
        Some(self)
    }

    fn validate(
        &self,
        region: impl Fn(RegionId) -> Result<Lent<Region>>,
        segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
    ) -> Result<ValidatedRequest> {
        validate(self, region, segment)
    }
}

impl Validate for Unit {
    fn segment(&self) -> u64 {
        match self {
            Self::One(r) => r.segment,
            Self::Gather(g) => g.segment,
        }
    }

    fn one(&self) -> Option<&Request> {
        match self {
            Self::One(r) => Some(r),
            Self::Gather(_) => None,
        }
    }

    fn validate(
        &self,
        region: impl Fn(RegionId) -> Result<Lent<Region>>,
        segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
    ) -> Result<ValidatedRequest> {
        match self {
            Self::One(r) => validate(r, region, segment),
            Self::Gather(g) => validate_gather(g, region, segment),
        }
    }
}

/// A request's spans: one, or a gather's (shared by its attempts and their slices).
#[derive(Debug, Clone)]
enum Spans {
    One(Span),
    Many(Arc<[Span]>),
}

impl Spans {
    fn as_slice(&self) -> &[Span] {
        match self {
            Self::One(s) => std::slice::from_ref(s),
            Self::Many(v) => v,
        }
    }
}

/// A request whose every reference has been resolved and checked.
#[derive(Debug, Clone)]
pub struct ValidatedRequest {
    /// Read or write.
    pub opcode: Opcode,
    /// The local region (kept alive while the request lives).
    pub local: Lent<Region>,
    /// The peer.
    pub peer: Lent<Peer>,
    /// The descriptor the request was checked against.
    pub descriptor: Arc<SegmentDescriptor>,
    /// Buffer id inside the segment.
    pub remote_buffer: u64,
    /// Bytes to move, all spans together.
    pub length: u64,
    /// What the request asks of the transport choice (decided on in `plan.rs`).
    pub hint: TransportHint,
    /// Check the bytes end to end: a CRC32C of the source, checked at the destination
    /// (`verify`; `EngineConfig::verify` turns it on for every request).
    pub verify: bool,
    spans: Spans,
}

/// A validated request's parts, borrowed: what planning and a transport that moves it on
/// the submitting thread (`Transport::complete_now`) read. A lone polled request is checked
/// into one of these straight from the tables (`check_lone`), taking no reference; a
/// [`ValidatedRequest`] lends one out ([`ValidatedRequest::view`]).
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    /// Read or write.
    pub opcode: Opcode,
    /// The local region.
    pub local: &'a Region,
    /// The peer.
    pub peer: &'a Peer,
    /// The descriptor the request was checked against.
    pub descriptor: &'a SegmentDescriptor,
    /// Buffer id inside the segment.
    pub remote_buffer: u64,
    /// Bytes to move, all spans together.
    pub length: u64,
    /// What the request asks of the transport choice.
    pub hint: TransportHint,
    /// Check the bytes end to end: a CRC32C of the source, checked at the destination
    /// (`verify`; `EngineConfig::verify` turns it on for every request).
    pub verify: bool,
    /// The ranges to move, each checked against the region and the buffer.
    pub spans: &'a [Span],
    /// Whether it is a gather (several spans moved as one request).
    pub gathered: bool,
}

impl ValidatedRequest {
    /// Its parts, borrowed.
    pub fn view(&self) -> RequestView<'_> {
        RequestView {
            opcode: self.opcode,
            local: &self.local,
            peer: &self.peer,
            descriptor: &self.descriptor,
            remote_buffer: self.remote_buffer,
            length: self.length,
            hint: self.hint,
            verify: self.verify,
            spans: self.spans(),
            gathered: self.gathered().is_some(),
        }
    }

    /// The ranges to move, each checked against the region and the buffer.
    pub fn spans(&self) -> &[Span] {
        self.spans.as_slice()
    }

    /// The spans as one shared list when there are several (a gather), for work items
    /// that each carry a run of them.
    pub fn gathered(&self) -> Option<&Arc<[Span]>> {
        match &self.spans {
            Spans::One(_) => None,
            Spans::Many(v) => Some(v),
        }
    }

    /// The spans cut into slices of at most `max` bytes (`max` > 0), in order.
    pub fn slices(&self, max: u64) -> impl Iterator<Item = Span> + '_ {
        let max = max.max(1);
        self.spans().iter().flat_map(move |s| {
            (0..s.length.div_ceil(max)).map(move |i| {
                let off = i * max;
                Span {
                    local_offset: s.local_offset + off,
                    remote_offset: s.remote_offset + off,
                    length: max.min(s.length - off),
                }
            })
        })
    }

    /// How many slices `slices(max)` yields.
    pub fn slice_count(&self, max: u64) -> u64 {
        let max = max.max(1);
        self.spans().iter().map(|s| s.length.div_ceil(max)).sum()
    }
}

/// What a request and a gather name besides their spans.
struct Head {
    opcode: Opcode,
    local: RegionId,
    segment: u64,
    remote_buffer: u64,
    hint: TransportHint,
    verify: bool,
}

/// The checks a request and a gather share: the references, then every span's two
/// ranges, then what the opcode may do to each side.
fn resolve(
    head: Head,
    spans: Spans,
    region: impl Fn(RegionId) -> Result<Lent<Region>>,
    segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
) -> Result<ValidatedRequest> {
    let Head {
        opcode,
        local: local_id,
        segment: segment_handle,
        remote_buffer,
        hint,
        verify,
    } = head;
    let local = region(local_id)?;
    let length = check_local(local_id, &local, spans.as_slice())?;
    let (peer, descriptor) = segment(segment_handle)?;
    check_remote(
        opcode,
        (local_id, &local),
        &peer,
        &descriptor,
        remote_buffer,
        spans.as_slice(),
    )?;
    Ok(ValidatedRequest {
        opcode,
        local,
        peer,
        descriptor,
        remote_buffer,
        length,
        hint,
        verify,
        spans,
    })
}

/// The checks of the local side: every span is non-empty and inside the region. Returns
/// the spans' total length.
fn check_local(local_id: RegionId, local: &Region, spans: &[Span]) -> Result<u64> {
    let local_len = local.len() as u64;
    let local_error = |e| match e {
        Error::OutOfRange(m) => Error::OutOfRange(format!("local region {local_id}: {m}")),
        other => other,
    };
    let mut length = 0u64;
    for s in spans {
        if s.length == 0 {
            return Err(Error::InvalidArgument("length must be > 0".into()));
        }
        check_range(s.local_offset, s.length, local_len).map_err(local_error)?;
        length = length
            .checked_add(s.length)
            .ok_or_else(|| Error::InvalidArgument("lengths add up past 2^64".into()))?;
    }
    Ok(length)
}

/// The checks of the remote side, once the local one passed: the buffer is in the
/// descriptor, every span inside it, and the opcode may write where it writes.
fn check_remote(
    opcode: Opcode,
    (local_id, local): (RegionId, &Region),
    peer: &Peer,
    descriptor: &SegmentDescriptor,
    remote_buffer: u64,
    spans: &[Span],
) -> Result<()> {
    let buffer = descriptor
        .buffer(remote_buffer)
        .ok_or_else(|| Error::UnknownBuffer {
            segment: peer.name().to_string(),
            buffer: remote_buffer,
        })?;
    for s in spans {
        check_range(s.remote_offset, s.length, buffer.length).map_err(|e| match e {
            Error::OutOfRange(m) => Error::OutOfRange(format!(
                "remote buffer {remote_buffer} of {}: {m}",
                peer.name()
            )),
            other => other,
        })?;
    }
    if opcode == Opcode::Write && buffer.access == Access::ReadOnly {
        return Err(Error::PermissionDenied(format!(
            "remote buffer {remote_buffer} of {} is read-only",
            peer.name()
        )));
    }
    if opcode == Opcode::Read && local.access() == Access::ReadOnly {
        return Err(Error::PermissionDenied(format!(
            "local region {local_id} is read-only; it cannot receive a READ"
        )));
    }
    Ok(())
}

/// A lone request checked as [`validate`] checks it, against a region, a peer and its
/// descriptor the caller looked up and holds: its view, or the first failed check (the
/// caller that wants the error's exact form validates again the usual way).
pub(crate) fn check_lone<'a>(
    req: &'a Request,
    span: &'a Span,
    local: &'a Region,
    peer: &'a Peer,
    descriptor: &'a SegmentDescriptor,
) -> Result<RequestView<'a>> {
    let spans = std::slice::from_ref(span);
    let length = check_local(req.local, local, spans)?;
    check_remote(
        req.opcode,
        (req.local, local),
        peer,
        descriptor,
        req.remote_buffer,
        spans,
    )?;
    Ok(RequestView {
        opcode: req.opcode,
        local,
        peer,
        descriptor,
        remote_buffer: req.remote_buffer,
        length,
        hint: req.hint,
        verify: req.verify,
        spans,
        gathered: false,
    })
}

impl Request {
    /// Its one span.
    pub(crate) fn span(&self) -> Span {
        Span {
            local_offset: self.local_offset,
            remote_offset: self.remote_offset,
            length: self.length,
        }
    }
}

/// Resolves and checks a request. `region` and `segment` look ids up in the engine's tables.
pub(crate) fn validate(
    req: &Request,
    region: impl Fn(RegionId) -> Result<Lent<Region>>,
    segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
) -> Result<ValidatedRequest> {
    let head = Head {
        opcode: req.opcode,
        local: req.local,
        segment: req.segment,
        remote_buffer: req.remote_buffer,
        hint: req.hint,
        verify: req.verify,
    };
    let span = Span {
        local_offset: req.local_offset,
        remote_offset: req.remote_offset,
        length: req.length,
    };
    resolve(head, Spans::One(span), region, segment)
}

/// Resolves and checks a gather: every span as a request of its own would be.
pub(crate) fn validate_gather(
    g: &Gather,
    region: impl Fn(RegionId) -> Result<Lent<Region>>,
    segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
) -> Result<ValidatedRequest> {
    if g.spans.is_empty() {
        return Err(Error::InvalidArgument("a gather needs a span".into()));
    }
    let head = Head {
        opcode: g.opcode,
        local: g.local,
        segment: g.segment,
        remote_buffer: g.remote_buffer,
        hint: g.hint,
        verify: g.verify,
    };
    resolve(head, Spans::Many(g.spans.clone()), region, segment)
}

#[cfg(test)]
pub(crate) mod tests {
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
            |id| f.regions.lend(id),
            |h| {
                f.segments.lend(h).map(|p| {
                    let d = p.descriptor();
                    (p, d)
                })
            },
        )
    }

    /// A valid 4 KiB WRITE, for tests of what holds requests (tasks).
    pub(crate) fn sample() -> ValidatedRequest {
        let f = fixture();
        check(&f, &good(&f)).expect("valid")
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
            verify: false,
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

    fn gather(f: &Fixture, spans: &[(u64, u64, u64)]) -> Gather {
        Gather {
            opcode: Opcode::Write,
            local: f.local,
            segment: f.seg,
            remote_buffer: 0,
            spans: spans
                .iter()
                .map(|&(l, r, n)| Span {
                    local_offset: l,
                    remote_offset: r,
                    length: n,
                })
                .collect(),
            hint: TransportHint::Auto,
            verify: false,
        }
    }

    fn check_gather(f: &Fixture, g: &Gather) -> Result<ValidatedRequest> {
        validate_gather(
            g,
            |id| f.regions.lend(id),
            |h| {
                f.segments.lend(h).map(|p| {
                    let d = p.descriptor();
                    (p, d)
                })
            },
        )
    }

    #[test]
    fn a_gather_is_checked_span_by_span() {
        let f = fixture();
        let v = check_gather(&f, &gather(&f, &[(0, 8000, 192), (100, 0, 50)])).expect("valid");
        assert_eq!(v.length, 242);
        assert_eq!(v.spans().len(), 2);
        assert!(v.gathered().is_some());
        type Spans = Vec<(u64, u64, u64)>;
        let bad: Vec<(Spans, &str)> = vec![
            (vec![], "ERR_FERRY_INVALID_ARGUMENT"),
            (vec![(0, 0, 4), (0, 0, 0)], "ERR_FERRY_INVALID_ARGUMENT"),
            // The second span overruns the 4096-byte region by one byte.
            (vec![(0, 0, 4), (4000, 0, 97)], "ERR_FERRY_OUT_OF_RANGE"),
            // ... or the 8192-byte buffer.
            (
                vec![(0, 8192 - 4, 4), (0, 8190, 3)],
                "ERR_FERRY_OUT_OF_RANGE",
            ),
            (vec![(0, u64::MAX, 4)], "ERR_FERRY_OUT_OF_RANGE"),
        ];
        for (spans, code) in bad {
            let err = check_gather(&f, &gather(&f, &spans)).expect_err("refused");
            assert_eq!(err.code(), code, "{spans:?}: {err}");
        }
        let ro = Gather {
            remote_buffer: 1,
            ..gather(&f, &[(0, 0, 10), (20, 20, 10)])
        };
        assert_eq!(
            check_gather(&f, &ro).expect_err("read-only").code(),
            "ERR_FERRY_PERMISSION_DENIED"
        );
    }

    #[test]
    fn slices_cut_every_span_and_cover_it_in_order() {
        let f = fixture();
        let v =
            check_gather(&f, &gather(&f, &[(0, 100, 10), (50, 0, 3), (20, 30, 8)])).expect("valid");
        let got: Vec<(u64, u64, u64)> = v
            .slices(4)
            .map(|s| (s.local_offset, s.remote_offset, s.length))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 100, 4),
                (4, 104, 4),
                (8, 108, 2),
                (50, 0, 3),
                (20, 30, 4),
                (24, 34, 4)
            ]
        );
        assert_eq!(v.slice_count(4), 6);
        let one = check(&f, &good(&f)).expect("valid");
        assert!(one.gathered().is_none());
        assert_eq!(one.slice_count(1000), 5);
        assert_eq!(one.slices(4096).count(), 1);
    }

    #[test]
    fn opcode_parsing() {
        assert_eq!(Opcode::parse("read").expect("read"), Opcode::Read);
        assert_eq!(Opcode::parse("write").expect("write"), Opcode::Write);
        assert!(Opcode::parse("copy").is_err());
    }
}
