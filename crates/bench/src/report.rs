//! tebench's result columns, computed from merged worker stats with the formulas of
//! Mooncake's tebench, so that numbers compare directly.
//!
//! With `ops` = all measured operations over all threads and `wall` = each thread's
//! measured wall time:
//! - BW = block × batch × ops / mean(wall), in 10^9 B/s;
//! - Avg Inst GB/s = mean over operations of block × batch / that operation's time;
//! - Avg Lat = mean(wall) × threads / ops (pacing included);
//! - Avg Tx, P99 Tx, P999 Tx = mean and percentiles of the operation time, submit to
//!   completion (batch allocation and free are outside the timer).
//!
//! Ferry adds the minimum, median and maximum operation time: every Tx figure comes from
//! the same samples ([`crate::stats`]), so min ≤ P50 ≤ P99 ≤ P999 ≤ max and Avg lies
//! within min..max. Mooncake's columns stay as they are.
//!
//! A case with no operations reports zeros rather than NaN or infinity.
//!
//! Two text layouts: Ferry's table ([`ReportRow::header`], [`ReportRow::to_line`]) and
//! Mooncake's own ([`ReportRow::mooncake_header`], [`ReportRow::to_mooncake_line`]), which
//! its users' parsers read: every cell left-aligned in a fixed width, fixed notation.

use serde::Serialize;

use crate::stats::{TxSummary, WorkerStats};

/// One result row: a (block size, batch size) case.
///
/// The counts are `f64`/`u32` rather than `u64`/`usize` so that the row crosses into
/// JavaScript as it is (the binding hands this very type to JS, where `BenchRow` names it; napi would
/// turn a `u64` into a BigInt). Block sizes and operation counts stay far below 2^53.
#[cfg_attr(feature = "napi", napi_derive::napi(object))]
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportRow {
    /// Bytes per request.
    pub block_size: f64,
    /// Requests per batch.
    pub batch_size: u32,
    /// Worker threads.
    pub threads: u32,
    /// Measured operations (batches) over all threads.
    pub ops: f64,
    /// BW (GB/S): block × batch × ops / mean per-thread wall time, 10^9 B/s.
    pub bw_gbps: f64,
    /// Avg Inst GB/s: mean over operations of block × batch / operation time.
    pub avg_inst_gbps: f64,
    /// Avg Lat (us): mean per-thread wall time × threads / ops.
    pub avg_lat_us: f64,
    /// Avg Tx (us): mean operation time.
    pub avg_tx_us: f64,
    /// P99 Tx (us).
    pub p99_tx_us: f64,
    /// P999 Tx (us).
    pub p999_tx_us: f64,
    /// Shortest operation time (us).
    pub min_tx_us: f64,
    /// Median operation time (us).
    pub p50_tx_us: f64,
    /// Longest operation time (us).
    pub max_tx_us: f64,
}

impl ReportRow {
    /// Mooncake's column headers, with their units.
    pub const COLUMNS: [&'static str; 8] = [
        "BlkSize (B)",
        "Batch",
        "BW (GB/S)",
        "Avg Inst GB/s",
        "Avg Lat (us)",
        "Avg Tx (us)",
        "P99 Tx (us)",
        "P999 Tx (us)",
    ];

    /// Computes the row for a case from every worker's stats (already merged or not:
    /// [`WorkerStats::workers`] says how many threads each entry stands for).
    ///
    /// # Errors
    /// If the histograms cannot be merged (never for stats from [`WorkerStats::new`]).
    pub fn from_stats(
        block_size: u64,
        batch_size: usize,
        stats: &[WorkerStats],
    ) -> Result<Self, hdrhistogram::AdditionError> {
        Ok(match WorkerStats::merge_all(stats)? {
            Some(merged) => Self::from_merged(block_size, batch_size, &merged),
            None => Self::from_parts(block_size, batch_size, 0, 0, 0.0, 0.0, None),
        })
    }

    /// Computes the row from stats merged over every thread.
    pub fn from_merged(block_size: u64, batch_size: usize, merged: &WorkerStats) -> Self {
        Self::from_parts(
            block_size,
            batch_size,
            merged.workers,
            merged.ops,
            merged.wall.as_secs_f64(),
            merged.inst_bps_sum,
            merged.tx_summary().as_ref(),
        )
    }

    /// The formulas, on plain numbers: `wall_sum_s` is the sum of per-thread wall times,
    /// `inst_bps_sum` the sum over operations of bytes / operation time, `tx` the
    /// distribution of operation times (`None` without operations).
    pub fn from_parts(
        block_size: u64,
        batch_size: usize,
        threads: usize,
        ops: u64,
        wall_sum_s: f64,
        inst_bps_sum: f64,
        tx: Option<&TxSummary>,
    ) -> Self {
        let op_bytes = block_size as f64 * batch_size as f64;
        let mean_wall_s = if threads == 0 {
            0.0
        } else {
            wall_sum_s / threads as f64
        };
        let per_op = |total: f64| if ops == 0 { 0.0 } else { total / ops as f64 };
        let bw_gbps = if mean_wall_s > 0.0 {
            op_bytes * ops as f64 / mean_wall_s / 1e9
        } else {
            0.0
        };
        let tx = if ops == 0 { None } else { tx };
        let us = |f: fn(&TxSummary) -> u64| tx.map_or(0.0, |t| f(t) as f64 / 1e3);
        Self {
            block_size: block_size as f64,
            batch_size: u32::try_from(batch_size).unwrap_or(u32::MAX),
            threads: u32::try_from(threads).unwrap_or(u32::MAX),
            ops: ops as f64,
            bw_gbps,
            avg_inst_gbps: per_op(inst_bps_sum) / 1e9,
            avg_lat_us: per_op(mean_wall_s * threads as f64) * 1e6,
            avg_tx_us: tx.map_or(0.0, |t| t.mean_ns / 1e3),
            p99_tx_us: us(|t| t.p99_ns),
            p999_tx_us: us(|t| t.p999_ns),
            min_tx_us: us(|t| t.min_ns),
            p50_tx_us: us(|t| t.p50_ns),
            max_tx_us: us(|t| t.max_ns),
        }
    }

    /// The header line for [`ReportRow::to_line`].
    pub fn header() -> String {
        let c = Self::COLUMNS;
        format!(
            "{:>12} {:>6} {:>10} {:>14} {:>13} {:>12} {:>12} {:>13}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
        )
    }

    /// The row as text, aligned under [`ReportRow::header`].
    pub fn to_line(&self) -> String {
        let widths = [12, 6, 10, 14, 13, 12, 12, 13];
        let cells = self.cells(3);
        let right: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        right.join(" ")
    }

    /// The cells in column order: counts as integers, GB/s with `gbps_digits` decimals,
    /// µs with 1.
    fn cells(&self, gbps_digits: usize) -> [String; 8] {
        let us = |v: f64| format!("{v:.1}");
        [
            format!("{}", self.block_size),
            self.batch_size.to_string(),
            format!("{:.gbps_digits$}", self.bw_gbps),
            format!("{:.gbps_digits$}", self.avg_inst_gbps),
            us(self.avg_lat_us),
            us(self.avg_tx_us),
            us(self.p99_tx_us),
            us(self.p999_tx_us),
        ]
    }
}

/// Widths of Mooncake's cells: BlkSize 14, Batch 8, every further column 14.
const MOONCAKE_WIDTHS: [usize; 8] = [14, 8, 14, 14, 14, 14, 14, 14];

/// Length of the dashed line under Mooncake's header.
const MOONCAKE_RULE: usize = 160;

impl ReportRow {
    /// Mooncake's header: the column names left-aligned in their widths, then a line of
    /// 160 `-` (two lines, no trailing newline).
    pub fn mooncake_header() -> String {
        let mut out = String::new();
        for (name, w) in Self::COLUMNS.iter().zip(MOONCAKE_WIDTHS) {
            out.push_str(&format!("{name:<w$}"));
        }
        out.push('\n');
        out.push_str(&"-".repeat(MOONCAKE_RULE));
        out
    }

    /// The row in Mooncake's layout: 6 decimals for the GB/s columns, 1 for the µs ones.
    pub fn to_mooncake_line(&self) -> String {
        self.cells(6)
            .iter()
            .zip(MOONCAKE_WIDTHS)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-12)
    }

    #[test]
    fn formulas_on_hand_computed_numbers() {
        // 2 threads, block 4096, batch 2 (8192 B per op).
        // Thread A: 3 ops of 10, 20, 30 µs; wall 1 ms.
        // Thread B: 1 op of 40 µs;          wall 3 ms.
        let mut a = WorkerStats::new().expect("stats");
        for us in [10, 20, 30] {
            a.record(8192, Duration::from_micros(us));
        }
        a.wall = Duration::from_millis(1);
        let mut b = WorkerStats::new().expect("stats");
        b.record(8192, Duration::from_micros(40));
        b.wall = Duration::from_millis(3);
        let row = ReportRow::from_stats(4096, 2, &[a, b]).expect("row");

        assert_eq!(row.threads, 2);
        assert_eq!(row.ops, 4.0);
        // mean wall = 2 ms; BW = 8192 × 4 / 0.002 s = 16_384_000 B/s = 0.016384 GB/s.
        assert!(close(row.bw_gbps, 0.016_384, 1e-9), "{}", row.bw_gbps);
        // inst = 8192/10µs + 8192/20µs + 8192/30µs + 8192/40µs
        //      = 819.2e6 + 409.6e6 + 273.0667e6 + 204.8e6 = 1706.6667e6 B/s; / 4 ops
        //      = 426.6667e6 B/s = 0.4266667 GB/s.
        assert!(
            close(row.avg_inst_gbps, 0.426_666_67, 1e-6),
            "{}",
            row.avg_inst_gbps
        );
        // Avg Lat = 2 ms × 2 / 4 = 1 ms = 1000 µs.
        assert!(close(row.avg_lat_us, 1000.0, 1e-9), "{}", row.avg_lat_us);
        // Avg Tx = (10 + 20 + 30 + 40) / 4 = 25 µs.
        assert!(close(row.avg_tx_us, 25.0, 1e-9), "{}", row.avg_tx_us);
        // With 4 samples the 99th and 99.9th percentiles are the largest one, 40 µs,
        // within the histogram's 3 significant digits.
        assert!(close(row.p99_tx_us, 40.0, 1e-3), "{}", row.p99_tx_us);
        assert!(close(row.p999_tx_us, 40.0, 1e-3), "{}", row.p999_tx_us);
        // The samples' own min, median and max: exact, not a histogram bucket's.
        assert_eq!((row.min_tx_us, row.max_tx_us), (10.0, 40.0));
        assert!(close(row.p50_tx_us, 20.0, 1e-3), "{}", row.p50_tx_us);
    }

    #[test]
    fn percentiles_over_a_thousand_operations() {
        // 1000 ops of 1..=1000 µs on one thread: P99 = 990 µs, P999 = 999 µs.
        let mut s = WorkerStats::new().expect("stats");
        for us in 1..=1000 {
            s.record(4096, Duration::from_micros(us));
        }
        s.wall = Duration::from_secs(1);
        let row = ReportRow::from_stats(4096, 1, &[s]).expect("row");
        assert!(close(row.p99_tx_us, 990.0, 1e-3), "{}", row.p99_tx_us);
        assert!(close(row.p999_tx_us, 999.0, 1e-3), "{}", row.p999_tx_us);
        // Avg Tx = 500.5 µs; BW = 4096 × 1000 / 1 s = 4.096e6 B/s.
        assert!(close(row.avg_tx_us, 500.5, 1e-9));
        assert!(close(row.bw_gbps, 0.004_096, 1e-9));
    }

    #[test]
    fn no_operations_give_zeros_not_nan() {
        let row = ReportRow::from_stats(4096, 1, &[]).expect("row");
        assert_eq!(row.ops, 0.0);
        assert_eq!(row.bw_gbps, 0.0);
        assert_eq!(row.avg_lat_us, 0.0);
        let mut idle = WorkerStats::new().expect("stats");
        idle.wall = Duration::from_secs(1);
        let row = ReportRow::from_stats(4096, 1, &[idle]).expect("row");
        for v in [
            row.bw_gbps,
            row.avg_inst_gbps,
            row.avg_lat_us,
            row.avg_tx_us,
            row.p99_tx_us,
            row.p999_tx_us,
            row.min_tx_us,
            row.p50_tx_us,
            row.max_tx_us,
        ] {
            assert_eq!(v, 0.0);
        }
    }

    #[test]
    fn text_row_lines_up_with_the_header() {
        let tx = TxSummary {
            min_ns: 50_000,
            mean_ns: 100_000.0,
            p50_ns: 90_000,
            p99_ns: 150_000,
            p999_ns: 200_000,
            max_ns: 250_000,
        };
        let row = ReportRow::from_parts(4096, 1, 1, 10, 1.0, 4.096e10, Some(&tx));
        assert_eq!(
            (row.avg_tx_us, row.p999_tx_us, row.max_tx_us),
            (100.0, 200.0, 250.0)
        );
        let (h, l) = (ReportRow::header(), row.to_line());
        assert_eq!(h.len(), l.len(), "\n{h}\n{l}");
        assert!(h.contains("BW (GB/S)") && h.contains("P999 Tx (us)"));
    }

    #[test]
    fn mooncake_layout_byte_for_byte() {
        let header = ReportRow::mooncake_header();
        let (names, rule) = header.split_once('\n').expect("two lines");
        assert_eq!(
            names,
            "BlkSize (B)   Batch   BW (GB/S)     Avg Inst GB/s Avg Lat (us)  \
             Avg Tx (us)   P99 Tx (us)   P999 Tx (us)  "
        );
        assert_eq!(rule, "-".repeat(160));
        let row = ReportRow {
            block_size: 65536.0,
            batch_size: 1,
            threads: 1,
            ops: 10.0,
            bw_gbps: 1.234_567_89,
            avg_inst_gbps: 2.5,
            avg_lat_us: 53.06,
            avg_tx_us: 52.94,
            p99_tx_us: 120.0,
            p999_tx_us: 1234.56,
            min_tx_us: 40.0,
            p50_tx_us: 50.0,
            max_tx_us: 2000.0,
        };
        assert_eq!(
            row.to_mooncake_line(),
            "65536         1       1.234568      2.500000      53.1          \
             52.9          120.0         1234.6        "
        );
        assert_eq!(row.to_mooncake_line().len(), names.len());
    }
}
