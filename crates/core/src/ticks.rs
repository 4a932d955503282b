//! Cheap timestamps for the latency histograms (`latency`).
//!
//! Reading the monotonic clock costs tens of nanoseconds on many machines (a VM's vDSO
//! clock most of all), which a 4 KiB same-host copy would pay twice per transfer. Where the
//! kernel itself keeps time by the CPU's time-stamp counter (the `tsc` clocksource: the
//! counter is invariant and synchronized across cores), a stamp is that counter, read in a
//! few nanoseconds, and converted to nanoseconds only when a duration is recorded, by a
//! rate measured once per process against the monotonic clock. Elsewhere a stamp is the
//! monotonic clock's nanoseconds since the process's first stamp.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A point in time, comparable with another of the same process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

/// How this process turns stamps into nanoseconds.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// The time-stamp counter, at `Rate`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Counter(Rate),
    /// The monotonic clock, in nanoseconds since `epoch`.
    Clock { epoch: Instant },
}

/// Nanoseconds per counter tick, as a 32.32 fixed-point number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rate(u64);

impl Rate {
    /// The rate at which `ticks` ticks took `nanos` nanoseconds; `None` for no ticks, or a
    /// rate that does not fit (a counter slower than 1 tick per 4 s).
    fn measured(ticks: u64, nanos: u64) -> Option<Self> {
        if ticks == 0 {
            return None;
        }
        let fixed = (u128::from(nanos) << 32) / u128::from(ticks);
        u64::try_from(fixed).ok().filter(|&r| r > 0).map(Rate)
    }

    /// `ticks` ticks in nanoseconds, saturating.
    fn nanos(self, ticks: u64) -> u64 {
        u64::try_from((u128::from(ticks) * u128::from(self.0)) >> 32).unwrap_or(u64::MAX)
    }
}

/// How long the counter is timed against the clock. Long enough that the two clock reads'
/// jitter is a small fraction of it; paid once per process, when its first engine starts.
const CALIBRATION: Duration = Duration::from_millis(2);

static SOURCE: OnceLock<Source> = OnceLock::new();

/// Whether the kernel keeps time by the time-stamp counter (`current_clocksource`).
fn kernel_uses_tsc(current_clocksource: &str) -> bool {
    current_clocksource.trim() == "tsc"
}

#[cfg(target_arch = "x86_64")]
fn counter() -> u64 {
    // SAFETY: RDTSC has no preconditions: it reads the time-stamp counter, which every
    // x86_64 CPU has, and touches no memory.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A clock reading and the counter at the same moment. A thread preempted between the two
/// reads (a few µs on a busy VM) would skew the rate by that much over the calibration's
/// 2 ms, so the reading is bracketed by two counter reads, the narrowest of a few tries
/// kept, and the counter taken at the bracket's middle.
#[cfg(target_arch = "x86_64")]
fn clock_and_counter() -> (Instant, u64) {
    let mut best: Option<(u64, Instant, u64)> = None;
    for _ in 0..16 {
        let before = counter();
        let clock = Instant::now();
        let after = counter();
        let width = after.wrapping_sub(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, clock, before.wrapping_add(width / 2)));
        }
    }
    let (_, clock, count) = best.unwrap_or_else(|| (0, Instant::now(), counter()));
    (clock, count)
}

fn choose() -> Source {
    let clock = Source::Clock {
        epoch: Instant::now(),
    };
    #[cfg(target_arch = "x86_64")]
    {
        let path = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
        let tsc = std::fs::read_to_string(path).is_ok_and(|s| kernel_uses_tsc(&s));
        if tsc {
            let (t0, c0) = clock_and_counter();
            while t0.elapsed() < CALIBRATION {
                std::hint::spin_loop();
            }
            let (t1, c1) = clock_and_counter();
            let nanos = u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX);
            if let Some(rate) = Rate::measured(c1.wrapping_sub(c0), nanos) {
                return Source::Counter(rate);
            }
        }
    }
    clock
}

fn source() -> Source {
    *SOURCE.get_or_init(choose)
}

/// Chooses and calibrates this process's source now, so that no transfer pays for it.
pub fn prepare() {
    source();
}

/// Now.
#[inline]
pub fn stamp() -> Stamp {
    match source() {
        #[cfg(target_arch = "x86_64")]
        Source::Counter(_) => Stamp(counter()),
        #[cfg(not(target_arch = "x86_64"))]
        Source::Counter(_) => Stamp(0),
        Source::Clock { epoch } => {
            Stamp(u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
        }
    }
}

/// Nanoseconds from `start` to `end` (0 if `end` is not later).
pub fn nanos_between(start: Stamp, end: Stamp) -> u64 {
    let delta = end.0.saturating_sub(start.0);
    match source() {
        Source::Counter(rate) => rate.nanos(delta),
        Source::Clock { .. } => delta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_converts_ticks_to_nanoseconds() {
        // A 2.5 GHz counter: 0.4 ns a tick.
        let r = Rate::measured(2_500_000_000, 1_000_000_000).expect("rate");
        assert_eq!(r.nanos(2_500), 999); // 0.4 in 32.32 rounds down by a hair
        assert!((r.nanos(25_000_000_000) as i64 - 10_000_000_000).abs() < 10);
        assert_eq!(r.nanos(0), 0);
        assert_eq!(Rate::measured(0, 5), None);
        assert_eq!(Rate::measured(1, u64::MAX), None, "does not fit");
        assert_eq!(Rate(u64::MAX).nanos(u64::MAX), u64::MAX, "saturates");
    }

    #[test]
    fn the_counter_is_used_only_where_the_kernel_keeps_time_by_it() {
        assert!(kernel_uses_tsc("tsc\n"));
        assert!(!kernel_uses_tsc("kvm-clock\n"));
        assert!(!kernel_uses_tsc("hpet"));
    }

    #[test]
    fn stamps_measure_a_sleep() {
        prepare();
        let start = stamp();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let end = stamp();
        let real = u64::try_from(t0.elapsed().as_nanos()).unwrap();
        let measured = nanos_between(start, end);
        // Within 5 % of the clock (plus the two reads' spacing) on any load.
        assert!(measured >= 19_000_000, "{measured} ns for a 20 ms sleep");
        assert!(
            measured.abs_diff(real) < real / 20 + 1_000_000,
            "{measured} ns by stamps, {real} ns by the clock"
        );
        assert_eq!(nanos_between(end, start), 0, "never negative");
    }

    /// The counter's rate is calibrated to within a few parts in 10,000 of the clock, so
    /// figures timed by stamps (a run's operations) and by the clock (its wall time) agree.
    /// Before the readings were bracketed, a 300 ms tebench run timed by stamps ended 0.5 ms
    /// short by the clock in 2 of 3 runs here (a thread preempted between its clock and
    /// counter reads skews the rate).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_counter_agrees_with_the_clock() {
        let Source::Counter(rate) = source() else {
            return; // the kernel does not keep time by the counter here: the clock is used
        };
        let (t0, c0) = clock_and_counter();
        std::thread::sleep(Duration::from_millis(50));
        let (t1, c1) = clock_and_counter();
        let real = u64::try_from((t1 - t0).as_nanos()).unwrap();
        let measured = rate.nanos(c1.wrapping_sub(c0));
        assert!(
            measured.abs_diff(real) * 10_000 < real * 5,
            "{measured} ns by the counter, {real} ns by the clock"
        );
    }
}
