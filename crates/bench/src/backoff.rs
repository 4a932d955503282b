//! How a bench worker waits for its operation: spins, then yields, then sleeps on the
//! batch ([`Backoff`]), pure (the time waited is passed in).

use std::time::Duration;

/// What a poller does before its next poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Busy-wait this many spin-loop hints.
    Spin(u32),
    /// Yield the CPU once.
    Yield,
    /// Sleep.
    Sleep(Duration),
}

/// Polls spinning first: a few short spins, then yields, then sleeps that double up to
/// [`Backoff::MAX_SLEEP`]. Never a tight loop that starves the peer on a small machine.
///
/// A sleep is also capped at [`Backoff::SLEEP_FRACTION`] of the time already waited, so
/// that a poller oversleeps a completion by at most about that fraction of the operation
/// (plus the OS timer slack) instead of up to a whole `MAX_SLEEP`: that keeps measured
/// operation times and bandwidth honest for operations of a few hundred microseconds.
///
/// Yielding through the budget is for operations that end within it: one whose worker's
/// operations take longer ([`Backoff::expecting`]) would yield the whole budget away and
/// still sleep, and on a small machine those yields take the CPU from the transport's
/// threads that move its bytes (a tcp READ's receiving I/O thread, its target's sending
/// one), so it sleeps on its batch right after the fixed spins and yields.
#[derive(Debug, Clone)]
pub struct Backoff {
    step: u32,
    /// Keep yielding until the operation has waited this long: [`Backoff::YIELD_BUDGET`],
    /// or none for operations expected to outlast it.
    yield_budget: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            step: 0,
            yield_budget: Self::YIELD_BUDGET,
        }
    }
}

impl Backoff {
    /// Polls that spin.
    pub const SPINS: u32 = 6;
    /// Polls that yield, after the spins.
    pub const YIELDS: u32 = 16;
    /// Keep yielding (instead of sleeping) until the operation has waited this long: a
    /// sleep costs at least the OS timer slack (50 µs on Linux), longer than a whole
    /// small transfer, while a yield still hands the CPU to any thread that needs it.
    pub const YIELD_BUDGET: Duration = Duration::from_micros(200);
    /// First sleep.
    pub const MIN_SLEEP: Duration = Duration::from_micros(8);
    /// Longest sleep.
    pub const MAX_SLEEP: Duration = Duration::from_millis(1);
    /// A sleep is at most `waited / SLEEP_FRACTION` (but never below `MIN_SLEEP`).
    pub const SLEEP_FRACTION: u32 = 8;

    /// Starts again from spinning.
    pub fn reset(&mut self) {
        self.step = 0;
    }

    /// A backoff for an operation expected to take about `typical` (the worker's recent
    /// operations, [`typical_after`]; `None` before the first).
    pub fn expecting(typical: Option<Duration>) -> Self {
        let outlasts = typical.is_some_and(|t| t > Self::YIELD_BUDGET);
        Self {
            step: 0,
            yield_budget: if outlasts {
                Duration::ZERO
            } else {
                Self::YIELD_BUDGET
            },
        }
    }

    /// The pause before the next poll, `waited` after the operation started.
    pub fn next_pause(&mut self, waited: Duration) -> Pause {
        let step = self.step;
        self.step = self.step.saturating_add(1);
        if step < Self::SPINS {
            return Pause::Spin(1 << (step + 2));
        }
        if step < Self::SPINS + Self::YIELDS || waited < self.yield_budget {
            return Pause::Yield;
        }
        let doublings = step.saturating_sub(Self::SPINS + Self::YIELDS).min(16);
        let doubled = Self::MIN_SLEEP
            .saturating_mul(1 << doublings)
            .min(Self::MAX_SLEEP);
        let share = (waited / Self::SLEEP_FRACTION).max(Self::MIN_SLEEP);
        Pause::Sleep(doubled.min(share))
    }

    /// Waits before the next poll, `waited` after the operation started.
    pub fn wait(&mut self, waited: Duration) {
        match self.next_pause(waited) {
            Pause::Spin(n) => (0..n).for_each(|_| std::hint::spin_loop()),
            Pause::Yield => std::thread::yield_now(),
            Pause::Sleep(d) => std::thread::sleep(d),
        }
    }
}

/// The worker's typical operation time after one that took `took`: a moving average that
/// moves an eighth of the way to each new operation (the first sets it).
pub fn typical_after(typical: Option<Duration>, took: Duration) -> Duration {
    match typical {
        None => took,
        Some(t) => t - t / 8 + took / 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_then_yields_then_sleeps_up_to_a_millisecond() {
        let long = Duration::from_secs(1);
        let mut b = Backoff::default();
        let pauses: Vec<Pause> = (0..60).map(|_| b.next_pause(long)).collect();
        let spins = pauses
            .iter()
            .filter(|p| matches!(p, Pause::Spin(_)))
            .count();
        let yields = pauses.iter().filter(|p| **p == Pause::Yield).count();
        assert_eq!(spins, Backoff::SPINS as usize);
        assert_eq!(yields, Backoff::YIELDS as usize);
        assert!(pauses[..spins + yields]
            .iter()
            .all(|p| !matches!(p, Pause::Sleep(_))));
        let sleeps: Vec<Duration> = pauses
            .iter()
            .filter_map(|p| match p {
                Pause::Sleep(d) => Some(*d),
                _ => None,
            })
            .collect();
        assert_eq!(sleeps.len(), 60 - spins - yields, "sleeps only after that");
        assert_eq!(sleeps[0], Backoff::MIN_SLEEP);
        assert_eq!(sleeps[1], Backoff::MIN_SLEEP * 2);
        assert!(sleeps.windows(2).all(|w| w[1] >= w[0]), "never shrinks");
        assert_eq!(*sleeps.last().expect("sleeps"), Backoff::MAX_SLEEP);
        // Far past the schedule it still sleeps the maximum, never spins again.
        b.step = u32::MAX - 1;
        assert_eq!(b.next_pause(long), Pause::Sleep(Backoff::MAX_SLEEP));
        assert_eq!(b.next_pause(long), Pause::Sleep(Backoff::MAX_SLEEP));
        b.reset();
        assert_eq!(b.next_pause(long), Pause::Spin(4));
    }

    #[test]
    fn backoff_sleeps_at_most_an_eighth_of_the_time_waited() {
        let mut b = Backoff {
            step: Backoff::SPINS + Backoff::YIELDS + 10,
            ..Backoff::default()
        };
        assert_eq!(
            b.next_pause(Duration::from_micros(400)),
            Pause::Sleep(Duration::from_micros(50))
        );
        // Within the yield budget it yields instead of paying the timer slack of a sleep.
        assert_eq!(b.next_pause(Duration::from_micros(10)), Pause::Yield);
        assert_eq!(
            b.next_pause(Duration::from_micros(240)),
            Pause::Sleep(Duration::from_micros(30))
        );
        assert_eq!(
            b.next_pause(Duration::from_secs(10)),
            Pause::Sleep(Backoff::MAX_SLEEP)
        );
    }
    #[test]
    fn operations_that_outlast_the_yield_budget_sleep_after_the_fixed_yields() {
        // A worker whose operations take longer than the yield budget: yielding through the
        // budget would not see the end, and takes the CPU the transport's threads need.
        let mut b = Backoff::expecting(Some(Backoff::YIELD_BUDGET * 2));
        let early = Duration::from_micros(20);
        let pauses: Vec<Pause> = (0..Backoff::SPINS + Backoff::YIELDS + 1)
            .map(|_| b.next_pause(early))
            .collect();
        let fixed = (Backoff::SPINS + Backoff::YIELDS) as usize;
        assert!(pauses[..fixed]
            .iter()
            .all(|p| !matches!(p, Pause::Sleep(_))));
        assert_eq!(pauses[fixed], Pause::Sleep(Backoff::MIN_SLEEP));
    }

    #[test]
    fn short_or_unknown_operations_keep_yielding_through_the_budget() {
        let early = Duration::from_micros(20);
        for typical in [
            None,
            Some(Duration::from_micros(30)),
            Some(Backoff::YIELD_BUDGET),
        ] {
            let mut b = Backoff::expecting(typical);
            for _ in 0..Backoff::SPINS + Backoff::YIELDS {
                b.next_pause(early);
            }
            assert_eq!(b.next_pause(early), Pause::Yield, "{typical:?}");
        }
    }

    #[test]
    fn the_typical_operation_follows_recent_ones_smoothly() {
        let us = Duration::from_micros;
        assert_eq!(typical_after(None, us(400)), us(400));
        assert_eq!(typical_after(Some(us(400)), us(400)), us(400));
        // One slow operation moves it an eighth of the way.
        assert_eq!(typical_after(Some(us(400)), us(1200)), us(500));
        // A run of short ones brings it down below the budget.
        let mut t = Some(us(1000));
        for _ in 0..40 {
            t = Some(typical_after(t, us(30)));
        }
        assert!(t.expect("typical") < Backoff::YIELD_BUDGET);
    }
}
