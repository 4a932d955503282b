//! A task's fence: how many pieces of its attempts may still land in memory (a tcp frame
//! written and not yet answered, or queued to be written; an shm copy's jobs not yet
//! ended; rdma work requests posted and not yet completed), and what waits for none to be
//! left. A cancelled or failed task settles (its status shows terminal, its Promise or
//! batch waiters are told) and a failed-over task starts its next attempt only once its
//! fence is clear, so nothing of an abandoned attempt lands after that.
//!
//! A transport holds a [`Landing`] for each such piece and drops it once the piece can no
//! longer write (answered, skipped, or its connection gone). The count and the flag are
//! `SeqCst`: a waiter sets the flag then reads the count, a release lowers the count then
//! reads the flag, so one of the two always sees the other (`Task::fence_released`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::task::Task;

/// The count of pieces in flight and whether something waits for it to reach zero.
#[derive(Default)]
pub(crate) struct Fence {
    landing: AtomicU32,
    waited: AtomicBool,
}

impl Fence {
    /// Marks something waiting (under the task's lock); whether pieces are still in flight.
    pub(crate) fn wait(&self) -> bool {
        self.waited.store(true, Ordering::SeqCst);
        self.landing.load(Ordering::SeqCst) > 0
    }

    /// Whether no piece is in flight.
    pub(crate) fn is_clear(&self) -> bool {
        self.landing.load(Ordering::SeqCst) == 0
    }

    /// Clears the waiting mark (under the task's lock, with the fence clear).
    pub(crate) fn served(&self) {
        self.waited.store(false, Ordering::SeqCst);
    }

    fn hold(&self) {
        self.landing.fetch_add(1, Ordering::SeqCst);
    }

    /// Lowers the count; whether it reached zero with something waiting.
    fn release(&self) -> bool {
        self.landing.fetch_sub(1, Ordering::SeqCst) == 1 && self.waited.load(Ordering::SeqCst)
    }
}

/// What waits for a task's fence: its settling (a cancel or failure decided meanwhile) and
/// its next attempt (a failover).
#[derive(Default)]
pub(crate) struct Deferred {
    pub(crate) settle: bool,
    pub(crate) then: Option<Box<dyn FnOnce() + Send>>,
}

/// How long a free waits for its tasks' fences at most: the attempt deadline, by when a
/// transport has given up on what it still held (a tcp connection with no answer is
/// broken, an rdma endpoint reset), with a margin; 30 s where attempts have no deadline.
pub(crate) fn settle_bound(failover: &crate::failover::FailoverPolicy) -> std::time::Duration {
    let deadline = failover
        .attempt_timeout
        .unwrap_or(std::time::Duration::from_secs(15));
    deadline.saturating_mul(2)
}

/// One piece of a task's attempt that may still land: the task's fence holds until it is
/// dropped.
pub struct Landing {
    task: Arc<Task>,
}

impl Landing {
    /// Holds `task`'s fence.
    pub fn new(task: &Arc<Task>) -> Self {
        task.fence().hold();
        Self { task: task.clone() }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if self.task.fence().release() {
            self.task.fence_released();
        }
    }
}

impl std::fmt::Debug for Landing {
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
    use crate::task::{Counters, Group, Observer, Told};

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
        assert_eq!(task.status(), TransferStatus::Canceled, "transports see the end");
        assert_eq!(task.shown_status(), TransferStatus::Pending, "waiters do not yet");
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
        let no_piece = task.defer_until_fenced(Box::new(|| {}));
        assert!(no_piece.is_err(), "nothing in flight: handed back to run now");
        let (a, b) = (Landing::new(&task), Landing::new(&task));
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let kept = task.defer_until_fenced(Box::new(move || flag.store(true, Ordering::SeqCst)));
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
