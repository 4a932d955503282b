//! Block lists: many small transfers described by parallel arrays (local offsets, remote
//! offsets, lengths), as a scheduler moves a KV cache — layers × pages per call.
//!
//! This module is pure. It checks a list (every block, before anything moves), merges
//! blocks that are adjacent and contiguous on both sides into one request (as TENT's
//! `merge_requests` does), gathers runs of small requests between the same region and
//! buffer into one request of many spans (one task, however scattered the pages), keeps
//! which blocks each task covers, and expands the tasks' outcomes back into one status
//! byte per block. The engine side (`block_submit`) looks the regions and buffers up and
//! submits the tasks.

use crate::error::{Error, Result};
use crate::kind::{Opcode, TransportHint};
use crate::memory::{check_range, RegionId};
use crate::request::{Gather, Request, Span, Unit};
use crate::status::TransferStatus;
use crate::task::TaskSnapshot;

/// Most blocks one call may carry (block indices and request starts fit a `u32`).
pub const MAX_BLOCKS: usize = 1 << 24;

/// A field that is the same for every block, or given for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerBlock<T> {
    /// One value for all blocks.
    One(T),
    /// One value per block.
    Each(Vec<T>),
}

impl<T: Copy> PerBlock<T> {
    /// The value of block `i` (the caller checked `i` against the list's length).
    fn at(&self, i: usize) -> T {
        match self {
            Self::One(v) => *v,
            Self::Each(v) => v[i],
        }
    }

    fn len(&self) -> Option<usize> {
        match self {
            Self::One(_) => None,
            Self::Each(v) => Some(v.len()),
        }
    }
}

/// A block list: block `i` moves `lengths[i]` bytes between `local_offsets[i]` of its local
/// region and `remote_offsets[i]` of its remote buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks {
    /// Read or write, for every block.
    pub opcode: Opcode,
    /// Local region id(s).
    pub local: PerBlock<RegionId>,
    /// Segment handle(s).
    pub segment: PerBlock<u64>,
    /// Remote buffer id(s).
    pub remote_buffer: PerBlock<u64>,
    /// Offset of each block in its local region.
    pub local_offsets: Vec<u64>,
    /// Offset of each block in its remote buffer.
    pub remote_offsets: Vec<u64>,
    /// Length of each block, or one length for all.
    pub lengths: PerBlock<u64>,
    /// Transport choice, for every block.
    pub hint: TransportHint,
    /// Check every block's bytes end to end (CRC32C; `verify`).
    pub verify: bool,
}

/// One block, resolved from the lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    local: RegionId,
    segment: u64,
    remote_buffer: u64,
    local_offset: u64,
    remote_offset: u64,
    length: u64,
}

impl Blocks {
    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.local_offsets.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.local_offsets.is_empty()
    }

    fn block(&self, i: usize) -> Block {
        Block {
            local: self.local.at(i),
            segment: self.segment.at(i),
            remote_buffer: self.remote_buffer.at(i),
            local_offset: self.local_offsets[i],
            remote_offset: self.remote_offsets[i],
            length: self.lengths.at(i),
        }
    }

    /// Checks the shape: a count in `1..=MAX_BLOCKS`, every per-block array of that count,
    /// no zero length. Ranges are checked by `check_bounds`.
    pub fn check_shape(&self) -> Result<()> {
        let n = self.len();
        if n == 0 {
            return Err(Error::InvalidArgument("no blocks given".into()));
        }
        if n > MAX_BLOCKS {
            return Err(Error::InvalidArgument(format!(
                "at most {MAX_BLOCKS} blocks per call, got {n}"
            )));
        }
        let arrays = [
            ("remoteOffsets", Some(self.remote_offsets.len())),
            ("lengths", self.lengths.len()),
            ("local", self.local.len()),
            ("remote", self.segment.len()),
            ("remoteBuffer", self.remote_buffer.len()),
        ];
        for (name, len) in arrays {
            if let Some(len) = len.filter(|&l| l != n) {
                return Err(Error::InvalidArgument(format!(
                    "{name} has {len} entries for {n} blocks (localOffsets)"
                )));
            }
        }
        match &self.lengths {
            PerBlock::One(0) => Err(Error::InvalidArgument("length must be > 0".into())),
            PerBlock::One(_) => Ok(()),
            PerBlock::Each(v) => match v.iter().position(|&l| l == 0) {
                Some(i) => Err(Error::InvalidArgument(format!(
                    "block {i}: length must be > 0"
                ))),
                None => Ok(()),
            },
        }
    }

    /// Checks every block's two ranges. `local_len` gives a region's length, `remote_len`
    /// a (segment, buffer)'s; each is asked once per distinct value in a row of blocks, so
    /// a list of one region and one buffer costs two lookups. The first bad block is named.
    pub fn check_bounds(
        &self,
        mut local_len: impl FnMut(RegionId) -> Result<u64>,
        mut remote_len: impl FnMut(u64, u64) -> Result<u64>,
    ) -> Result<()> {
        let mut local: Option<(RegionId, u64)> = None;
        let mut remote: Option<((u64, u64), u64)> = None;
        for i in 0..self.len() {
            let b = self.block(i);
            let at = |e: Error| annotate(e, i);
            let llen = match local {
                Some((id, len)) if id == b.local => len,
                _ => {
                    let len = local_len(b.local).map_err(at)?;
                    local = Some((b.local, len));
                    len
                }
            };
            let key = (b.segment, b.remote_buffer);
            let rlen = match remote {
                Some((k, len)) if k == key => len,
                _ => {
                    let len = remote_len(b.segment, b.remote_buffer).map_err(at)?;
                    remote = Some((key, len));
                    len
                }
            };
            check_range(b.local_offset, b.length, llen).map_err(|e| at(side(e, "local region")))?;
            check_range(b.remote_offset, b.length, rlen)
                .map_err(|e| at(side(e, "remote buffer")))?;
        }
        Ok(())
    }

    /// The list's merged runs, in order, each with the index of its first block: a block
    /// joins the previous block's run when it names the same region, segment and buffer
    /// and starts, on both sides, where that run ends. Only exact adjacency merges:
    /// overlapping or reordered blocks stay runs of their own. Call after `check_shape`
    /// and `check_bounds` (ends cannot overflow then).
    fn runs(&self) -> impl Iterator<Item = (u32, Request)> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            if i >= self.len() {
                return None;
            }
            let first = i;
            let b = self.block(first);
            let mut run = Request {
                opcode: self.opcode,
                local: b.local,
                local_offset: b.local_offset,
                segment: b.segment,
                remote_buffer: b.remote_buffer,
                remote_offset: b.remote_offset,
                length: b.length,
                hint: self.hint,
                verify: self.verify,
            };
            i += 1;
            while i < self.len() {
                let n = self.block(i);
                let joins = run.local == n.local
                    && run.segment == n.segment
                    && run.remote_buffer == n.remote_buffer
                    && run.local_offset.checked_add(run.length) == Some(n.local_offset)
                    && run.remote_offset.checked_add(run.length) == Some(n.remote_offset);
                match (joins, run.length.checked_add(n.length)) {
                    (true, Some(length)) => run.length = length,
                    _ => break,
                }
                i += 1;
            }
            Some((first as u32, run))
        })
    }

    /// Merges the list (see `runs`) and gathers runs of small requests that name the same
    /// region, segment and buffer into one request of many spans, within `limits`, in one
    /// pass. A run of one stays a plain request. The map says which blocks each unit
    /// covers.
    pub fn gather(&self, limits: GatherLimits) -> Gathered {
        /// The open gather: its first request and its bytes so far (its spans are in
        /// `spans`, one list reused for every gather).
        struct Open {
            head: Request,
            bytes: u64,
        }
        fn close(open: Open, spans: &mut Vec<Span>) -> Unit {
            let h = open.head;
            let unit = if spans.len() == 1 {
                Unit::One(h)
            } else {
                Unit::Gather(Gather {
                    opcode: h.opcode,
                    local: h.local,
                    segment: h.segment,
                    remote_buffer: h.remote_buffer,
                    spans: spans.as_slice().into(),
                    hint: h.hint,
                    verify: h.verify,
                })
            };
            spans.clear();
            unit
        }
        // The block map and the open gather's spans are sized once from the block count,
        // not grown block by block: a list that makes as many units makes the same
        // allocations for 16 blocks as for thousands. `starts` has at most one entry per
        // block (and the end); a gather holds at most `spans_max` spans.
        let mut units = Vec::new();
        let mut starts = Vec::with_capacity(self.len() + 1);
        let mut spans: Vec<Span> = Vec::with_capacity(self.len().min(limits.spans_max));
        let mut open: Option<Open> = None;
        for (first, req) in self.runs() {
            let span = Span {
                local_offset: req.local_offset,
                remote_offset: req.remote_offset,
                length: req.length,
            };
            let small = req.length <= limits.span_max;
            if let Some(o) = open.as_mut() {
                let joins = small
                    && o.head.local == req.local
                    && o.head.segment == req.segment
                    && o.head.remote_buffer == req.remote_buffer
                    && spans.len() < limits.spans_max
                    && o.bytes.saturating_add(req.length) <= limits.bytes_max;
                if joins {
                    spans.push(span);
                    o.bytes += req.length;
                    continue;
                }
            }
            if let Some(o) = open.take() {
                units.push(close(o, &mut spans));
            }
            starts.push(first);
            if small {
                spans.push(span);
                open = Some(Open {
                    bytes: req.length,
                    head: req,
                });
            } else {
                units.push(Unit::One(req));
            }
        }
        if let Some(o) = open.take() {
            units.push(close(o, &mut spans));
        }
        starts.push(self.len() as u32);
        Gathered {
            units,
            map: BlockMap { starts },
        }
    }
}

/// Which merged requests of a list are gathered, and into how large gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherLimits {
    /// Requests of at most this many bytes are gathered; larger ones stay tasks of their
    /// own (they gain nothing from it, and a transport cuts and spreads them itself).
    pub span_max: u64,
    /// Most bytes in one gather: what one failed attempt retries, and what one task's
    /// status stands for.
    pub bytes_max: u64,
    /// Most spans in one gather.
    pub spans_max: usize,
}

/// The engine's limits: 4 KiB pages gather 1024 to a task, 64 KiB blocks 64.
pub const GATHER: GatherLimits = GatherLimits {
    span_max: 256 << 10,
    bytes_max: 4 << 20,
    spans_max: 4096,
};

/// A block list as the units it is submitted as: one task each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    /// Plain requests and gathers, in block order.
    pub units: Vec<Unit>,
    /// Which blocks each unit covers.
    pub map: BlockMap,
}

/// Names the block an error is about.
fn annotate(e: Error, block: usize) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("block {block}: {m}")),
        Error::OutOfRange(m) => Error::OutOfRange(format!("block {block}: {m}")),
        other => other,
    }
}

/// Says which side a range error is about.
fn side(e: Error, what: &str) -> Error {
    match e {
        Error::OutOfRange(m) => Error::OutOfRange(format!("{what}: {m}")),
        other => other,
    }
}

/// Which blocks each request of a merged list covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMap {
    /// Request `r` covers blocks `starts[r]..starts[r + 1]` (one more entry than requests).
    pub starts: Vec<u32>,
}

impl BlockMap {
    /// Number of requests.
    pub fn requests(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// The blocks request `r` covers.
    pub fn blocks_of(&self, r: usize) -> std::ops::Range<usize> {
        self.starts[r] as usize..self.starts[r + 1] as usize
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.starts.last().map_or(0, |&n| n as usize)
    }

    /// Writes each block's status (its request's, TENT's numbering) into `out` (one byte
    /// per block; `out` may be shorter: the blocks past its end are skipped). `status`
    /// gives request `r`'s status. Returns the blocks not yet in a terminal status.
    pub fn fill_status(&self, out: &mut [u8], status: impl Fn(usize) -> TransferStatus) -> usize {
        fill_status(&self.starts, out, status)
    }

    /// The outcome of every block from the requests' final snapshots (in request order).
    pub fn outcome(&self, snaps: &[TaskSnapshot]) -> BlockOutcome {
        let mut status = vec![TransferStatus::Failed.raw(); self.blocks()];
        self.fill_status(&mut status, |r| {
            snaps.get(r).map_or(TransferStatus::Failed, |s| s.status)
        });
        let mut failed = Vec::new();
        for (r, s) in snaps.iter().enumerate().take(self.requests()) {
            if s.status != TransferStatus::Completed {
                failed.push(FailedRun {
                    blocks: self.blocks_of(r),
                    status: s.status,
                    error: s.error.clone(),
                });
            }
        }
        BlockOutcome {
            status,
            failed,
            requests: self.requests(),
        }
    }
}

/// `BlockMap::fill_status` over a map's `starts` as the poller holds them (a Uint32Array
/// from JS: starts that decrease are refused by `check_starts`; out-of-order ones would
/// only skip blocks, never index past `out`).
pub fn fill_status(
    starts: &[u32],
    out: &mut [u8],
    status: impl Fn(usize) -> TransferStatus,
) -> usize {
    let mut open = 0;
    for (r, w) in starts.windows(2).enumerate() {
        let s = status(r);
        let (start, end) = (w[0] as usize, w[1] as usize);
        if !s.is_terminal() {
            open += end.saturating_sub(start);
        }
        if let Some(dst) = out.get_mut(start..end.min(out.len())) {
            dst.fill(s.raw());
        }
    }
    open
}

/// Checks a map's `starts` given back by a caller: from 0, never decreasing.
pub fn check_starts(starts: &[u32]) -> Result<()> {
    if starts.first() != Some(&0) || starts.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::InvalidArgument(
            "starts must begin at 0 and never decrease (as submitBlocks returned them)".into(),
        ));
    }
    Ok(())
}

/// Blocks of one request that did not complete, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRun {
    /// The blocks.
    pub blocks: std::ops::Range<usize>,
    /// Their status.
    pub status: TransferStatus,
    /// The request's error.
    pub error: Option<Error>,
}

/// What happened to each block of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockOutcome {
    /// One status byte per block (TENT's numbering; 4 = completed).
    pub status: Vec<u8>,
    /// The blocks that did not complete, by task.
    pub failed: Vec<FailedRun>,
    /// Tasks the blocks were submitted as (merged runs, and gathers of them).
    pub requests: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block list as merged requests, gathered or not.
    struct Merged {
        requests: Vec<Request>,
        map: BlockMap,
    }

    impl Blocks {
        /// The merged runs as requests (see `runs`), and which blocks each covers.
        fn merge(&self) -> Merged {
            let mut starts: Vec<u32> = Vec::new();
            let requests = self
                .runs()
                .map(|(first, run)| {
                    starts.push(first);
                    run
                })
                .collect();
            starts.push(self.len() as u32);
            Merged {
                requests,
                map: BlockMap { starts },
            }
        }
    }

    fn list(local: &[u64], remote: &[u64], lengths: &[u64]) -> Blocks {
        Blocks {
            opcode: Opcode::Write,
            local: PerBlock::One(1),
            segment: PerBlock::One(2),
            remote_buffer: PerBlock::One(3),
            local_offsets: local.to_vec(),
            remote_offsets: remote.to_vec(),
            lengths: PerBlock::Each(lengths.to_vec()),
            hint: TransportHint::Auto,
            verify: false,
        }
    }

    fn spans(m: &Merged) -> Vec<(u64, u64, u64)> {
        m.requests
            .iter()
            .map(|r| (r.local_offset, r.remote_offset, r.length))
            .collect()
    }

    fn lens(
        local: u64,
        remote: u64,
    ) -> (
        impl FnMut(RegionId) -> Result<u64>,
        impl FnMut(u64, u64) -> Result<u64>,
    ) {
        (move |_| Ok(local), move |_, _| Ok(remote))
    }

    #[test]
    fn contiguous_on_both_sides_merges() {
        let b = list(&[0, 4, 8, 20], &[100, 104, 108, 200], &[4, 4, 4, 4]);
        let m = b.merge();
        assert_eq!(spans(&m), vec![(0, 100, 12), (20, 200, 4)]);
        assert_eq!(m.map.starts, vec![0, 3, 4]);
        assert_eq!(m.map.blocks_of(0), 0..3);
        assert_eq!(m.map.blocks(), 4);
    }

    #[test]
    fn contiguous_on_one_side_only_does_not_merge() {
        // local contiguous, remote not; then remote contiguous, local not.
        let b = list(&[0, 4, 100], &[0, 50, 54], &[4, 4, 4]);
        assert_eq!(spans(&b.merge()), vec![(0, 0, 4), (4, 50, 4), (100, 54, 4)]);
    }

    #[test]
    fn overlapping_and_reordered_blocks_stay_apart() {
        let b = list(&[0, 2, 8, 4], &[0, 2, 8, 4], &[4, 4, 4, 4]);
        let m = b.merge();
        assert_eq!(m.requests.len(), 4, "{:?}", spans(&m));
        // The same block twice is not adjacent to itself.
        let b = list(&[0, 0], &[0, 0], &[4, 4]);
        assert_eq!(b.merge().requests.len(), 2);
    }

    #[test]
    fn different_region_segment_or_buffer_does_not_merge() {
        let mut b = list(&[0, 4, 8, 12], &[0, 4, 8, 12], &[4, 4, 4, 4]);
        b.local = PerBlock::Each(vec![1, 1, 9, 9]);
        assert_eq!(b.merge().map.starts, vec![0, 2, 4]);
        b.local = PerBlock::One(1);
        b.segment = PerBlock::Each(vec![2, 5, 5, 5]);
        assert_eq!(b.merge().map.starts, vec![0, 1, 4]);
        b.segment = PerBlock::One(2);
        b.remote_buffer = PerBlock::Each(vec![3, 3, 3, 4]);
        assert_eq!(b.merge().map.starts, vec![0, 3, 4]);
    }

    #[test]
    fn one_length_for_all() {
        let mut b = list(&[0, 4096, 8192], &[0, 4096, 8192], &[]);
        b.lengths = PerBlock::One(4096);
        b.check_shape().expect("shape");
        let m = b.merge();
        assert_eq!(spans(&m), vec![(0, 0, 3 * 4096)]);
    }

    #[test]
    fn zero_length_is_refused_naming_the_block() {
        let b = list(&[0, 4], &[0, 4], &[4, 0]);
        let e = b.check_shape().expect_err("zero length");
        assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT");
        assert!(e.to_string().contains("block 1"), "{e}");
        let mut b = list(&[0], &[0], &[]);
        b.lengths = PerBlock::One(0);
        assert!(b.check_shape().is_err());
    }

    #[test]
    fn shapes_are_checked() {
        assert!(list(&[], &[], &[]).check_shape().is_err());
        let e = list(&[0, 4], &[0], &[4, 4])
            .check_shape()
            .expect_err("short");
        assert!(
            e.to_string()
                .contains("remoteOffsets has 1 entries for 2 blocks"),
            "{e}"
        );
        let e = list(&[0, 4], &[0, 4], &[4])
            .check_shape()
            .expect_err("short");
        assert!(e.to_string().contains("lengths"), "{e}");
        let mut b = list(&[0, 4], &[0, 4], &[4, 4]);
        b.segment = PerBlock::Each(vec![1, 2, 3]);
        assert!(b
            .check_shape()
            .expect_err("long")
            .to_string()
            .contains("remote has 3"));
    }

    #[test]
    fn every_block_is_bounds_checked_and_named() {
        // Block 2 overruns the remote buffer by one byte; blocks 0 and 1 are fine.
        let b = list(&[0, 4, 8], &[0, 4, 97], &[4, 4, 4]);
        let (l, r) = lens(1000, 100);
        let e = b.check_bounds(l, r).expect_err("out of range");
        assert_eq!(e.code(), "ERR_FERRY_OUT_OF_RANGE");
        assert!(e.to_string().contains("block 2: remote buffer"), "{e}");
        let b = list(&[0, 997], &[0, 4], &[4, 4]);
        let (l, r) = lens(1000, 100);
        let e = b.check_bounds(l, r).expect_err("local out of range");
        assert!(e.to_string().contains("block 1: local region"), "{e}");
        let (l, r) = lens(1000, 100);
        list(&[0, 996], &[0, 96], &[4, 4])
            .check_bounds(l, r)
            .expect("in range");
    }

    #[test]
    fn ends_past_u64_are_out_of_range_not_wrapped() {
        let b = list(&[u64::MAX - 1], &[0], &[4]);
        let (l, r) = lens(u64::MAX, u64::MAX);
        assert_eq!(
            b.check_bounds(l, r).expect_err("wraps").code(),
            "ERR_FERRY_OUT_OF_RANGE"
        );
        // 2^53 - 1 is the largest offset a Float64Array carries exactly; it is a plain offset here.
        let top = (1u64 << 53) - 1;
        let b = list(&[top - 4], &[top - 4], &[4]);
        let (l, r) = lens(top, top);
        b.check_bounds(l, r).expect("fits");
    }

    #[test]
    fn lookups_happen_once_per_run_of_equal_values() {
        let mut b = list(&[0, 4, 8, 12], &[0, 4, 8, 12], &[4, 4, 4, 4]);
        b.local = PerBlock::Each(vec![1, 1, 7, 7]);
        let (mut nl, mut nr) = (0, 0);
        b.check_bounds(
            |_| {
                nl += 1;
                Ok(64)
            },
            |_, _| {
                nr += 1;
                Ok(64)
            },
        )
        .expect("ok");
        assert_eq!((nl, nr), (2, 1));
        // A failed lookup names the block.
        let e = b
            .check_bounds(
                |id| {
                    if id == 7 {
                        Err(Error::UnknownRegion(7))
                    } else {
                        Ok(64)
                    }
                },
                |_, _| Ok(64),
            )
            .expect_err("unknown");
        assert_eq!(e.code(), "ERR_FERRY_UNKNOWN_REGION");
    }

    const LIMITS: GatherLimits = GatherLimits {
        span_max: 16,
        bytes_max: 24,
        spans_max: 3,
    };

    /// Each unit as (spans as (local, remote, length), or one request's).
    fn units(g: &Gathered) -> Vec<Vec<(u64, u64, u64)>> {
        g.units
            .iter()
            .map(|u| match u {
                Unit::One(r) => vec![(r.local_offset, r.remote_offset, r.length)],
                Unit::Gather(g) => g
                    .spans
                    .iter()
                    .map(|s| (s.local_offset, s.remote_offset, s.length))
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn scattered_small_requests_gather_into_one_unit() {
        let b = list(&[0, 4, 40, 8], &[100, 104, 60, 0], &[4, 4, 4, 4]);
        let g = b.gather(LIMITS);
        assert_eq!(units(&g), vec![vec![(0, 100, 8), (40, 60, 4), (8, 0, 4)]]);
        assert!(
            matches!(&g.units[0], Unit::Gather(x) if x.opcode == Opcode::Write && x.local == 1 && x.segment == 2 && x.remote_buffer == 3)
        );
        assert_eq!(g.map.starts, vec![0, 4]);
    }

    #[test]
    fn a_lone_request_stays_plain_and_large_ones_stay_alone() {
        // One merged run: a plain request, not a gather of one.
        let g = list(&[0, 4], &[0, 4], &[4, 4]).gather(LIMITS);
        assert!(matches!(g.units.as_slice(), [Unit::One(r)] if r.length == 8));
        // 20 bytes is over span_max: it splits the small ones around it.
        let g = list(&[0, 50, 100, 200], &[0, 50, 100, 200], &[4, 4, 20, 4]).gather(LIMITS);
        assert_eq!(
            units(&g),
            vec![
                vec![(0, 0, 4), (50, 50, 4)],
                vec![(100, 100, 20)],
                vec![(200, 200, 4)]
            ]
        );
        assert!(matches!(g.units[1], Unit::One(_)));
        assert_eq!(g.map.starts, vec![0, 2, 3, 4]);
    }

    #[test]
    fn gathers_end_at_their_limits_and_at_another_region_segment_or_buffer() {
        // spans_max 3: four scattered blocks make a gather of three and a plain request.
        let g = list(&[0, 10, 20, 30], &[90, 70, 50, 30], &[2, 2, 2, 2]).gather(LIMITS);
        assert_eq!(g.map.starts, vec![0, 3, 4]);
        // bytes_max 24: 16 + 8 fits, a third span does not.
        let g = list(&[0, 100, 200], &[300, 200, 100], &[16, 8, 1]).gather(LIMITS);
        assert_eq!(g.map.starts, vec![0, 2, 3]);
        let mut b = list(&[0, 10, 20, 30], &[90, 70, 50, 30], &[2, 2, 2, 2]);
        b.local = PerBlock::Each(vec![1, 1, 9, 9]);
        assert_eq!(b.gather(LIMITS).map.starts, vec![0, 2, 4]);
        b.local = PerBlock::One(1);
        b.segment = PerBlock::Each(vec![2, 5, 5, 5]);
        assert_eq!(b.gather(LIMITS).map.starts, vec![0, 1, 4]);
        b.segment = PerBlock::One(2);
        b.remote_buffer = PerBlock::Each(vec![3, 3, 4, 4]);
        assert_eq!(b.gather(LIMITS).map.starts, vec![0, 2, 4]);
    }

    #[test]
    fn the_engines_limits_gather_a_call_of_4k_pages_into_one_task() {
        let n = 1024u64;
        let local: Vec<u64> = (0..n).map(|i| i * 4096).collect();
        let remote: Vec<u64> = (0..n).map(|i| (n - 1 - i) * 4096).collect();
        let mut b = list(&local, &remote, &[]);
        b.lengths = PerBlock::One(4096);
        let g = b.gather(GATHER);
        assert_eq!(g.units.len(), 1);
        assert_eq!(units(&g)[0].len(), n as usize);
        // 1 MiB blocks are each their own task.
        b.lengths = PerBlock::One(1 << 20);
        b.local_offsets = (0..4).map(|i| i << 21).collect();
        b.remote_offsets = (0..4).map(|i| (3 - i) << 21).collect();
        assert_eq!(b.gather(GATHER).units.len(), 4);
    }

    #[test]
    fn outcomes_of_gathered_units_expand_to_their_blocks() {
        let g = list(&[0, 50, 100, 200], &[0, 50, 100, 200], &[4, 4, 20, 4]).gather(LIMITS);
        let out = g.map.outcome(&[
            snap(TransferStatus::Failed, Some(Error::Io("boom".into()))),
            snap(TransferStatus::Completed, None),
            snap(TransferStatus::Completed, None),
        ]);
        assert_eq!(out.status, vec![6, 6, 4, 4]);
        assert_eq!(out.requests, 3);
        assert_eq!(out.failed[0].blocks, 0..2);
    }

    fn snap(status: TransferStatus, error: Option<Error>) -> TaskSnapshot {
        TaskSnapshot {
            status,
            transferred: 0,
            length: 4,
            transport: None,
            attempts: 1,
            error,
        }
    }

    #[test]
    fn outcomes_expand_to_blocks() {
        let m = list(&[0, 4, 8, 100, 200], &[0, 4, 8, 100, 200], &[4, 4, 4, 4, 4]).merge();
        assert_eq!(m.map.starts, vec![0, 3, 4, 5]);
        let out = m.map.outcome(&[
            snap(TransferStatus::Completed, None),
            snap(TransferStatus::Failed, Some(Error::Io("boom".into()))),
            snap(TransferStatus::Completed, None),
        ]);
        assert_eq!(out.status, vec![4, 4, 4, 6, 4]);
        assert_eq!(out.requests, 3);
        assert_eq!(out.failed.len(), 1);
        assert_eq!(out.failed[0].blocks, 3..4);
        assert_eq!(
            out.failed[0].error.as_ref().map(|e| e.code()),
            Some("ERR_FERRY_IO")
        );
    }

    #[test]
    fn starts_from_a_caller_are_checked() {
        assert!(check_starts(&[0, 3, 3, 5]).is_ok());
        assert!(check_starts(&[]).is_err());
        assert!(check_starts(&[1, 3]).is_err());
        assert!(check_starts(&[0, 3, 2]).is_err());
        // Even unchecked, a bad map never writes past `out` (a decreasing range is skipped).
        let mut out = [0u8; 4];
        assert_eq!(
            fill_status(&[0, 9, 2], &mut out, |_| TransferStatus::Pending),
            9
        );
        assert_eq!(out, [1, 1, 1, 1]);
        let mut out = [0u8; 4];
        fill_status(&[3, 1], &mut out, |_| TransferStatus::Pending);
        assert_eq!(out, [0, 0, 0, 0]);
    }

    #[test]
    fn fill_status_counts_open_blocks_and_tolerates_a_short_output() {
        let m = list(&[0, 4, 50], &[0, 4, 50], &[4, 4, 4]).merge();
        let mut out = [0u8; 2];
        let open = m.map.fill_status(&mut out, |r| {
            if r == 0 {
                TransferStatus::Pending
            } else {
                TransferStatus::Completed
            }
        });
        assert_eq!(open, 2);
        assert_eq!(out, [1, 1]);
    }
}
