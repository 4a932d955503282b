//! Transfer latency histograms, by transport and op.
//!
//! A completed transfer adds one to the bucket of its duration and its nanoseconds to a
//! sum: two relaxed atomic adds on its submitting thread's lane (`lanes.rs`), no lock, no
//! allocation. The buckets are powers of two of nanoseconds, from 256 ns to 2^34 ns
//! (about 17 s), then `+Inf`: the bucket of a duration is its bit length, one instruction,
//! and the bounds are the same in every process, so histograms of many engines add up.
//! The duration of a transfer runs from its submission call to its completion; one done
//! during its submission call (a same-host copy that stays inline) counts the call's
//! duration, measured once for every such transfer of the call. Both ends are `ticks`
//! stamps: a few nanoseconds each where the CPU's counter keeps time.
//!
//! Except for small lone calls ([`CallTimer::lone`]): a call submitting one request of
//! under [`SAMPLED_BELOW`] bytes that completes it at once costs a few hundred nanoseconds,
//! and its two stamps were a tenth of that on a VM (measured: 4 KiB shm WRITEs, 1 thread,
//! 0.54–0.75 µs an op with them, 0.48–0.57 without). A thread times the first of its small
//! lone calls and then one in [`SAMPLE_EVERY`]; each call in between counts, in the same
//! histogram, the duration of the thread's latest timed one. Every transfer is counted, in
//! the bucket its thread's calls of that kind last took: the counts stay exact and the
//! durations are a sample.

use std::cell::Cell;

use crate::kind::{Opcode, TransportKind};
use crate::tally::{Tally, Writer};
use crate::ticks::{self, Stamp};

/// Lone calls moving fewer bytes than this are timed one in [`SAMPLE_EVERY`]; larger ones
/// take long enough that two stamps do not matter, and are all timed.
pub(crate) const SAMPLED_BELOW: u64 = 64 * 1024;
/// A thread times one small lone call in this many.
pub(crate) const SAMPLE_EVERY: u32 = 16;

/// What a thread remembers of its small lone calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SmallCalls {
    /// Calls still to go untimed before the next timed one.
    untimed_left: u32,
    /// How long the latest timed one took, once one was.
    last_ns: Option<u64>,
}

impl SmallCalls {
    const NEW: Self = Self {
        untimed_left: 0,
        last_ns: None,
    };

    /// The next small call: whether it is timed (`None`) or counts the latest timed
    /// duration (`Some`), and what the thread remembers after it.
    fn next(self) -> (Self, Option<u64>) {
        match (self.untimed_left, self.last_ns) {
            (left @ 1.., Some(ns)) => (
                Self {
                    untimed_left: left - 1,
                    last_ns: Some(ns),
                },
                Some(ns),
            ),
            _ => (
                Self {
                    untimed_left: SAMPLE_EVERY - 1,
                    last_ns: self.last_ns,
                },
                None,
            ),
        }
    }
}

thread_local! {
    static SMALL_CALLS: Cell<SmallCalls> = const { Cell::new(SmallCalls::NEW) };
}

/// How long a submission call took, for the transfers it completed itself: stamped at its
/// start, or (a small lone call between two timed ones) its thread's latest timed duration.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CallTimer {
    /// Stamped when the call began; `small` ones leave their duration for the next.
    Timed { start: Stamp, small: bool },
    /// The duration of the thread's latest timed small lone call.
    Estimated(u64),
}

impl CallTimer {
    /// A call that is always timed (one with several requests).
    pub(crate) fn timed() -> Self {
        Self::Timed {
            start: ticks::stamp(),
            small: false,
        }
    }

    /// A call submitting one request of `length` bytes.
    pub(crate) fn lone(length: u64) -> Self {
        if length >= SAMPLED_BELOW {
            return Self::timed();
        }
        let estimate = SMALL_CALLS.with(|calls| {
            let (after, estimate) = calls.get().next();
            calls.set(after);
            estimate
        });
        match estimate {
            Some(ns) => Self::Estimated(ns),
            None => Self::Timed {
                start: ticks::stamp(),
                small: true,
            },
        }
    }

    /// The call's duration, in nanoseconds, read when it ends.
    pub(crate) fn nanos(self) -> u64 {
        match self {
            Self::Timed { start, small } => {
                let ns = ticks::nanos_between(start, ticks::stamp());
                if small {
                    SMALL_CALLS.with(|calls| {
                        calls.set(SmallCalls {
                            last_ns: Some(ns),
                            ..calls.get()
                        });
                    });
                }
                ns
            }
            Self::Estimated(ns) => ns,
        }
    }
}

/// Bit length of the first bucket's bound: 2^8 ns = 256 ns.
const FIRST_BOUND_LOG2: u32 = 8;
/// Finite buckets: bounds 2^8 .. 2^34 ns.
pub const FINITE_BUCKETS: usize = 27;
/// Buckets, the last one `+Inf`.
pub const BUCKETS: usize = FINITE_BUCKETS + 1;

/// The upper bound of finite bucket `i`, in nanoseconds.
pub fn bound_ns(i: usize) -> u64 {
    1u64 << (FIRST_BOUND_LOG2 as usize + i.min(FINITE_BUCKETS - 1))
}

/// The bucket of a duration of `ns` nanoseconds: the first whose bound is at least `ns`.
pub fn bucket_of(ns: u64) -> usize {
    // ceil(log2(ns)) for ns > 1: the bit length of ns - 1.
    let bits = u64::BITS - ns.saturating_sub(1).leading_zeros();
    (bits.saturating_sub(FIRST_BOUND_LOG2) as usize).min(FINITE_BUCKETS)
}

pub(crate) fn op_index(op: Opcode) -> usize {
    match op {
        Opcode::Read => 0,
        Opcode::Write => 1,
    }
}

/// One histogram: a count per bucket and the sum of the durations.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [Tally; BUCKETS],
    sum_ns: Tally,
}

/// Latency histograms of completed transfers, `[transport][read | write]`: one lane's, or
/// the sum of every lane's when read.
#[derive(Debug, Default)]
pub struct LatencyCounters {
    by: [[Histogram; 2]; 3],
}

impl LatencyCounters {
    /// Counts `n` transfers over `transport` by `op` that each took `ns` nanoseconds.
    pub fn record(&self, transport: TransportKind, op: Opcode, ns: u64, n: u64) {
        self.record_as(transport, op, ns, n, Writer::SHARED);
    }

    /// `record`, by `writer` (`tally.rs`: no atomic add where one thread writes alone).
    pub(crate) fn record_as(
        &self,
        transport: TransportKind,
        op: Opcode,
        ns: u64,
        n: u64,
        writer: Writer,
    ) {
        let h = &self.by[transport.index()][op_index(op)];
        h.buckets[bucket_of(ns)].add(n, writer);
        h.sum_ns.add(ns.saturating_mul(n), writer);
    }

    /// Adds every count of `other` to this one's.
    pub fn add(&self, other: &LatencyCounters) {
        for (mine, theirs) in self.by.iter().flatten().zip(other.by.iter().flatten()) {
            for (m, t) in mine.buckets.iter().zip(&theirs.buckets) {
                m.add(t.get(), Writer::SHARED);
            }
            mine.sum_ns.add(theirs.sum_ns.get(), Writer::SHARED);
        }
    }

    /// A copy of the histogram of `transport` and `op`.
    pub fn read(&self, transport: TransportKind, op: Opcode) -> LatencyHistogram {
        let h = &self.by[transport.index()][op_index(op)];
        LatencyHistogram {
            transport,
            op,
            buckets: std::array::from_fn(|i| h.buckets[i].get()),
            sum_ns: h.sum_ns.get(),
        }
    }
}

/// Transfers done during one submission call, by transport and op, counted as the call
/// goes and recorded once when it ends (with the call's duration).
#[derive(Debug, Default)]
pub(crate) struct DoneInCall {
    counts: [[u32; 2]; 3],
}

impl DoneInCall {
    /// One more transfer over `transport` by `op` done during the call.
    pub(crate) fn add(&mut self, transport: TransportKind, op: Opcode) {
        let c = &mut self.counts[transport.index()][op_index(op)];
        *c = c.saturating_add(1);
    }

    /// Records them in `into`, each as taking the call's duration. Reads no clock when the
    /// call completed nothing during it.
    pub(crate) fn record(&self, (into, writer): (&LatencyCounters, Writer), timer: CallTimer) {
        if self.counts.iter().flatten().all(|&c| c == 0) {
            return;
        }
        let ns = timer.nanos();
        for (t, ops) in crate::kind::BY_INDEX.iter().zip(&self.counts) {
            for (op, &n) in [Opcode::Read, Opcode::Write].iter().zip(ops) {
                if n > 0 {
                    into.record_as(*t, *op, ns, u64::from(n), writer);
                }
            }
        }
    }
}

/// One histogram as read: counts per bucket (not cumulative) and the sum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Transport that served the transfers.
    pub transport: TransportKind,
    /// Read or write.
    pub op: Opcode,
    /// Transfers per bucket ([`bound_ns`]; the last is `+Inf`).
    pub buckets: [u64; BUCKETS],
    /// Sum of their durations, in nanoseconds.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// Transfers counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_falls_in_the_first_bucket_whose_bound_holds_it() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(256), 0);
        assert_eq!(bucket_of(257), 1);
        assert_eq!(bucket_of(512), 1);
        assert_eq!(bucket_of(400), 1);
        assert_eq!(bucket_of(1_000_000), 12); // 1 ms ≤ 2^20 ns
        assert_eq!(bucket_of(1 << 34), FINITE_BUCKETS - 1);
        assert_eq!(bucket_of((1 << 34) + 1), FINITE_BUCKETS);
        assert_eq!(bucket_of(u64::MAX), FINITE_BUCKETS);
        for i in 0..FINITE_BUCKETS {
            assert_eq!(bucket_of(bound_ns(i)), i);
            assert_eq!(bucket_of(bound_ns(i) + 1), i + 1);
        }
    }

    #[test]
    fn recorded_transfers_are_counted_summed_and_added_across_lanes() {
        let a = LatencyCounters::default();
        a.record(TransportKind::Shm, Opcode::Write, 300, 2);
        let b = LatencyCounters::default();
        b.record(TransportKind::Shm, Opcode::Write, 5_000, 1);
        let mut call = DoneInCall::default();
        call.add(TransportKind::Tcp, Opcode::Read);
        call.record((&b, Writer::SHARED), CallTimer::Estimated(70));
        let total = LatencyCounters::default();
        total.add(&a);
        total.add(&b);
        let h = total.read(TransportKind::Shm, Opcode::Write);
        assert_eq!(h.count(), 3);
        assert_eq!(h.sum_ns, 5_600);
        assert_eq!(h.buckets[1], 2);
        assert_eq!(h.buckets[bucket_of(5_000)], 1);
        assert_eq!(total.read(TransportKind::Tcp, Opcode::Read).buckets[0], 1);
        assert_eq!(total.read(TransportKind::Rdma, Opcode::Read).count(), 0);
    }

    /// What recording costs a same-host 4 KiB copy done during its call, as submission
    /// records it (the call's tally, a bucket and a sum), against the copy alone: every
    /// call stamped twice with atomic adds (as before sampling), small lone calls sampled
    /// ([`CallTimer::lone`]) with atomic adds, and sampled in the thread's own slot
    /// (`at_once`: no atomic add while it holds its lane alone). Interleaved rounds,
    /// paired medians.
    /// `cargo test --release -p ferry-core --lib -- --ignored --nocapture recording_cost`
    #[test]
    #[ignore = "a measurement: prints figures"]
    fn recording_cost() {
        use std::hint::black_box;
        use std::time::Instant;
        ticks::prepare();
        let shared = LatencyCounters::default();
        let owned = crate::at_once::AtOnce::default();
        let tasks = crate::metrics::TaskCounters::default();
        let src = vec![1u8; 4096];
        let mut dst = vec![0u8; 4096];
        let ops = 20_000u32;
        let mut runs: [Vec<f64>; 4] = Default::default();
        for round in 0..200 {
            for i in 0..4 {
                let mode = (i + round) % 4;
                let t = Instant::now();
                for _ in 0..ops {
                    let timer = match mode {
                        0 => None,
                        1 => Some(CallTimer::timed()),
                        _ => Some(CallTimer::lone(4096)),
                    };
                    dst.copy_from_slice(black_box(&src));
                    if let Some(timer) = timer {
                        let mut call = DoneInCall::default();
                        call.add(TransportKind::Shm, Opcode::Write);
                        if mode == 3 {
                            owned.completed(TransportKind::Shm, Opcode::Write, 4096);
                            call.record(owned.latency_local(), timer);
                        } else {
                            // What counting it took before: a count and its bytes.
                            tasks.completed_n(1);
                            tasks.moved(TransportKind::Shm, Opcode::Write, 4096);
                            call.record((&shared, Writer::SHARED), timer);
                        }
                    }
                    black_box(&mut dst);
                }
                runs[mode].push(t.elapsed().as_nanos() as f64 / f64::from(ops));
            }
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let paired = |m: usize| -> f64 {
            median(
                &runs[m]
                    .iter()
                    .zip(&runs[0])
                    .map(|(r, p)| r - p)
                    .collect::<Vec<_>>(),
            )
        };
        println!(
            "4 KiB copy {:.1} ns; recording a transfer: every call stamped, atomic adds +{:.1} ns; sampled, atomic adds +{:.1} ns; sampled, own slot +{:.1} ns (paired medians; held lane alone: {})",
            median(&runs[0]),
            paired(1),
            paired(2),
            paired(3),
            crate::lanes::held().1
        );
    }

    #[test]
    fn a_call_that_completed_nothing_reads_no_clock() {
        // On a thread of its own: a small lone call that reads the clock when it ends
        // leaves its duration for the thread's next calls.
        std::thread::spawn(|| {
            let timer = CallTimer::lone(4096);
            assert!(matches!(timer, CallTimer::Timed { small: true, .. }));
            DoneInCall::default().record((&LatencyCounters::default(), Writer::SHARED), timer);
            assert_eq!(SMALL_CALLS.with(Cell::get).last_ns, None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_times_its_first_small_lone_call_then_one_in_sample_every() {
        let mut calls = SmallCalls::NEW;
        let mut timed = Vec::new();
        for i in 0..(3 * SAMPLE_EVERY) {
            let (after, estimate) = calls.next();
            calls = after;
            match estimate {
                None => {
                    timed.push(i);
                    calls.last_ns = Some(u64::from(i) + 100);
                }
                // The latest timed call's duration.
                Some(ns) => assert_eq!(ns, u64::from(*timed.last().unwrap()) + 100),
            }
        }
        assert_eq!(timed, [0, SAMPLE_EVERY, 2 * SAMPLE_EVERY]);
        // A timed call whose duration was never read (it completed nothing) leaves the
        // next one timed too.
        let (after, estimate) = SmallCalls::NEW.next();
        assert_eq!(estimate, None);
        assert_eq!(after.next().1, None);
    }

    #[test]
    fn small_lone_calls_count_every_transfer_and_large_ones_are_all_timed() {
        std::thread::spawn(|| {
            ticks::prepare();
            let hist = LatencyCounters::default();
            let calls = 3 * SAMPLE_EVERY + 5;
            let mut stamped = 0;
            for _ in 0..calls {
                let timer = CallTimer::lone(SAMPLED_BELOW - 1);
                stamped += u32::from(matches!(timer, CallTimer::Timed { .. }));
                let mut call = DoneInCall::default();
                call.add(TransportKind::Shm, Opcode::Write);
                call.record((&hist, Writer::SHARED), timer);
            }
            assert_eq!(stamped, 4, "the first, then one in {SAMPLE_EVERY}");
            let h = hist.read(TransportKind::Shm, Opcode::Write);
            assert_eq!(h.count(), u64::from(calls), "every transfer counted");
            // Large lone calls are all timed and leave the small calls' sample alone.
            let before = SMALL_CALLS.with(Cell::get);
            for _ in 0..SAMPLE_EVERY {
                assert!(matches!(
                    CallTimer::lone(SAMPLED_BELOW),
                    CallTimer::Timed { small: false, .. }
                ));
            }
            assert_eq!(SMALL_CALLS.with(Cell::get), before);
        })
        .join()
        .unwrap();
    }
}
