//! Waiting for tasks to end without polling: a batch's waiters sleep on its `Wake`, and
//! every task of the batch rings it as it ends. Ringing costs a fence and a load while
//! nobody waits, so tasks of batches that are only polled pay (almost) nothing.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Where the waiters of one batch sleep.
#[derive(Debug, Default)]
pub struct Wake {
    waiters: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Wake {
    /// A task ended (its status is stored): wakes the waiters, if any.
    pub fn ring(&self) {
        // Pairs with the fence in `wait_until`: either this load sees the waiter, or the
        // waiter's check sees the status stored before this fence.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv.notify_all();
        }
    }

    /// Whether anyone waits, for a caller that reads it under a lock that every waiter's
    /// `done` check takes too (a batch's entries lock), after making the change that check
    /// looks for: then no fence is needed. A waiter that took that lock before the caller
    /// counted itself before, and the lock orders that count before this read; one that
    /// takes it after sees the change. Pair with [`Wake::wake_all`] once the lock is let go.
    pub fn has_waiters(&self) -> bool {
        self.waiters.load(Ordering::Relaxed) > 0
    }

    /// Wakes every waiter (after [`Wake::has_waiters`] said there were some).
    pub fn wake_all(&self) {
        let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    /// How many threads wait (tests: to act once a waiter is asleep, or about to be).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> u32 {
        self.waiters.load(Ordering::Relaxed)
    }

    /// Sleeps until `done()` holds or `deadline` passes; returns `done()`'s last answer.
    /// `done` is asked under the lock after every wake-up (and once first), so a ring
    /// between the check and the sleep is never missed.
    pub fn wait_until(&self, done: impl Fn() -> bool, deadline: Instant) -> bool {
        let mut held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let finished = loop {
            if done() {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            held = match self.cv.wait_timeout(held, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        };
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        drop(held);
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_waiter_wakes_when_rung_and_gives_up_at_its_deadline() {
        let wake = Arc::new(Wake::default());
        let flag = Arc::new(AtomicBool::new(false));
        // Rung from another thread once the waiter is asleep (or about to be): the flag is
        // set before the ring, as a task's status is stored before it rings.
        let (w, f) = (wake.clone(), flag.clone());
        let ringer = std::thread::spawn(move || {
            while w.waiters.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            f.store(true, Ordering::Release);
            w.ring();
        });
        let far = Instant::now() + Duration::from_secs(30);
        assert!(wake.wait_until(|| flag.load(Ordering::Acquire), far));
        assert!(Instant::now() < far, "woken by the ring, not the deadline");
        ringer.join().expect("ringer");
        assert_eq!(wake.waiters.load(Ordering::Relaxed), 0);
        // Nothing rings: the deadline ends the wait.
        let start = Instant::now();
        assert!(!wake.wait_until(|| false, start + Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));
        // Already done: no sleep at all.
        assert!(wake.wait_until(|| true, start));
    }
}
