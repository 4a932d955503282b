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

use std::sync::atomic::{AtomicU64, Ordering};

use crate::kind::{Opcode, TransportKind};

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

fn op_index(op: Opcode) -> usize {
    match op {
        Opcode::Read => 0,
        Opcode::Write => 1,
    }
}

/// One histogram: a count per bucket and the sum of the durations.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
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
        let h = &self.by[transport.index()][op_index(op)];
        h.buckets[bucket_of(ns)].fetch_add(n, Ordering::Relaxed);
        h.sum_ns.fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
    }

    /// Adds every count of `other` to this one's.
    pub fn add(&self, other: &LatencyCounters) {
        for (mine, theirs) in self.by.iter().flatten().zip(other.by.iter().flatten()) {
            for (m, t) in mine.buckets.iter().zip(&theirs.buckets) {
                m.fetch_add(t.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            mine.sum_ns
                .fetch_add(theirs.sum_ns.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// A copy of the histogram of `transport` and `op`.
    pub fn read(&self, transport: TransportKind, op: Opcode) -> LatencyHistogram {
        let h = &self.by[transport.index()][op_index(op)];
        LatencyHistogram {
            transport,
            op,
            buckets: std::array::from_fn(|i| h.buckets[i].load(Ordering::Relaxed)),
            sum_ns: h.sum_ns.load(Ordering::Relaxed),
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

    /// Records them in `into`, each as taking `ns` nanoseconds. Reads no clock when the call
    /// completed nothing during it.
    pub(crate) fn record(&self, into: &LatencyCounters, ns: impl FnOnce() -> u64) {
        if self.counts.iter().flatten().all(|&c| c == 0) {
            return;
        }
        let ns = ns();
        for (t, ops) in crate::kind::BY_INDEX.iter().zip(&self.counts) {
            for (op, &n) in [Opcode::Read, Opcode::Write].iter().zip(ops) {
                if n > 0 {
                    into.record(*t, *op, ns, u64::from(n));
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
        call.record(&b, || 70);
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
    /// records it (two stamps, the call's tally, a bucket and a sum, the peer's two counts),
    /// against the copy alone, and with the monotonic clock's reads in place of the stamps:
    /// interleaved rounds, medians.
    /// `cargo test --release -p ferry-core --lib -- --ignored --nocapture recording_cost`
    #[test]
    #[ignore = "a measurement: prints figures"]
    fn recording_cost() {
        use crate::ticks;
        use std::hint::black_box;
        use std::time::Instant;
        ticks::prepare();
        let hist = LatencyCounters::default();
        let peer = crate::peer_series::PeerSeries::default();
        let src = vec![1u8; 4096];
        let mut dst = vec![0u8; 4096];
        let ops = 20_000u32;
        let mut runs: [Vec<f64>; 3] = Default::default();
        for round in 0..200 {
            for i in 0..3 {
                let mode = (i + round) % 3;
                let t = Instant::now();
                for _ in 0..ops {
                    let record = |ns: &dyn Fn() -> u64| {
                        let mut call = DoneInCall::default();
                        call.add(TransportKind::Shm, Opcode::Write);
                        peer.completed(1, 4096);
                        call.record(&hist, ns);
                    };
                    match mode {
                        0 => dst.copy_from_slice(black_box(&src)),
                        1 => {
                            let start = ticks::stamp();
                            dst.copy_from_slice(black_box(&src));
                            record(&|| ticks::nanos_between(start, ticks::stamp()));
                        }
                        _ => {
                            let start = Instant::now();
                            dst.copy_from_slice(black_box(&src));
                            record(&|| start.elapsed().as_nanos() as u64);
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
            "4 KiB copy {:.1} ns; recording with stamps +{:.1} ns, with clock reads +{:.1} ns a transfer (paired medians)",
            median(&runs[0]),
            paired(1),
            paired(2)
        );
    }

    #[test]
    fn a_call_that_completed_nothing_reads_no_clock() {
        DoneInCall::default().record(&LatencyCounters::default(), || {
            panic!("clock read for nothing")
        });
    }
}
