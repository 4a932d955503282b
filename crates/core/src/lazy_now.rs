//! The time of one call, read from the clock only if something in the call needs it.
//!
//! A submission needs the time for two things that most calls never reach: attempt
//! deadlines (registered only for an attempt still running once its transport took it; a
//! same-host copy is done by then) and paused rails (asked only once a failure was ever
//! recorded). A clock read costs 25–35 ns on these VMs, a few percent of a 4 KiB shm op.

use std::cell::Cell;
use std::time::Instant;

/// The call's time, taken at the first [`LazyNow::get`] and the same for every later one.
#[derive(Debug, Default)]
pub(crate) struct LazyNow(Cell<Option<Instant>>);

impl LazyNow {
    /// Not read yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The call's time: the clock now on the first call, that same instant afterwards.
    pub(crate) fn get(&self) -> Instant {
        match self.0.get() {
            Some(t) => t,
            None => {
                let t = Instant::now();
                self.0.set(Some(t));
                t
            }
        }
    }

    /// Whether the clock was read.
    #[cfg(test)]
    pub(crate) fn was_read(&self) -> bool {
        self.0.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_read_once_on_first_use_and_the_answer_kept() {
        let now = LazyNow::new();
        assert!(!now.was_read());
        let before = Instant::now();
        let first = now.get();
        assert!(now.was_read());
        assert!(first >= before);
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(now.get(), first, "the same instant for the whole call");
    }
}
