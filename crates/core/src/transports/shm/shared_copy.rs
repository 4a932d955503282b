//! A copy cut into jobs that the submitting thread and the copy threads take in turn: the
//! jobs ([`Work`]), and the one copy they belong to ([`Shared`]), which counts them taken
//! and done and tells the task once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::copy::copy_spans;
use super::peer::ShmPeer;
use crate::error::{Error, Result};
use crate::fence::Landing;
use crate::kind::Opcode;
use crate::lanes::Lent;
use crate::linux::RemoteMapping;
use crate::memory::Region;
use crate::request::{Span, ValidatedRequest};
use crate::task::Task;

/// How long the submitting thread waits, once no job is left to take, for the jobs a
/// copy thread is still copying: about what a few runs take, so that the outcome is
/// usually there before the submitting call returns (handed back at once, no wake-up of
/// the caller), yet a copy thread that stalls costs the caller no more than this.
const SHARED_JOIN_WAIT: Duration = Duration::from_micros(100);

/// What one copy job moves: a piece of a request's one span, or a run of a gather's spans.
pub(super) enum Work {
    Span(Span),
    Run {
        spans: Arc<[Span]>,
        range: std::ops::Range<usize>,
    },
}

impl Work {
    /// A request cut into jobs of about `chunk` bytes: a single span into pieces of at most
    /// `chunk`, a gather into runs of whole spans (its spans are small, `blocks::GATHER`)
    /// of at most `chunk` bytes each, or one span where a span alone is larger.
    ///
    /// The list is sized once (no growth as it fills): a single span makes
    /// `length / chunk` pieces (rounded up); two consecutive runs of a gather hold more
    /// than `chunk` bytes together (the second's first span did not fit the first), so a
    /// gather makes at most `2 * length / chunk + 1` runs (rounded up), and never more
    /// than its spans.
    fn cut(req: &ValidatedRequest, chunk: u64) -> Vec<Self> {
        let chunk = chunk.max(1);
        let pieces = usize::try_from(req.length.div_ceil(chunk)).unwrap_or(usize::MAX);
        match req.gathered() {
            Some(spans) => {
                let mut works =
                    Vec::with_capacity(pieces.saturating_mul(2).saturating_add(1).min(spans.len()));
                works.extend(runs(spans, chunk).map(|range| Self::Run {
                    spans: spans.clone(),
                    range,
                }));
                works
            }
            None => {
                let mut works = Vec::with_capacity(pieces);
                works.extend(req.slices(chunk).map(Self::Span));
                works
            }
        }
    }

    fn spans(&self) -> &[Span] {
        match self {
            Self::Span(s) => std::slice::from_ref(s),
            Self::Run { spans, range } => &spans[range.clone()],
        }
    }

    fn bytes(&self) -> u64 {
        self.spans().iter().map(|s| s.length).sum()
    }
}

/// Consecutive runs of `spans` of at most `chunk` bytes each (a span larger than `chunk`
/// is a run of its own), covering every span once, in order.
fn runs(spans: &[Span], chunk: u64) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= spans.len() {
            return None;
        }
        let mut end = start + 1;
        let mut bytes = spans[start].length;
        while let Some(next) = spans.get(end) {
            match bytes.checked_add(next.length) {
                Some(b) if b <= chunk => bytes = b,
                _ => break,
            }
            end += 1;
        }
        let run = start..end;
        start = end;
        Some(run)
    })
}

/// A copy cut into jobs that the submitting thread and the copy threads take in turn: each
/// job is taken once, whoever is free takes the next. A copy thread that wakes late only
/// finds fewer jobs left: the copy is never slower than the submitting thread alone,
/// whatever a wake-up costs (on a VM, tens of microseconds).
///
/// Only the copying is shared. The parts of the copy are held here once, not by each job;
/// a job's outcome is folded into `copied` or `error`; the task hears once, from whoever
/// ends last, which is the submitting thread whenever the copy threads finished within its
/// wait ([`Shared::join`]): the task's state, its lane's counters and its batch's wake stay
/// in that thread's cache instead of crossing to a copy thread's core and back.
///
/// The submitting thread takes jobs from the front, copy threads from the back: a block
/// copied again and again (a page rewritten in place, tebench's fixed addressing) is split
/// the same way each time, so each core finds its part still in its own L2.
pub(super) struct Shared {
    task: Arc<Task>,
    attempt: u32,
    peer: Arc<ShmPeer>,
    mapping: Arc<RemoteMapping>,
    opcode: Opcode,
    region: Lent<Region>,
    works: Box<[Work]>,
    /// Jobs taken: from the front (low 32 bits) and from the back (high 32 bits); the two
    /// never add up to more than `works.len()`, which `Shared::new` bounds by `u32::MAX`.
    taken: AtomicU64,
    /// Jobs not yet finished, plus one held by the submitting thread until it stops
    /// waiting for them: whoever brings it to zero tells the task.
    left: AtomicUsize,
    /// Bytes the finished jobs copied.
    copied: AtomicU64,
    /// The first job's failure, if one failed.
    error: Mutex<Option<Error>>,
    /// A copy thread came to it: the attempt's start was reported.
    started: AtomicBool,
    /// Holds the task's fence until every job ended: let go by whoever ends last, not
    /// when the last reference goes (a helper's turn may wait in the queue behind others).
    landing: Mutex<Option<Landing<Task>>>,
}

/// Which end of a [`Shared`] copy's jobs a thread takes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// The submitting thread.
    Front,
    /// The copy threads.
    Back,
}

const BACK_ONE: u64 = 1 << 32;

impl Shared {
    /// Attempt `attempt` of `task`, the copy of its request between `peer`'s `mapping` and
    /// the local region, cut into jobs of about `job` bytes.
    pub(super) fn new(
        task: Arc<Task>,
        attempt: u32,
        peer: Arc<ShmPeer>,
        mapping: Arc<RemoteMapping>,
        job: u64,
    ) -> Result<Self> {
        let req = task.request();
        let works = Work::cut(req, job).into_boxed_slice();
        let jobs = works.len();
        if u32::try_from(jobs).is_err() {
            return Err(Error::InvalidArgument("request too large".into()));
        }
        let (opcode, region) = (req.opcode, req.local.clone());
        Ok(Self {
            landing: Mutex::new(Some(Landing::new(&task))),
            task,
            attempt,
            peer,
            mapping,
            opcode,
            region,
            works,
            taken: AtomicU64::new(0),
            // Every job, and the submitting thread's wait.
            left: AtomicUsize::new(jobs + 1),
            copied: AtomicU64::new(0),
            error: Mutex::new(None),
            started: AtomicBool::new(false),
        })
    }

    /// How many jobs it was cut into.
    pub(super) fn jobs(&self) -> usize {
        self.works.len()
    }

    /// Tells the task to expect one outcome of this attempt: the copy's.
    pub(super) fn expect_outcome(&self) {
        self.task.expect_slices(self.attempt, 1);
    }

    /// The submitting thread's part: takes jobs from the front until it copied `budget`
    /// bytes; when none is left to take, it waits a little for the ones still being copied,
    /// so that the outcome is usually there (and told by this thread) when the call
    /// returns.
    pub(super) fn copy_front(&self, budget: u64) {
        self.work(budget, End::Front);
        if self.all_taken() {
            self.join(SHARED_JOIN_WAIT);
        } else {
            // Left to the copy threads (this thread copied its budget): the last of
            // them tells the task.
            self.one_done();
        }
    }

    /// A copy thread's part: takes jobs from the back until none is left. The first copy
    /// thread to come starts the attempt's clock (`Task::started`: ignored unless its
    /// deadline runs from its start).
    pub(super) fn copy_back(&self) {
        if self.task.is_timed_from_start(self.attempt)
            && !self.started.swap(true, Ordering::Relaxed)
        {
            self.task.started(self.attempt, std::time::Instant::now());
        }
        self.work(u64::MAX, End::Back);
    }

    /// Index of the job taken at `end`, or `None` once all are taken.
    fn take(&self, end: End) -> Option<usize> {
        take_from(&self.taken, self.works.len(), end)
    }

    /// Whether every job was taken.
    fn all_taken(&self) -> bool {
        ends_met(self.taken.load(Ordering::Relaxed), self.works.len())
    }

    /// Takes and runs jobs at `end` until none is left to take, or until it copied
    /// `budget` bytes.
    fn work(&self, budget: u64, end: End) {
        let mut copied = 0u64;
        while copied < budget {
            let Some(work) = self.take(end).and_then(|i| self.works.get(i)) else {
                return;
            };
            if self.abandoned() {
                // Canceled, failed or failed over: the rest is taken and ended uncopied,
                // so the fence clears after the jobs already copying.
                self.one_done();
                continue;
            }
            let outcome = copy_spans(
                &self.peer,
                &self.mapping,
                &self.region,
                self.opcode,
                work.spans(),
            );
            copied = copied.saturating_add(work.bytes());
            match outcome {
                Ok(bytes) => {
                    self.copied.fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => {
                    self.error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
            self.one_done();
        }
    }

    /// Whether the task ended or moved to another attempt: checked between jobs.
    fn abandoned(&self) -> bool {
        self.task.status().is_terminal() || self.task.attempt() != self.attempt
    }

    /// Counts one job (or the submitting thread's wait) as ended; the last tells the task.
    fn one_done(&self) {
        // AcqRel: the last one sees every other job's `copied` and `error`.
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // Every job ended: the fence goes first, so that a failover starts at once.
        drop(
            self.landing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let error = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        match error {
            Some(e) => self.task.attempt_failed(self.attempt, e),
            None => self
                .task
                .slice_done(self.attempt, self.copied.load(Ordering::Relaxed)),
        }
    }

    /// Waits up to `bound` for the jobs others still run, then stops waiting (whoever ends
    /// last tells the task).
    fn join(&self, bound: Duration) {
        let until = std::time::Instant::now() + bound;
        while self.left.load(Ordering::Acquire) > 1 && std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        self.one_done();
    }
}

/// Whether the two ends of a count of jobs taken ([`Shared::taken`]) met: all `len` taken.
fn ends_met(taken: u64, len: usize) -> bool {
    (taken & (BACK_ONE - 1)) + (taken >> 32) >= len as u64
}

/// Takes one of `len` jobs at `end` of the count `taken` ([`Shared::taken`]): its index,
/// or `None` once the two ends met.
fn take_from(taken: &AtomicU64, len: usize, end: End) -> Option<usize> {
    let mut cur = taken.load(Ordering::Relaxed);
    loop {
        if ends_met(cur, len) {
            return None;
        }
        let (front, back) = (cur & (BACK_ONE - 1), cur >> 32);
        let (next, index) = match end {
            End::Front => (cur + 1, front),
            End::Back => (cur + BACK_ONE, len as u64 - 1 - back),
        };
        match taken.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return usize::try_from(index).ok(),
            Err(seen) => cur = seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_submitting_thread_takes_jobs_from_the_front_copy_threads_from_the_back() {
        let taken = AtomicU64::new(0);
        assert_eq!(take_from(&taken, 4, End::Front), Some(0));
        assert_eq!(take_from(&taken, 4, End::Back), Some(3));
        assert_eq!(take_from(&taken, 4, End::Back), Some(2));
        assert_eq!(take_from(&taken, 4, End::Front), Some(1));
        assert_eq!(take_from(&taken, 4, End::Front), None);
        assert_eq!(take_from(&taken, 4, End::Back), None);
        // Two halves: each end always gets the same one, whoever comes first.
        let taken = AtomicU64::new(0);
        assert_eq!(take_from(&taken, 2, End::Front), Some(0));
        assert_eq!(take_from(&taken, 2, End::Back), Some(1));
        let taken = AtomicU64::new(0);
        assert_eq!(take_from(&taken, 2, End::Back), Some(1));
        assert_eq!(take_from(&taken, 2, End::Front), Some(0));
        assert_eq!(take_from(&AtomicU64::new(0), 0, End::Front), None);
    }

    #[test]
    fn threads_taking_at_both_ends_take_every_job_exactly_once() {
        const JOBS: usize = 10_000;
        let taken = AtomicU64::new(0);
        let seen: Vec<AtomicUsize> = (0..JOBS).map(|_| AtomicUsize::new(0)).collect();
        std::thread::scope(|s| {
            for end in [End::Front, End::Back, End::Back] {
                let (taken, seen) = (&taken, &seen);
                s.spawn(move || {
                    while let Some(i) = take_from(taken, JOBS, end) {
                        seen[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert!(seen.iter().all(|n| n.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn runs_group_whole_spans_up_to_a_chunk_and_cover_each_once() {
        let spans: Vec<Span> = [4, 4, 4, 10, 3, 3, 1]
            .iter()
            .map(|&length| Span {
                local_offset: 0,
                remote_offset: 0,
                length,
            })
            .collect();
        let got: Vec<_> = runs(&spans, 8).collect();
        // 4+4 | 4 | 10 (alone: larger than a chunk) | 3+3+1
        assert_eq!(got, vec![0..2, 2..3, 3..4, 4..7]);
        assert_eq!(runs(&spans, u64::MAX).collect::<Vec<_>>(), vec![0..7]);
        assert_eq!(runs(&[], 8).count(), 0);
    }

    #[test]
    fn a_gather_makes_no_more_runs_than_cut_sizes_its_list_for() {
        // Deterministic pseudo-random span lengths (xorshift), many lists and chunks.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let chunk = 1 + next() % 64;
            let spans: Vec<Span> = (0..1 + next() % 40)
                .map(|_| Span {
                    local_offset: 0,
                    remote_offset: 0,
                    length: 1 + next() % 100,
                })
                .collect();
            let total: u64 = spans.iter().map(|s| s.length).sum();
            let bound = (2 * total.div_ceil(chunk) + 1).min(spans.len() as u64);
            let made = runs(&spans, chunk).count() as u64;
            assert!(
                made <= bound,
                "{made} runs > {bound} for {spans:?} by {chunk}"
            );
        }
    }
}
