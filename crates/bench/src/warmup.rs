//! The end of a case's warm-up, shared by its workers.
//!
//! Each worker arrives once its own warm-up is over, between two operations; the last one
//! to arrive takes the mark (the engine's metrics) that the case's figures count from, and
//! only then do the workers measure. So at the mark no worker is warming up, none measures
//! yet and nothing is in flight: what served a case, its failovers and its notifications
//! exclude the warm-up as its rows do.
//!
//! Waiting is bounded: a waiter re-checks the stop signal every 10 ms, so a worker
//! that failed or was stopped during its warm-up (and never arrives) releases the others
//! within one slice once the gate raised stop.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::gate::StopSignal;

/// Longest single wait before a waiter re-checks stop and the count.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// The warm-up's end for `parties` workers, one case at a time ([`WarmupMark::reset`]).
#[derive(Debug)]
pub struct WarmupMark<T> {
    parties: usize,
    state: Mutex<State<T>>,
    all_warm: Condvar,
}

#[derive(Debug)]
struct State<T> {
    arrived: usize,
    mark: Option<T>,
}

impl<T> WarmupMark<T> {
    /// A mark for `parties` workers (at least one).
    pub fn new(parties: usize) -> Self {
        Self {
            parties: parties.max(1),
            state: Mutex::new(State {
                arrived: 0,
                mark: None,
            }),
            all_warm: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panicking worker cannot leave the count half-written: recover the guard.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a case: nobody arrived, no mark. Call it while no worker runs.
    pub fn reset(&self) {
        let mut s = self.lock();
        s.arrived = 0;
        s.mark = None;
    }

    /// A worker's warm-up is over: the last to arrive takes the mark with `take`. Returns
    /// `true` once every worker arrived, `false` when `stop` was raised first.
    pub fn arrive(&self, stop: &StopSignal, take: impl FnOnce() -> T) -> bool {
        let mut s = self.lock();
        s.arrived += 1;
        if s.arrived == self.parties {
            s.mark = Some(take());
            self.all_warm.notify_all();
            return true;
        }
        while s.arrived < self.parties {
            if stop.is_raised() {
                return false;
            }
            s = match self.all_warm.wait_timeout(s, WAIT_SLICE) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    /// The mark of the case, once every worker arrived; `None` before (or when a worker
    /// never did).
    pub fn take_mark(&self) -> Option<T> {
        self.lock().mark.take()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_last_to_arrive_takes_the_mark_and_releases_the_others() {
        let mark = Arc::new(WarmupMark::new(3));
        let stop = StopSignal::new();
        let waiters: Vec<_> = (0..2)
            .map(|i| {
                let (m, s) = (mark.clone(), stop.clone());
                std::thread::spawn(move || m.arrive(&s, || i))
            })
            .collect();
        // The waiters block until the third arrives (bounded: the joins below end the test).
        let deadline = Instant::now() + Duration::from_secs(20);
        while mark.lock().arrived < 2 {
            assert!(Instant::now() < deadline, "the waiters never arrived");
            std::thread::yield_now();
        }
        assert!(mark.take_mark().is_none(), "no mark before the last");
        assert!(mark.arrive(&stop, || 7));
        for w in waiters {
            assert!(w.join().expect("waiter"));
        }
        assert_eq!(mark.take_mark(), Some(7));
        assert_eq!(mark.take_mark(), None, "taken once");
        mark.reset();
        assert_eq!(mark.lock().arrived, 0);
    }

    #[test]
    fn a_worker_that_never_arrives_releases_the_others_on_stop() {
        let mark: Arc<WarmupMark<u8>> = Arc::new(WarmupMark::new(2));
        let stop = StopSignal::new();
        let (m, s) = (mark.clone(), stop.clone());
        let waiter = std::thread::spawn(move || m.arrive(&s, || 1));
        stop.raise();
        assert!(!waiter.join().expect("waiter"), "released by stop");
        assert!(mark.take_mark().is_none());
    }
}
