//! The shared state of one transfer task. Transports write outcomes into it; status reads
//! (poll or Promise) read it without locks held across transports.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::request::ValidatedRequest;
use crate::status::TransferStatus;
use crate::transport::TransportKind;

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

/// Engine-wide task counters, bumped as tasks end.
#[derive(Debug, Default)]
pub struct Counters {
    /// Tasks that completed.
    pub completed: AtomicU64,
    /// Tasks that ended in any other terminal status.
    pub failed: AtomicU64,
    /// Bytes moved by completed tasks.
    pub bytes: AtomicU64,
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

/// One transfer task.
pub struct Task {
    status: AtomicU8,
    transferred: AtomicU64,
    slices_left: AtomicU32,
    transport: AtomicU8,
    attempts: AtomicU32,
    error: Mutex<Option<Error>>,
    group: Option<Arc<Group>>,
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
        Arc::new(Self {
            status: AtomicU8::new(TransferStatus::Waiting.raw()),
            transferred: AtomicU64::new(0),
            slices_left: AtomicU32::new(0),
            transport: AtomicU8::new(0),
            attempts: AtomicU32::new(0),
            error: Mutex::new(None),
            group,
            counters,
            request,
        })
    }

    /// The request this task carries out.
    pub fn request(&self) -> &ValidatedRequest {
        &self.request
    }

    /// Current status.
    pub fn status(&self) -> TransferStatus {
        TransferStatus::from_raw(i64::from(self.status.load(Ordering::Acquire)))
    }

    /// Starts an attempt on `transport` that will complete in `slices` slices.
    /// Returns false (and changes nothing) if the task is already terminal.
    pub fn begin_attempt(&self, transport: TransportKind, slices: u32) -> bool {
        let _guard = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if self.status().is_terminal() {
            return false;
        }
        self.transport.store(transport as u8, Ordering::Release);
        self.attempts.fetch_add(1, Ordering::AcqRel);
        self.transferred.store(0, Ordering::Release);
        self.slices_left.store(slices.max(1), Ordering::Release);
        self.status
            .store(TransferStatus::Pending.raw(), Ordering::Release);
        true
    }

    /// Records one finished slice of `bytes`; the last one completes the task.
    pub fn slice_done(&self, bytes: u64) {
        self.transferred.fetch_add(bytes, Ordering::AcqRel);
        if self.slices_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish(TransferStatus::Completed, None);
        }
    }

    /// Ends the task with `error` (its status follows from the error's kind).
    pub fn fail(&self, error: Error) -> bool {
        self.finish(error.status(), Some(error))
    }

    /// Ends the task with an explicit status.
    pub fn finish(&self, status: TransferStatus, error: Option<Error>) -> bool {
        debug_assert!(status.is_terminal());
        {
            let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
            if self.status().is_terminal() {
                return false;
            }
            *slot = error;
            self.status.store(status.raw(), Ordering::Release);
        }
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
        true
    }

    /// A consistent-enough view for status reads.
    pub fn snapshot(&self) -> TaskSnapshot {
        let status = self.status();
        let error = if status.is_terminal() && status != TransferStatus::Completed {
            self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
        } else {
            None
        };
        TaskSnapshot {
            status,
            transferred: self
                .transferred
                .load(Ordering::Acquire)
                .min(self.request.length),
            length: self.request.length,
            transport: TransportKind::from_raw(self.transport.load(Ordering::Acquire)),
            attempts: self.attempts.load(Ordering::Acquire),
            error,
        }
    }

    /// The error, if the task ended without completing.
    pub fn error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
