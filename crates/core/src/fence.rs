//! A task's fence: how many pieces of its attempts may still land in memory (a tcp frame
//! queued, written and not yet answered; an shm copy's jobs not yet ended; rdma work
//! requests posted and not yet completed), and what waits for none to be left. A cancelled
//! or failed task settles (its status shows terminal, its Promise or batch waiters are
//! told) and a failed-over task starts its next attempt only once its fence is clear, so
//! nothing of an abandoned attempt lands after that.
//!
//! A transport holds a [`Landing`] for each such piece and drops it once the piece can no
//! longer write (answered, skipped, or its connection gone); it takes it before it reads
//! the task's status, and `Task::finish` stores the status `SeqCst` before it reads the
//! count, so one of the two sees the other. A waiter marks itself, then
//! reads the count; a release lowers the count, then reads the mark (all `SeqCst`), so one
//! of the two always sees the other; what waits is taken under the fence's lock, once.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What waits for a fence: a settling (a cancel or failure decided meanwhile) and a next
/// attempt (a failover).
#[derive(Default)]
pub struct Deferred {
    /// The task's end waits to be told.
    pub settle: bool,
    /// Runs once the fence is clear.
    pub then: Option<Box<dyn FnOnce() + Send>>,
}

/// The count of pieces in flight, and what waits for it to reach zero.
#[derive(Default)]
pub struct Fence {
    landing: AtomicU32,
    waited: AtomicBool,
    deferred: Mutex<Deferred>,
}

impl Fence {
    /// Has the owner's settling wait, unless no piece is in flight (`false`: settle now).
    pub(crate) fn defer_settle(&self) -> bool {
        let mut d = self.lock_marked();
        let busy = self.landing.load(Ordering::SeqCst) > 0;
        d.settle |= busy;
        busy
    }

    /// Keeps `then` to run once the fence clears; handed back when no piece is in flight.
    #[allow(clippy::type_complexity)]
    pub(crate) fn defer_then(
        &self,
        then: Box<dyn FnOnce() + Send>,
    ) -> Result<(), Box<dyn FnOnce() + Send>> {
        let mut d = self.lock_marked();
        if self.landing.load(Ordering::SeqCst) == 0 {
            return Err(then);
        }
        d.then = Some(then);
        Ok(())
    }

    /// The lock of what waits, taken with the waiting mark set.
    fn lock_marked(&self) -> std::sync::MutexGuard<'_, Deferred> {
        let d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        self.waited.store(true, Ordering::SeqCst);
        d
    }

    fn hold(&self) {
        self.landing.fetch_add(1, Ordering::SeqCst);
    }

    /// Lowers the count; what waited, if it reached zero with something waiting.
    fn release(&self) -> Option<Deferred> {
        if self.landing.fetch_sub(1, Ordering::SeqCst) != 1 || !self.waited.load(Ordering::SeqCst) {
            return None;
        }
        let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if self.landing.load(Ordering::SeqCst) > 0 {
            return None; // another piece came meanwhile: its release serves the waiters
        }
        self.waited.store(false, Ordering::SeqCst);
        Some(std::mem::take(&mut d))
    }
}

/// What a fence belongs to (a task): it runs what waited once the fence clears.
pub trait Fenced {
    /// Its fence.
    fn fence(&self) -> &Fence;
    /// The fence cleared with `deferred` waiting.
    fn fence_cleared(&self, deferred: Deferred);
}

/// How long a free waits for its tasks' fences at most: twice the attempt deadline, by
/// when a transport has given up on what it still held (a tcp connection with no answer
/// is broken, an rdma endpoint reset); 30 s where attempts have no deadline.
pub(crate) fn settle_bound(attempt_timeout: Option<Duration>) -> Duration {
    attempt_timeout
        .unwrap_or(Duration::from_secs(15))
        .saturating_mul(2)
}

/// One piece of an attempt that may still land: its task's fence holds until it drops.
pub struct Landing<T: Fenced> {
    owner: Arc<T>,
}

impl<T: Fenced> Landing<T> {
    /// Holds `owner`'s fence.
    pub fn new(owner: &Arc<T>) -> Self {
        owner.fence().hold();
        Self {
            owner: owner.clone(),
        }
    }
}

impl<T: Fenced> Drop for Landing<T> {
    fn drop(&mut self) {
        if let Some(deferred) = self.owner.fence().release() {
            self.owner.fence_cleared(deferred);
        }
    }
}

impl<T: Fenced> std::fmt::Debug for Landing<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Landing")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::error::Error;
    use crate::kind::{Kinds, TransportKind};
    use crate::status::TransferStatus;
    use crate::task::{Counters, Group, Observer, Task, Told};

    /// A task that has begun its first attempt, and a flag its group raises when told.
    fn running() -> (Arc<Task>, Arc<AtomicBool>) {
        let told = Arc::new(AtomicBool::new(false));
        let flag = told.clone();
        let group = Group::new(1, Box::new(move || flag.store(true, Ordering::SeqCst)));
        let task = Task::new(
            crate::request::tests::sample(),
            Told {
                group: Some(group),
                wake: None,
            },
            Counters::default().lane(),
            Observer::Progress,
            Kinds::default(),
            false,
            crate::ticks::stamp(),
        );
        assert_eq!(task.begin_attempt(TransportKind::Tcp), Some(1));
        (task, told)
    }

    #[test]
    fn a_cancel_with_a_piece_in_flight_settles_when_the_piece_is_dropped() {
        let (task, told) = running();
        let piece = Landing::new(&task);
        assert!(task.finish(TransferStatus::Canceled, Some(Error::Canceled)));
        assert_eq!(
            task.status(),
            TransferStatus::Canceled,
            "transports see the end"
        );
        assert_eq!(
            task.shown_status(),
            TransferStatus::Pending,
            "waiters do not yet"
        );
        assert_eq!(task.snapshot().status, TransferStatus::Pending);
        assert!(!told.load(Ordering::SeqCst));
        drop(piece);
        assert_eq!(task.shown_status(), TransferStatus::Canceled);
        assert!(told.load(Ordering::SeqCst));
    }

    #[test]
    fn a_cancel_with_nothing_in_flight_settles_at_once() {
        let (task, told) = running();
        drop(Landing::new(&task));
        assert!(task.finish(TransferStatus::Canceled, Some(Error::Canceled)));
        assert_eq!(task.shown_status(), TransferStatus::Canceled);
        assert!(told.load(Ordering::SeqCst));
    }

    #[test]
    fn a_completion_settles_at_once_while_its_last_piece_is_still_held() {
        let (task, told) = running();
        let piece = Landing::new(&task);
        assert!(task.finish(TransferStatus::Completed, None));
        assert_eq!(task.shown_status(), TransferStatus::Completed);
        assert!(told.load(Ordering::SeqCst));
        drop(piece);
    }

    #[test]
    fn a_deferred_next_attempt_runs_only_when_the_last_piece_is_dropped() {
        let (task, _) = running();
        let no_piece = task.fence().defer_then(Box::new(|| {}));
        assert!(
            no_piece.is_err(),
            "nothing in flight: handed back to run now"
        );
        let (a, b) = (Landing::new(&task), Landing::new(&task));
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let kept = task
            .fence()
            .defer_then(Box::new(move || flag.store(true, Ordering::SeqCst)));
        assert!(kept.is_ok());
        drop(a);
        assert!(!ran.load(Ordering::SeqCst), "one piece still in flight");
        drop(b);
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn pieces_dropped_on_other_threads_settle_a_cancel_exactly_once() {
        for _ in 0..200 {
            let (task, told) = running();
            let pieces: Vec<_> = (0..4).map(|_| Landing::new(&task)).collect();
            std::thread::scope(|s| {
                for p in pieces {
                    s.spawn(move || drop(p));
                }
                task.finish(TransferStatus::Canceled, Some(Error::Canceled));
            });
            assert!(told.load(Ordering::SeqCst));
            assert_eq!(task.shown_status(), TransferStatus::Canceled);
        }
    }
}
