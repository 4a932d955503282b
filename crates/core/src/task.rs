//! The shared state of one transfer task. Transports write outcomes into it; status reads
//! (poll or Promise) read it without locks held across transports.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::Error;
use crate::failover::{DeadlineKey, Deadlines};
use crate::kind::{Kinds, TransportKind};
use crate::request::ValidatedRequest;
use crate::status::TransferStatus;
use crate::wake::Wake;

/// Runs once when every task of a group is terminal (the Promise path).
pub struct Group {
    remaining: AtomicUsize,
    on_done: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Group {
    /// A group that waits for `tasks` tasks, then calls `on_done` once.
    pub fn new(tasks: usize, on_done: Box<dyn FnOnce() + Send>) -> Arc<Self> {
        Arc::new(Self {
            remaining: AtomicUsize::new(tasks),
            on_done: Mutex::new(Some(on_done)),
        })
    }

    fn task_finished(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let done = self
                .on_done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(done) = done {
                done();
            }
        }
    }
}

/// Who is told when a task ends.
#[derive(Default)]
pub struct Told {
    /// The group of tasks it ends with (the Promise path, a notification's hook).
    pub group: Option<Arc<Group>>,
    /// Its batch's waiters.
    pub wake: Option<Arc<Wake>>,
}

/// Engine-wide task counters, bumped as tasks end.
#[derive(Debug, Default)]
pub struct Counters {
    /// Tasks that completed.
    pub completed: AtomicU64,
    /// Tasks that ended in any other terminal status.
    pub failed: AtomicU64,
    /// Bytes moved by completed tasks.
    pub bytes: AtomicU64,
    /// Ended tasks by status, and their bytes by transport and op.
    pub tasks: crate::metrics::TaskCounters,
}

/// A point-in-time view of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSnapshot {
    /// Status.
    pub status: TransferStatus,
    /// Bytes known to have moved (a lower bound while pending).
    pub transferred: u64,
    /// Requested length.
    pub length: u64,
    /// Transport of the latest attempt.
    pub transport: Option<TransportKind>,
    /// Attempts made so far.
    pub attempts: u32,
    /// Why it did not complete.
    pub error: Option<Error>,
}

/// Decides what happens when an attempt fails (the engine's failover logic).
pub trait Driver: Send + Sync {
    /// Attempt `attempt` of `task` failed with `error`; retry elsewhere or end the task.
    fn attempt_failed(&self, task: &Arc<Task>, attempt: u32, error: Error);

    /// Attempt `attempt` of `task` completed (health bookkeeping).
    fn attempt_succeeded(&self, _task: &Task, _attempt: u32) {}
}

/// How a task is observed, which decides whether failover may run for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observer {
    /// Submitted to a batch and polled (`enableAutoFailoverOnPoll` governs failover).
    Poll,
    /// Awaited through the Promise path (always fails over while the budget lasts).
    Progress,
}

/// Per-task failover bookkeeping, guarded by the task's lock.
#[derive(Debug, Default)]
pub struct AttemptState {
    /// Why the task did not complete (set when it ends).
    pub error: Option<Error>,
    /// Ranked transports this task may use.
    pub candidates: Kinds,
    /// Whether fallback is forbidden (`requireTransport`).
    pub pinned: bool,
    /// Switches made so far.
    pub switches: u32,
    /// The last attempt whose failure was handled (first failure of an attempt wins).
    pub failed_attempt: u32,
    /// The current attempt's registered deadline, removed when the attempt ends.
    deadline: Option<(Arc<Deadlines>, DeadlineKey)>,
}

/// One transfer task.
///
/// Each attempt has a number; slices carry it, and completions or failures of an attempt
/// that is no longer current are ignored, so a late reply from a transport that was failed
/// over can never complete (or fail) the task's new attempt.
pub struct Task {
    status: AtomicU8,
    /// Current attempt (high 32 bits) and its slices still outstanding (low 32 bits).
    progress: AtomicU64,
    transferred: AtomicU64,
    transport: AtomicU8,
    attempts: AtomicU32,
    /// Attempt whose completion the fault layer turns into a failure (0 = none).
    corrupt: AtomicU32,
    state: Mutex<AttemptState>,
    observer: Observer,
    driver: Option<Weak<dyn Driver>>,
    group: Option<Arc<Group>>,
    /// Rung as the task ends: its batch's waiters (`Engine::wait_batch`).
    wake: Option<Arc<Wake>>,
    counters: Arc<Counters>,
    request: ValidatedRequest,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("status", &self.status())
            .field("length", &self.request.length)
            .finish()
    }
}

impl Task {
    /// A waiting task for `request`, reporting to `group` when it ends.
    pub fn new(
        request: ValidatedRequest,
        group: Option<Arc<Group>>,
        counters: Arc<Counters>,
    ) -> Arc<Self> {
        Self::with_driver(
            request,
            Told { group, wake: None },
            counters,
            Observer::Progress,
            None,
            Kinds::new(),
            false,
        )
    }

    /// A task whose failed attempts go to `driver`.
    pub fn with_driver(
        request: ValidatedRequest,
        told: Told,
        counters: Arc<Counters>,
        observer: Observer,
        driver: Option<Weak<dyn Driver>>,
        candidates: Kinds,
        pinned: bool,
    ) -> Arc<Self> {
        let Told { group, wake } = told;
        Arc::new(Self {
            status: AtomicU8::new(TransferStatus::Waiting.raw()),
            progress: AtomicU64::new(0),
            transferred: AtomicU64::new(0),
            transport: AtomicU8::new(0),
            attempts: AtomicU32::new(0),
            corrupt: AtomicU32::new(0),
            state: Mutex::new(AttemptState {
                candidates,
                pinned,
                ..AttemptState::default()
            }),
            observer,
            driver,
            group,
            wake,
            counters,
            request,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The request this task carries out.
    pub fn request(&self) -> &ValidatedRequest {
        &self.request
    }

    /// How the task is observed.
    pub fn observer(&self) -> Observer {
        self.observer
    }

    /// Current status.
    pub fn status(&self) -> TransferStatus {
        TransferStatus::from_raw(i64::from(self.status.load(Ordering::Acquire)))
    }

    /// The current attempt number (0 before the first).
    pub fn attempt(&self) -> u32 {
        self.attempts.load(Ordering::Acquire)
    }

    /// Transport of the current attempt.
    pub fn transport(&self) -> Option<TransportKind> {
        TransportKind::from_raw(self.transport.load(Ordering::Acquire))
    }

    /// Runs `f` on the failover bookkeeping.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut AttemptState) -> R) -> R {
        f(&mut self.lock())
    }

    /// Starts a new attempt on `transport`; returns its number, or `None` if the task is
    /// already terminal.
    pub fn begin_attempt(&self, transport: TransportKind) -> Option<u32> {
        let mut st = self.lock();
        if self.status().is_terminal() {
            return None;
        }
        // The previous attempt's deadline goes with it.
        if let Some((d, k)) = st.deadline.take() {
            d.remove(k);
        }
        let attempt = self.attempts.fetch_add(1, Ordering::AcqRel) + 1;
        self.transport.store(transport as u8, Ordering::Release);
        self.transferred.store(0, Ordering::Release);
        self.progress
            .store(u64::from(attempt) << 32, Ordering::Release);
        self.status
            .store(TransferStatus::Pending.raw(), Ordering::Release);
        Some(attempt)
    }

    /// Records the deadline registered for `attempt`, which the task removes from
    /// `deadlines` when that attempt ends (the task ends or moves to another attempt). One
    /// that comes too late — the task ended, or began another attempt — is removed at once.
    pub fn set_deadline(&self, attempt: u32, deadlines: &Arc<Deadlines>, key: DeadlineKey) {
        let stale = {
            let mut st = self.lock();
            if self.status().is_terminal() || self.attempt() != attempt {
                Some((deadlines.clone(), key))
            } else {
                st.deadline.replace((deadlines.clone(), key))
            }
        };
        if let Some((d, k)) = stale {
            d.remove(k);
        }
    }

    /// Declares that `attempt` completes after `slices` slices. Must precede any slice.
    pub fn expect_slices(&self, attempt: u32, slices: u32) {
        let _ = self.progress.compare_exchange(
            u64::from(attempt) << 32,
            (u64::from(attempt) << 32) | u64::from(slices.max(1)),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Has the fault layer turn a completion of `attempt` into a failure.
    pub fn corrupt_completion_of(&self, attempt: u32) {
        self.corrupt.store(attempt, Ordering::Release);
    }

    /// Records one finished slice of `attempt`; the last one completes the attempt.
    pub fn slice_done(self: &Arc<Self>, attempt: u32, bytes: u64) {
        let mut cur = self.progress.load(Ordering::Acquire);
        loop {
            let (a, left) = ((cur >> 32) as u32, cur as u32);
            if a != attempt || left == 0 {
                return; // a stale attempt, or already done
            }
            let next = (cur & !0xFFFF_FFFF) | u64::from(left - 1);
            match self.progress.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.transferred.fetch_add(bytes, Ordering::AcqRel);
                    if left == 1 {
                        self.attempt_succeeded(attempt);
                    }
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn attempt_succeeded(self: &Arc<Self>, attempt: u32) {
        if self.corrupt.load(Ordering::Acquire) == attempt {
            self.attempt_failed(
                attempt,
                Error::Io(format!(
                    "{}completion reported as failed",
                    crate::transports::fault::INJECTED
                )),
            );
            return;
        }
        if self.finish(TransferStatus::Completed, None) {
            if let Some(driver) = self.driver.as_ref().and_then(Weak::upgrade) {
                driver.attempt_succeeded(self, attempt);
            }
        }
    }

    /// Reports that `attempt` failed. Ignored for stale attempts and for every failure of
    /// an attempt after the first; otherwise the driver decides (fail over or end).
    pub fn attempt_failed(self: &Arc<Self>, attempt: u32, error: Error) {
        if self.attempt() != attempt || self.status().is_terminal() {
            return;
        }
        {
            let mut st = self.lock();
            if st.failed_attempt >= attempt {
                return;
            }
            st.failed_attempt = attempt;
        }
        match self.driver.as_ref().and_then(Weak::upgrade) {
            Some(driver) => driver.attempt_failed(self, attempt, error),
            None => {
                self.fail(error);
            }
        }
    }

    /// Ends the task with `error` (its status follows from the error's kind).
    pub fn fail(&self, error: Error) -> bool {
        self.finish(error.status(), Some(error))
    }

    /// Ends the task with an explicit status.
    pub fn finish(&self, status: TransferStatus, error: Option<Error>) -> bool {
        debug_assert!(status.is_terminal());
        let deadline = {
            let mut st = self.lock();
            if self.status().is_terminal() {
                return false;
            }
            st.error = error;
            self.status.store(status.raw(), Ordering::Release);
            st.deadline.take()
        };
        if let Some((d, k)) = deadline {
            d.remove(k);
        }
        self.counters.tasks.task_ended(
            status,
            self.transport(),
            self.request.opcode,
            self.request.length,
        );
        if status == TransferStatus::Completed {
            self.counters.completed.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes
                .fetch_add(self.request.length, Ordering::Relaxed);
        } else {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(group) = &self.group {
            group.task_finished();
        }
        if let Some(wake) = &self.wake {
            wake.ring();
        }
        true
    }

    /// Bytes known to have moved (a lower bound while pending), as [`TaskSnapshot::transferred`].
    pub fn transferred(&self) -> u64 {
        self.transferred
            .load(Ordering::Acquire)
            .min(self.request.length)
    }

    /// A consistent-enough view for status reads.
    pub fn snapshot(&self) -> TaskSnapshot {
        let status = self.status();
        let error = if status.is_terminal() && status != TransferStatus::Completed {
            self.lock().error.clone()
        } else {
            None
        };
        TaskSnapshot {
            status,
            transferred: self.transferred(),
            length: self.request.length,
            transport: TransportKind::from_raw(self.transport.load(Ordering::Acquire)),
            attempts: self.attempts.load(Ordering::Acquire),
            error,
        }
    }

    /// The error, if the task ended without completing.
    pub fn error(&self) -> Option<Error> {
        self.lock().error.clone()
    }
}
