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

    /// A backoff for an operation whose wait is expected to take at least `wait` (the
    /// worker's [`RecentWaits::shortest`]; `None` before the first).
    pub fn expecting(wait: Option<Duration>) -> Self {
        let outlasts = wait.is_some_and(|t| t > Self::YIELD_BUDGET);
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

/// The shortest of a worker's last few waits for an operation (from its submission to its
/// end, as the backoff's budget counts): what its next wait takes at least. The shortest, not a mean: a
/// loaded machine only ever lengthens a wait (a preempted poller, a stolen vCPU), and a
/// short operation taken for a long one would sleep and be slowed by its wake-up.
#[derive(Debug, Clone, Default)]
pub struct RecentWaits {
    waits: [Duration; RecentWaits::KEPT],
    len: usize,
    next: usize,
}

impl RecentWaits {
    /// Waits kept.
    pub const KEPT: usize = 8;

    /// Records a wait, forgetting the oldest of [`RecentWaits::KEPT`].
    pub fn record(&mut self, wait: Duration) {
        self.waits[self.next] = wait;
        self.next = (self.next + 1) % Self::KEPT;
        self.len = (self.len + 1).min(Self::KEPT);
    }

    /// The shortest wait kept; `None` before the first.
    pub fn shortest(&self) -> Option<Duration> {
        self.waits[..self.len].iter().min().copied()
    }

    /// What to expect of the next wait ([`Backoff::expecting`]): the shortest kept, except
    /// once every [`RecentWaits::KEPT`] operations, which are waited for as if nothing were
    /// known (`None`, the whole yield budget). Sleeping lengthens a short operation by its
    /// wake-up, so a worker that slept because the machine was loaded for a while would
    /// otherwise keep seeing long waits of its own making; that one finds out.
    pub fn expected(&self) -> Option<Duration> {
        if self.next == 0 {
            return None;
        }
        self.shortest()
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
        for wait in [
            None,
            Some(Duration::from_micros(30)),
            Some(Backoff::YIELD_BUDGET),
        ] {
            let mut b = Backoff::expecting(wait);
            for _ in 0..Backoff::SPINS + Backoff::YIELDS {
                b.next_pause(early);
            }
            assert_eq!(b.next_pause(early), Pause::Yield, "{wait:?}");
        }
    }

    #[test]
    fn recent_waits_are_judged_by_the_shortest_of_the_last_few() {
        let us = Duration::from_micros;
        let mut w = RecentWaits::default();
        assert_eq!(w.shortest(), None);
        w.record(us(400));
        assert_eq!(w.shortest(), Some(us(400)));
        // Slow waits (a loaded machine) do not hide a short one among the last few.
        w.record(us(30));
        for _ in 0..RecentWaits::KEPT - 2 {
            w.record(us(5000));
        }
        assert_eq!(w.shortest(), Some(us(30)));
        // Once it is older than the last few, it is forgotten.
        w.record(us(5000));
        assert_eq!(w.shortest(), Some(us(30)), "the first one went");
        w.record(us(5000));
        assert_eq!(w.shortest(), Some(us(5000)));
    }

    #[test]
    fn one_wait_in_every_few_is_expected_blind() {
        let us = Duration::from_micros;
        let mut w = RecentWaits::default();
        assert_eq!(w.expected(), None, "nothing known yet");
        let mut blind = 0;
        for _ in 0..RecentWaits::KEPT * 3 {
            w.record(us(900));
            match w.expected() {
                None => blind += 1,
                Some(d) => assert_eq!(d, us(900)),
            }
        }
        assert_eq!(blind, 3);
    }
}
