//! The shared state of one transfer task. Transports write outcomes into it; status reads
//! (poll or Promise) read it without locks held across transports.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::at_once::AtOnce;
pub use crate::attempt::AttemptState;
use crate::deadlines::{AttemptDeadline, DeadlineKey, Deadlines};
use crate::error::Error;
pub use crate::failover::Observer;
use crate::fence::{Deferred, Fence, Fenced};
use crate::kind::{Kinds, TransportKind};
use crate::lanes::Striped;
use crate::request::ValidatedRequest;
use crate::status::TransferStatus;
use crate::tally::Writer;
use crate::task_slots::Spares;
use crate::ticks::Stamp;
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

/// What `submit_transfer_then` runs once every task of the submission ended.
pub(crate) type Then = Box<dyn FnOnce(&[Arc<Task>]) + Send>;

/// Where a submission's completion hook finds its tasks (filled before they start).
pub(crate) type Holder = Arc<Mutex<Vec<Arc<Task>>>>;

/// The holder a submission's completion hook reads its tasks from.
pub(crate) fn hook(then: Then) -> (Holder, Box<dyn FnOnce() + Send>) {
    let holder: Holder = Arc::default();
    let held = holder.clone();
    let run = Box::new(move || {
        let tasks = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
        then(&tasks);
    });
    (holder, run)
}

/// Who is told when a task ends.
#[derive(Default)]
pub struct Told {
    /// The group of tasks it ends with (the Promise path, a notification's hook).
    pub group: Option<Arc<Group>>,
    /// Its batch's waiters.
    pub wake: Option<Arc<Wake>>,
}

/// One lane's share of the engine's task counters (`lanes.rs`).
#[derive(Debug, Default)]
struct LaneCounts {
    submitted: AtomicU64,
    /// Ended tasks by status, bytes by transport and op. The totals (completed, failed,
    /// bytes) are sums of these, made when read: a task that ends writes two counters,
    /// not four more.
    tasks: crate::metrics::TaskCounters,
    /// Durations of completed tasks, by transport and op.
    latency: crate::latency::LatencyCounters,
}

impl LaneCounts {
    /// Counts a task that ended with `status` (its bytes only if it completed).
    fn ended(
        &self,
        status: TransferStatus,
        transport: Option<TransportKind>,
        opcode: crate::kind::Opcode,
        length: u64,
    ) {
        self.tasks.task_ended(status, transport, opcode, length);
    }
}

/// What the tasks one thread submits share: that thread's lane of the engine's counters,
/// and the engine's failover driver. A task holds its lane, not the engine's counters or
/// the engine itself, so taking and dropping those references writes a cache line only
/// that thread uses.
#[repr(align(128))]
pub struct Lane {
    counts: LaneCounts,
    driver: OnceLock<Link>,
}

/// The driver a lane's tasks report to, and whether their successes are worth reporting
/// (set once any error was recorded: health bookkeeping; until then a success costs no
/// reference to the engine).
struct Link {
    driver: Weak<dyn Driver>,
    successes_matter: Arc<AtomicBool>,
}

/// Engine-wide task counters, bumped as tasks are submitted and end; one set per lane,
/// summed when read.
pub struct Counters {
    lanes: Striped<Arc<Lane>>,
    at_once: AtOnce,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            lanes: Striped::new(|_| {
                Arc::new(Lane {
                    counts: LaneCounts::default(),
                    driver: OnceLock::new(),
                })
            }),
            at_once: AtOnce::default(),
        }
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("completed", &self.completed())
            .field("failed", &self.failed())
            .finish()
    }
}

impl Counters {
    /// Has every lane's tasks report failed attempts to `driver`, and successes too once
    /// `successes_matter` is set. The first call wins.
    pub fn connect(&self, driver: Weak<dyn Driver>, successes_matter: &Arc<AtomicBool>) {
        for lane in self.lanes.iter() {
            let _ = lane.driver.set(Link {
                driver: driver.clone(),
                successes_matter: successes_matter.clone(),
            });
        }
    }

    /// The calling thread's lane, for the tasks it makes.
    pub fn lane(&self) -> Arc<Lane> {
        self.lanes.local().clone()
    }

    /// Counts `n` tasks submitted.
    pub fn submitted(&self, n: u64) {
        self.lanes
            .local()
            .counts
            .submitted
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a request that `transport` completed while it was submitted (no task was
    /// made for it), as [`Task::finish`] counts a completed task.
    pub(crate) fn completed_at_submit(
        &self,
        transport: TransportKind,
        opcode: crate::kind::Opcode,
        length: u64,
    ) {
        self.at_once.completed(transport, opcode, length);
    }

    /// The calling thread's latency histograms of the transfers its submission calls
    /// completed themselves, and how it writes them.
    pub(crate) fn latency_local(&self) -> (&crate::latency::LatencyCounters, Writer) {
        self.at_once.latency_local()
    }

    /// The latency histograms, summed over the lanes.
    pub fn latency(&self) -> crate::latency::LatencyCounters {
        let total = crate::latency::LatencyCounters::default();
        for lane in self.lanes.iter() {
            total.add(&lane.counts.latency);
        }
        self.at_once.add_latency_to(&total);
        total
    }

    /// Tasks submitted.
    pub fn submitted_total(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.counts.submitted.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.at_once.done()
    }

    /// Tasks that completed.
    pub fn completed(&self) -> u64 {
        self.tasks().completed()
    }

    /// Tasks that ended in any other terminal status.
    pub fn failed(&self) -> u64 {
        self.tasks().failed()
    }

    /// Bytes moved by completed tasks.
    pub fn bytes(&self) -> u64 {
        self.tasks().bytes_total()
    }

    /// Ended tasks by status, and their bytes by transport and op, summed over the lanes.
    pub fn tasks(&self) -> crate::metrics::TaskCounters {
        let total = crate::metrics::TaskCounters::default();
        for lane in self.lanes.iter() {
            total.add(&lane.counts.tasks);
        }
        self.at_once.add_tasks_to(&total);
        total
    }
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

    /// Starts `task`'s next attempt on `kind` (a failover whose start waited for the fence).
    fn start_next(&self, _task: &Arc<Task>, _kind: TransportKind) {}

    /// Attempt `attempt` of `task` completed (health bookkeeping).
    fn attempt_succeeded(&self, _task: &Task, _attempt: u32) {}
}

/// What the task's lock guards: the failover bookkeeping, and the current attempt's
/// deadline, removed when the attempt ends.
struct Locked {
    attempt: AttemptState,
    deadline: Option<AttemptDeadline<Task>>,
}

thread_local! {
    /// This thread's emptied task slots, for its next tasks (`task_slots`).
    static SPARES: Spares<Task> = const { Spares::new() };
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
    /// Attempt whose deadline runs from when it starts moving (0 = none): what a
    /// transport's start report (`started`) checks before it takes the lock.
    timed_from_start: AtomicU32,
    state: Mutex<Locked>,
    /// Pieces of its attempts that may still land (`fence`).
    fence: Fence,
    /// Told: its end was counted and its waiters rung (after its fence cleared).
    settled: AtomicBool,
    observer: Observer,
    group: Option<Arc<Group>>,
    /// Rung as the task ends: its batch's waiters (`Engine::wait_batch`).
    wake: Option<Arc<Wake>>,
    /// Its counters and driver.
    lane: Arc<Lane>,
    request: ValidatedRequest,
    /// When the call that submitted it began: its duration runs from there.
    submitted_at: Stamp,
}

impl Fenced for Task {
    fn fence(&self) -> &Fence {
        &self.fence
    }

    fn fence_cleared(&self, deferred: Deferred) {
        if deferred.settle {
            self.settle(self.status());
        }
        if let Some(then) = deferred.then {
            then();
        }
    }
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
    /// A waiting task for `request`, submitted by a call that began at `submitted_at`,
    /// reporting to `group` when it ends; counted in `lane`, whose driver (if connected)
    /// decides what its failed attempts lead to.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        request: ValidatedRequest,
        told: Told,
        lane: Arc<Lane>,
        observer: Observer,
        candidates: Kinds,
        pinned: bool,
        submitted_at: Stamp,
    ) -> Arc<Self> {
        let Told { group, wake } = told;
        let task = Self {
            status: AtomicU8::new(TransferStatus::Waiting.raw()),
            progress: AtomicU64::new(0),
            transferred: AtomicU64::new(0),
            transport: AtomicU8::new(0),
            attempts: AtomicU32::new(0),
            corrupt: AtomicU32::new(0),
            timed_from_start: AtomicU32::new(0),
            state: Mutex::new(Locked {
                attempt: AttemptState {
                    candidates,
                    pinned,
                    ..AttemptState::default()
                },
                deadline: None,
            }),
            fence: Fence::default(),
            settled: AtomicBool::new(false),
            observer,
            group,
            wake,
            lane,
            request,
            submitted_at,
        };
        crate::task_slots::place(&SPARES, task)
    }

    /// Lets `task` go, keeping its memory for this thread's next task when nobody else
    /// holds it (`task_slots`).
    pub(crate) fn recycle(task: Arc<Self>) {
        crate::task_slots::recycle(&SPARES, task);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Locked> {
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

    /// Its status as those who wait on it see it: a cancel or failure decided while
    /// pieces of an attempt may still land shows as pending until they cannot (`fence`).
    pub fn shown_status(&self) -> TransferStatus {
        let s = self.status();
        if s.is_terminal() && !self.settled.load(Ordering::Acquire) {
            TransferStatus::Pending
        } else {
            s
        }
    }

    /// What decides its failed attempts, while the engine lives.
    pub(crate) fn driver(&self) -> Option<Arc<dyn Driver>> {
        self.lane.driver.get().and_then(|l| l.driver.upgrade())
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
        f(&mut self.lock().attempt)
    }

    /// Starts a new attempt on `transport`; returns its number, or `None` if the task is
    /// already terminal.
    pub fn begin_attempt(&self, transport: TransportKind) -> Option<u32> {
        let mut st = self.lock();
        if self.status().is_terminal() {
            return None;
        }
        // The previous attempt's deadline goes with it.
        if let Some(d) = st.deadline.take() {
            d.remove();
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
    pub fn set_deadline(&self, attempt: u32, deadlines: &Arc<Deadlines<Task>>, key: DeadlineKey) {
        let stale = {
            let mut st = self.lock();
            let registered = AttemptDeadline::registered(deadlines, key);
            // An attempt its transport timed from its start meanwhile keeps that timing.
            if self.status().is_terminal()
                || self.attempt() != attempt
                || self.is_timed_from_start(attempt)
            {
                Some(registered)
            } else {
                st.deadline.replace(registered)
            }
        };
        if let Some(d) = stale {
            d.remove();
        }
    }

    /// Has `attempt`'s deadline run from when its bytes start moving: nothing is
    /// registered in `deadlines` until its transport reports the start ([`Task::started`]).
    /// Called before the attempt is handed to its transport.
    pub fn time_from_start(&self, attempt: u32, deadlines: &Arc<Deadlines<Task>>) {
        let mut st = self.lock();
        if self.status().is_terminal() || self.attempt() != attempt {
            return;
        }
        let stale = st.deadline.replace(AttemptDeadline::from_start(deadlines));
        self.timed_from_start.store(attempt, Ordering::Release);
        drop(st);
        if let Some(d) = stale {
            d.remove();
        }
    }

    /// Whether `attempt`'s deadline runs from when its bytes start moving
    /// ([`Task::time_from_start`]).
    pub fn is_timed_from_start(&self, attempt: u32) -> bool {
        self.timed_from_start.load(Ordering::Acquire) == attempt
    }

    /// Declares that `attempt` travels in `shares` shares (one per connection or endpoint
    /// that carries some of it), each reported by [`Task::started`] when it starts
    /// moving. Must precede the first report; without it an attempt is one share.
    pub fn expect_shares(&self, attempt: u32, shares: u32) {
        if self.timed_from_start.load(Ordering::Acquire) != attempt {
            return;
        }
        let mut st = self.lock();
        if self.attempt() != attempt {
            return;
        }
        if let Some(d) = st.deadline.as_mut() {
            d.expect_shares(shares);
        }
    }

    /// Reports that a share of `attempt` started moving at `at`: a transport that reports
    /// starts calls it for the first slice of each share it gives a connection or
    /// endpoint. An attempt timed from its start is registered once the last of its
    /// shares started, to expire the attempt deadline after that: until then part of it
    /// still waits behind other work, whose own deadlines bound that wait. Anything else
    /// is ignored (cheaply, without the lock).
    pub fn started(self: &Arc<Self>, attempt: u32, at: std::time::Instant) {
        if self.timed_from_start.load(Ordering::Acquire) != attempt {
            return;
        }
        let mut st = self.lock();
        if self.status().is_terminal() || self.attempt() != attempt {
            return;
        }
        if let Some(d) = st.deadline.as_mut() {
            d.share_started(self, attempt, at);
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
            self.attempt_failed(attempt, Error::injected("completion reported as failed"));
            return;
        }
        if self.finish(TransferStatus::Completed, None) {
            let link = self.lane.driver.get();
            if let Some(link) = link.filter(|l| l.successes_matter.load(Ordering::Relaxed)) {
                if let Some(driver) = link.driver.upgrade() {
                    driver.attempt_succeeded(self, attempt);
                }
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
            if st.attempt.failed_attempt >= attempt {
                return;
            }
            st.attempt.failed_attempt = attempt;
        }
        match self.lane.driver.get().and_then(|l| l.driver.upgrade()) {
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

    /// Ends the task with an explicit status. A completion settles at once (all of it
    /// landed; a retry waited for its predecessor's pieces), any other end once no piece
    /// of an attempt can land any more (`fence`).
    pub fn finish(&self, status: TransferStatus, error: Option<Error>) -> bool {
        debug_assert!(status.is_terminal());
        let (deadline, now) = {
            let mut st = self.lock();
            if self.status().is_terminal() {
                return false;
            }
            st.attempt.error = error;
            self.status.store(status.raw(), Ordering::SeqCst);
            let wait = status != TransferStatus::Completed && self.fence.defer_settle();
            (st.deadline.take(), !wait)
        };
        if let Some(d) = deadline {
            d.remove();
        }
        if now {
            self.settle(status);
        }
        true
    }

    /// Counts the task's end and tells who waits on it.
    fn settle(&self, status: TransferStatus) {
        self.settled.store(true, Ordering::Release);
        // Counted in the lane of the thread that submitted the task: the one that ends it
        // is most often that thread too (a copy done inline).
        let transport = self.transport();
        let counts = &self.lane.counts;
        counts.ended(status, transport, self.request.opcode, self.request.length);
        if let (TransferStatus::Completed, Some(t)) = (status, transport) {
            let ns = crate::ticks::nanos_between(self.submitted_at, crate::ticks::stamp());
            counts.latency.record(t, self.request.opcode, ns, 1);
        }
        self.request
            .peer
            .series()
            .ended(status, self.request.length);
        if let Some(group) = &self.group {
            group.task_finished();
        }
        if let Some(wake) = &self.wake {
            wake.ring();
        }
    }

    /// Bytes known to have moved (a lower bound while pending), as [`TaskSnapshot::transferred`].
    pub fn transferred(&self) -> u64 {
        self.transferred
            .load(Ordering::Acquire)
            .min(self.request.length)
    }

    /// A consistent-enough view for status reads.
    pub fn snapshot(&self) -> TaskSnapshot {
        let status = self.shown_status();
        let error = if status.is_terminal() && status != TransferStatus::Completed {
            self.lock().attempt.error.clone()
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
        self.lock().attempt.error.clone()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kind::Opcode;

    /// Spare task slots the calling thread holds.
    pub(crate) fn spares() -> usize {
        crate::task_slots::count(&SPARES)
    }

    /// A waiting task of a sample request, and the group it reports to (which it holds).
    pub(crate) fn waiting_task() -> (Arc<Task>, Arc<Group>) {
        waiting_task_of(crate::request::tests::sample())
    }

    /// A waiting task of `request`, and the group it reports to (which it holds).
    pub(crate) fn waiting_task_of(
        request: crate::request::ValidatedRequest,
    ) -> (Arc<Task>, Arc<Group>) {
        let group = Group::new(1, Box::new(|| {}));
        let told = Told {
            group: Some(group.clone()),
            wake: None,
        };
        let lane = Counters::default().lane();
        let task = Task::new(
            request,
            told,
            lane,
            Observer::Poll,
            Kinds::default(),
            false,
            crate::ticks::stamp(),
        );
        (task, group)
    }

    #[test]
    fn counters_kept_in_lanes_add_up_over_every_thread() {
        let counters = Counters::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    counters.submitted(3);
                    let lane = counters.lane();
                    lane.counts.ended(
                        TransferStatus::Completed,
                        Some(TransportKind::Shm),
                        Opcode::Write,
                        4096,
                    );
                    lane.counts.ended(
                        TransferStatus::Completed,
                        Some(TransportKind::Tcp),
                        Opcode::Read,
                        100,
                    );
                    lane.counts
                        .ended(TransferStatus::Failed, None, Opcode::Write, 4096);
                });
            }
        });
        assert_eq!(counters.submitted_total(), 12);
        assert_eq!(counters.completed(), 8);
        assert_eq!(counters.failed(), 4);
        assert_eq!(
            counters.bytes(),
            4 * (4096 + 100),
            "a failed task's bytes not among them"
        );
        let tasks = counters.tasks();
        assert_eq!(tasks.ended(TransferStatus::Completed), 8);
        assert_eq!(tasks.ended(TransferStatus::Failed), 4);
        assert_eq!(tasks.bytes(TransportKind::Shm, Opcode::Write), 4 * 4096);
        assert_eq!(tasks.bytes(TransportKind::Shm, Opcode::Read), 0);
    }

    #[test]
    fn an_attempt_timed_from_its_start_is_registered_once_its_last_share_moves() {
        use std::time::{Duration, Instant};
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        let table = Arc::new(Deadlines::new(epoch, ms(10), ms(100)));
        let (task, _group) = waiting_task();
        let attempt = task.begin_attempt(TransportKind::Tcp).expect("attempt");
        task.time_from_start(attempt, &table);
        task.expect_shares(attempt, 2);
        // A stale attempt's report, and the first of two shares: nothing runs yet.
        task.started(attempt + 1, epoch);
        task.started(attempt, epoch + ms(5));
        assert!(table.is_empty(), "one share still waits behind other work");
        // The second share starts at 2 s: due 100 ms later, not before.
        task.started(attempt, epoch + ms(2000));
        assert_eq!(table.len(), 1);
        assert!(table.expired(epoch + ms(2099)).is_empty());
        assert_eq!(table.expired(epoch + ms(2100)).len(), 1);
        // A next attempt timed from its start drops nothing it does not own, and ending
        // the task removes its registration.
        let next = task.begin_attempt(TransportKind::Tcp).expect("next");
        task.time_from_start(next, &table);
        task.started(next, epoch + ms(3000));
        assert_eq!(table.len(), 1);
        assert!(task.fail(Error::Timeout));
        assert!(table.is_empty(), "an ended task leaves no deadline behind");
    }
}
