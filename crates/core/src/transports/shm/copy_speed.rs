//! How fast one core copies a block that stays in its own cache: with the L2's size
//! (`cpu_cache`), what the copy plan reads of the machine (`copy_plan::Machine`). The size
//! alone does not tell it: two cores with the same L2 may copy a block that fits it in
//! times a factor of two or more apart, and only the slower repays handing half of it to
//! another core.
//!
//! Measured once per process, on first use: a few copies of [`PROBE`] bytes between two
//! page-aligned buffers of this thread (as a region and a mapping are), the median kept.
//! Not the fastest: within a busy process the fastest of a few runs reads well above what
//! the same core sustains, enough to put a threshold a power of two too high; whatever else
//! runs on the machine slows only the runs it lands on.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The probe copy's size: source and destination together fit the L2 of every core of
/// these machines (256 KiB and up), and one copy takes microseconds, long enough for the
/// clock's resolution.
const PROBE: usize = 128 << 10;
/// Timed copies (after one untimed, which brings the buffers into the cache); odd, for
/// a median.
const RUNS: usize = 9;
/// The alignment of both buffers: a page, as every region and mapping starts on one.
const PAGE: usize = 4096;

/// Bytes per nanosecond one core copies a cache-resident block at; `None` where the runs
/// could not be timed (a clock that did not move).
pub(super) fn cached_copy_rate() -> Option<f64> {
    static RATE: OnceLock<Option<f64>> = OnceLock::new();
    *RATE.get_or_init(measure)
}

fn measure() -> Option<f64> {
    let mut buffer = vec![0x5au8; 2 * PROBE + PAGE];
    let start = buffer.as_ptr().align_offset(PAGE).min(PAGE);
    let (src, dst) = buffer[start..start + 2 * PROBE].split_at_mut(PROBE);
    dst.copy_from_slice(src);
    let mut took = [Duration::ZERO; RUNS];
    for (i, t) in took.iter_mut().enumerate() {
        let started = Instant::now();
        dst.copy_from_slice(src);
        // Keeps the copy from being merged with the next or dropped as unobserved.
        std::hint::black_box(&mut *dst)[i] ^= 1;
        *t = started.elapsed();
    }
    took.sort_unstable();
    let median = took[RUNS / 2];
    (!median.is_zero()).then(|| rate(PROBE as u64, median))
}

/// Bytes per nanosecond of `bytes` copied in `took` (not zero).
fn rate(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / took.as_nanos() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_bytes_per_nanosecond() {
        assert_eq!(rate(128 << 10, Duration::from_nanos(4096)), 32.0);
    }

    #[test]
    fn this_machine_copies_at_a_plausible_rate() {
        // Between 0.5 GB/s (a starved VM) and 2 TB/s: a measured figure, never a made-up one.
        let r = cached_copy_rate().expect("the clock moves across a 128 KiB copy");
        assert!((0.5..2000.0).contains(&r), "{r} bytes/ns");
        assert_eq!(cached_copy_rate(), Some(r), "measured once");
    }
}
