//! One worker's measurements, and their merge over workers.
//!
//! Every operation time is recorded once, as one sample, into an HDR histogram (the
//! percentiles) and into the exact sum, minimum and maximum beside it, so that every figure
//! of a row comes from the same samples: Avg is their exact mean, and lies within min..max.
//! Recording costs a few additions and compares and one histogram increment, nothing that
//! allocates: a shm operation of 4 KiB takes well under a microsecond.
//!
//! Why Avg can exceed P99 in a row and still be right: the mean weighs the slowest samples
//! by their size, a percentile only counts them. When fewer than 1 % of the operations are
//! slow enough (a worker preempted for milliseconds on a loaded machine), the mean rises
//! above P99 while P99 stays put; the max column shows it.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Histogram bounds: operation times in nanoseconds, 1 ns to 1 hour, 3 significant digits.
const HIST_LOW_NS: u64 = 1;
const HIST_HIGH_NS: u64 = 3_600_000_000_000;
const HIST_SIGFIG: u8 = 3;

/// One worker's measurements (or several workers' after [`WorkerStats::merge`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerStats {
    /// Workers merged into these stats (1 for one worker's).
    pub workers: usize,
    /// Measured operations (batches) that completed.
    pub ops: u64,
    /// Bytes those operations moved.
    pub bytes: u64,
    /// Sum over workers of measured wall time (pacing included).
    pub wall: Duration,
    /// Sum of operation times (submit to completion), as recorded (at least 1 ns each).
    pub tx_total: Duration,
    /// Operation times in nanoseconds. Recorded in ns rather than µs so that
    /// few-microsecond shared-memory operations keep three significant digits.
    pub tx_ns: Histogram<u64>,
    /// Shortest operation time recorded, in ns (`u64::MAX` before the first).
    pub tx_min_ns: u64,
    /// Longest operation time recorded, in ns (0 before the first).
    pub tx_max_ns: u64,
    /// Sum over operations of bytes / operation time, in B/s ("Avg Inst GB/s").
    pub inst_bps_sum: f64,
}

/// The distribution of operation times, in ns: exact minimum, mean and maximum, and the
/// histogram's percentiles kept within them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TxSummary {
    /// Shortest operation.
    pub min_ns: u64,
    /// Mean operation time.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Longest operation.
    pub max_ns: u64,
}

impl WorkerStats {
    /// Empty stats of one worker.
    ///
    /// # Errors
    /// Only if the histogram cannot be created (its bounds are constants, so never).
    pub fn new() -> Result<Self, hdrhistogram::CreationError> {
        Ok(Self {
            workers: 1,
            ops: 0,
            bytes: 0,
            wall: Duration::ZERO,
            tx_total: Duration::ZERO,
            tx_ns: Histogram::new_with_bounds(HIST_LOW_NS, HIST_HIGH_NS, HIST_SIGFIG)?,
            tx_min_ns: u64::MAX,
            tx_max_ns: 0,
            inst_bps_sum: 0.0,
        })
    }

    /// Records one completed operation of `bytes` that took `took` (a zero time counts as
    /// 1 ns everywhere, never a division by zero).
    #[inline]
    pub fn record(&mut self, bytes: u64, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.ops += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.tx_total = self.tx_total.saturating_add(Duration::from_nanos(ns));
        self.tx_ns.saturating_record(ns);
        self.tx_min_ns = self.tx_min_ns.min(ns);
        self.tx_max_ns = self.tx_max_ns.max(ns);
        self.inst_bps_sum += bytes as f64 / (ns as f64 * 1e-9);
    }

    /// Adds `other` (another worker) into these stats.
    ///
    /// # Errors
    /// If `other`'s histogram does not fit this one's range (histograms made by
    /// [`WorkerStats::new`] always fit).
    pub fn merge(&mut self, other: &WorkerStats) -> Result<(), hdrhistogram::AdditionError> {
        self.tx_ns.add(&other.tx_ns)?;
        self.workers += other.workers;
        self.ops += other.ops;
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.wall = self.wall.saturating_add(other.wall);
        self.tx_total = self.tx_total.saturating_add(other.tx_total);
        self.tx_min_ns = self.tx_min_ns.min(other.tx_min_ns);
        self.tx_max_ns = self.tx_max_ns.max(other.tx_max_ns);
        self.inst_bps_sum += other.inst_bps_sum;
        Ok(())
    }

    /// Merges every worker's stats into one. `None` for an empty slice.
    ///
    /// # Errors
    /// As [`WorkerStats::merge`].
    pub fn merge_all(
        stats: &[WorkerStats],
    ) -> Result<Option<WorkerStats>, hdrhistogram::AdditionError> {
        let mut iter = stats.iter();
        let Some(first) = iter.next() else {
            return Ok(None);
        };
        let mut merged = first.clone();
        for s in iter {
            merged.merge(s)?;
        }
        Ok(Some(merged))
    }

    /// The distribution of the recorded operation times; `None` before the first.
    pub fn tx_summary(&self) -> Option<TxSummary> {
        if self.ops == 0 {
            return None;
        }
        let (min_ns, max_ns) = (self.tx_min_ns, self.tx_max_ns);
        // The histogram answers with the highest value its bucket stands for, which can lie
        // above every sample (up to 0.1 % at 3 digits): a percentile is kept within the
        // samples' exact range, so that p50 ≤ p99 ≤ p999 ≤ max holds in every row.
        let at = |q: f64| self.tx_ns.value_at_quantile(q).clamp(min_ns, max_ns);
        Some(TxSummary {
            min_ns,
            mean_ns: self.tx_total.as_nanos() as f64 / self.ops as f64,
            p50_ns: at(0.5),
            p99_ns: at(0.99),
            p999_ns: at(0.999),
            max_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_record_and_merge() {
        let mut a = WorkerStats::new().expect("stats");
        a.record(1000, Duration::from_micros(1)); // 1e9 B/s
        a.record(1000, Duration::from_micros(2)); // 5e8 B/s
        a.wall = Duration::from_millis(1);
        let mut b = WorkerStats::new().expect("stats");
        b.record(1000, Duration::from_micros(4)); // 2.5e8 B/s
        b.wall = Duration::from_millis(3);
        let m = WorkerStats::merge_all(&[a, b])
            .expect("merge")
            .expect("some");
        assert_eq!(m.workers, 2);
        assert_eq!(m.ops, 3);
        assert_eq!(m.bytes, 3000);
        assert_eq!(m.wall, Duration::from_millis(4));
        assert_eq!(m.tx_total, Duration::from_micros(7));
        assert_eq!(m.tx_ns.len(), 3);
        assert!((m.inst_bps_sum - 1.75e9).abs() < 1.0);
        assert!(WorkerStats::merge_all(&[]).expect("empty").is_none());
        // Zero-length times are recorded as 1 ns, never a division by zero.
        let mut z = WorkerStats::new().expect("stats");
        z.record(8, Duration::ZERO);
        assert!(z.inst_bps_sum.is_finite());
    }

    /// Checks the order every row promises: min ≤ p50 ≤ p99 ≤ p999 ≤ max, min ≤ Avg ≤ max.
    fn assert_ordered(s: &TxSummary, what: &str) {
        assert!(s.min_ns <= s.p50_ns, "{what}: min > p50: {s:?}");
        assert!(s.p50_ns <= s.p99_ns, "{what}: p50 > p99: {s:?}");
        assert!(s.p99_ns <= s.p999_ns, "{what}: p99 > p999: {s:?}");
        assert!(s.p999_ns <= s.max_ns, "{what}: p999 > max: {s:?}");
        assert!(
            s.min_ns as f64 <= s.mean_ns && s.mean_ns <= s.max_ns as f64,
            "{what}: Avg outside min..max: {s:?}"
        );
    }

    fn stats_of(samples: impl IntoIterator<Item = u64>) -> WorkerStats {
        let mut s = WorkerStats::new().expect("stats");
        for ns in samples {
            s.record(4096, Duration::from_nanos(ns));
        }
        s
    }

    #[test]
    fn avg_lies_within_min_and_max_and_percentiles_are_ordered() {
        // Synthetic distributions: uniform, equal samples (one histogram bucket, whose
        // highest equivalent value lies above every sample), a heavy tail, two workers.
        let uniform = stats_of(1..=10_000);
        let equal = stats_of(std::iter::repeat_n(4_000_123, 1000));
        // 99.5 % of the operations at 400 ns, 0.5 % preempted for 3 ms: Avg is right to
        // exceed P99 here, and max shows why.
        let tail = stats_of((0..10_000).map(|i| if i % 200 == 0 { 3_000_000 } else { 400 }));
        let mut two = stats_of((0..5000).map(|i| 300 + i % 97));
        two.merge(&stats_of((0..50).map(|i| 90_000 + i)))
            .expect("merge");
        for (what, s) in [
            ("uniform", &uniform),
            ("equal", &equal),
            ("tail", &tail),
            ("two", &two),
        ] {
            let t = s.tx_summary().expect("samples");
            assert_ordered(&t, what);
        }
        let e = equal.tx_summary().expect("samples");
        assert_eq!(
            (e.min_ns, e.p50_ns, e.p999_ns, e.max_ns),
            (4_000_123, 4_000_123, 4_000_123, 4_000_123)
        );
        assert_eq!(e.mean_ns, 4_000_123.0);
        let t = tail.tx_summary().expect("samples");
        assert_eq!((t.p50_ns, t.p99_ns, t.max_ns), (400, 400, 3_000_000));
        assert!(t.mean_ns > t.p99_ns as f64, "{t:?}");
        assert!(stats_of([]).tx_summary().is_none());
        // A zero time counts as the 1 ns it is recorded as, in the mean too.
        let z = stats_of([0, 0]).tx_summary().expect("samples");
        assert_ordered(&z, "zeros");
    }
}
