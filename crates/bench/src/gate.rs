//! The task gate: N worker threads that each run one task per generation, and a `run` that
//! hands every worker the same task and waits for all of them.
//!
//! One mutex guards the generation, each slot's assigned task, the pending count, the
//! per-slot results, the first failure and the retirement ledger. Two condvars sit beside
//! it: `work` wakes workers (a new generation, or stop), `done` wakes `run` (pending reached
//! zero). Every wait is bounded and re-checks its condition, so a lost wake-up costs at most
//! one wait slice, never a hang, and nothing spins.
//!
//! Invariants:
//! - `run` assigns every slot and sets `pending = N` in one critical section, and its only
//!   wake condition is `pending == 0`;
//! - every assigned slot is retired exactly once per generation, under the mutex, whether
//!   its task ran, failed, or was never dequeued (a worker that finds stop raised while its
//!   slot still holds an un-taken task of the current generation takes and retires it);
//! - the first failure is recorded under the mutex and raises the sticky stop flag; `run`
//!   returns it. A worker that fails after stop was already raised (by [`Gate::stop`], say
//!   for Ctrl-C) records nothing: the run then ends [`RunError::Stopped`] with the results
//!   of the workers that returned normally. Nothing in the gate exits the process.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Duration;

use ferry_core::{TransferStatus, TransportKind};

use crate::sync::{thread, Arc, AtomicBool, Condvar, Mutex, MutexGuard};

/// Longest single condvar wait before a waiter re-checks its condition.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// Why a run ended without results: the first failure of any worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The worker (slot) that failed, when known.
    pub worker: Option<usize>,
    /// Terminal status: FAILED, TIMEOUT, CANCELED or INVALID.
    pub status: TransferStatus,
    /// The engine's stable error code (`ERR_FERRY_*`), when an engine error caused it.
    pub code: Option<String>,
    /// Transport of the failed task's latest attempt, when it had one.
    pub transport: Option<TransportKind>,
    /// The peer's segment name (empty when no peer was involved).
    pub peer: String,
    /// The request (or engine call) that failed.
    pub request: String,
    /// What went wrong, in words.
    pub reason: String,
}

impl Failure {
    /// A failure with `status` and `reason`; the other fields empty.
    pub fn new(status: TransferStatus, reason: impl Into<String>) -> Self {
        Self {
            worker: None,
            status,
            code: None,
            transport: None,
            peer: String::new(),
            request: String::new(),
            reason: reason.into(),
        }
    }

    /// The transport's name, or `-` when none is known.
    pub fn transport_name(&self) -> &'static str {
        self.transport.map_or("-", TransportKind::name)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        if let Some(w) = self.worker {
            write!(f, " in worker {w}")?;
        }
        write!(f, " (transport {}", self.transport_name())?;
        if !self.peer.is_empty() {
            write!(f, ", peer {}", self.peer)?;
        }
        write!(f, "): {}", self.reason)?;
        if let Some(code) = &self.code {
            write!(f, " [{code}]")?;
        }
        if !self.request.is_empty() {
            write!(f, "; request: {}", self.request)?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// Why [`Gate::run`] returned no results.
#[derive(Debug, Clone, PartialEq)]
pub enum RunError<S> {
    /// A worker failed; this is the first failure recorded. The gate is stopped.
    Failed(Failure),
    /// The gate was stopped (by [`Gate::stop`] or before this run) without a failure.
    /// `partial` holds the results of the workers that returned normally, in slot order.
    Stopped {
        /// Results of the workers that finished their task.
        partial: Vec<S>,
    },
}

impl<S> std::fmt::Display for RunError<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(failure) => write!(f, "run failed: {failure}"),
            Self::Stopped { .. } => f.write_str("run stopped"),
        }
    }
}

impl<S: std::fmt::Debug> std::error::Error for RunError<S> {}

/// The gate's sticky stop flag, as seen by worker functions.
///
/// Worker functions that run for a while (benchmark loops) check it between operations
/// and return early once it is raised.
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// A signal that is not raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether stop was raised.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Raises the flag; returns whether this call raised it. Prefer [`Gate::stop`], which
    /// also wakes waiting workers at once (a bare raise is seen within one wait slice).
    pub fn raise(&self) -> bool {
        !self.0.swap(true, Ordering::AcqRel)
    }
}

/// A hook called with the worker's slot index.
pub type Hook = std::sync::Arc<dyn Fn(usize) + Send + Sync>;

/// Pause points for tests: they make races between workers deterministic.
///
/// Hooks run on worker threads with no lock held; they may block (on a channel or a
/// barrier) to hold a worker at that point.
#[derive(Clone, Default)]
pub struct GateHooks {
    /// Called after a worker has seen its task of a new generation and before it takes it
    /// from its slot.
    pub before_dequeue: Option<Hook>,
    /// Called by the worker whose failure raised stop, after the failure is recorded and
    /// the other workers have been woken.
    pub after_stop_raised: Option<Hook>,
}

impl std::fmt::Debug for GateHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateHooks")
            .field("before_dequeue", &self.before_dequeue.is_some())
            .field("after_stop_raised", &self.after_stop_raised.is_some())
            .finish()
    }
}

/// Bookkeeping of the latest generation's retirements (for tests and diagnostics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retirements {
    /// The generation these counts belong to (0 before the first run).
    pub generation: u64,
    /// Times each slot was retired in this generation: exactly 1 once `run` has returned.
    pub retired: Vec<u32>,
    /// Slots retired without their task ever being taken (stop came first).
    pub never_dequeued: Vec<bool>,
    /// Retirements that matched no assigned task, over the gate's life. Always 0 unless
    /// the gate has a bug.
    pub anomalies: u64,
}

struct State<T, S> {
    generation: u64,
    slots: Vec<Option<(u64, T)>>,
    pending: usize,
    results: Vec<Option<S>>,
    failure: Option<Failure>,
    ledger: Retirements,
    /// Set by `stop` once the worker threads are being joined.
    closed: bool,
}

impl<T, S> State<T, S> {
    /// Retires `slot` for `generation`; returns whether pending reached zero.
    fn retire(&mut self, slot: usize, generation: u64, never_dequeued: bool) -> bool {
        let counted = match (
            self.ledger.retired.get_mut(slot),
            self.ledger.never_dequeued.get_mut(slot),
        ) {
            (Some(count), Some(skipped))
                if generation == self.generation && self.pending > 0 && *count == 0 =>
            {
                *count += 1;
                *skipped = never_dequeued;
                true
            }
            _ => false,
        };
        if !counted {
            self.ledger.anomalies += 1;
            return false;
        }
        self.pending -= 1;
        self.pending == 0
    }
}

struct Shared<T, S> {
    state: Mutex<State<T, S>>,
    work: Condvar,
    done: Condvar,
    stop: StopSignal,
    hooks: GateHooks,
}

impl<T, S> Shared<T, S> {
    fn lock(&self) -> MutexGuard<'_, State<T, S>> {
        // A poisoned lock only means a hook panicked while holding no invariant of ours
        // half-updated (every update below is completed before any call out).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(
        &self,
        cv: &Condvar,
        guard: MutexGuard<'a, State<T, S>>,
    ) -> MutexGuard<'a, State<T, S>> {
        match cv.wait_timeout(guard, WAIT_SLICE) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }

    /// Raises stop and wakes every waiter. Taking the lock between the raise and the
    /// notification means no waiter can miss both.
    fn raise_stop(&self) -> bool {
        let raised = self.stop.raise();
        drop(self.lock());
        self.work.notify_all();
        self.done.notify_all();
        raised
    }
}

/// The task function a worker runs: `(slot, task, stop) -> stats or failure`.
pub trait WorkerFn<T, S>: Fn(usize, T, &StopSignal) -> Result<S, Failure> + Send + Sync {}
impl<T, S, F> WorkerFn<T, S> for F where
    F: Fn(usize, T, &StopSignal) -> Result<S, Failure> + Send + Sync
{
}

/// N worker threads driven one generation at a time. See the module docs for the
/// invariants.
///
/// Thread safety: `Gate` is `Send + Sync`; `run` calls are serialized, and `stop` may be
/// called from any thread except a worker's (a worker calling it only raises stop).
/// Resources: `stop` (or dropping the gate) joins every worker thread; a worker function
/// that never returns would block that join, so long-running ones check their
/// [`StopSignal`].
pub struct Gate<T, S> {
    shared: Arc<Shared<T, S>>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
    run_lock: Mutex<()>,
    workers: usize,
}

impl<T, S> std::fmt::Debug for Gate<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("workers", &self.workers)
            .field("stopped", &self.shared.stop.is_raised())
            .finish()
    }
}

impl<T, S> Gate<T, S>
where
    T: Clone + Send + 'static,
    S: Send + 'static,
{
    /// Starts `workers` threads that run `worker_fn` on each task handed to [`Gate::run`].
    ///
    /// # Errors
    /// `InvalidInput` when `workers` is 0; the OS error when a thread cannot be spawned
    /// (threads already started are stopped and joined first).
    pub fn start<F>(workers: usize, worker_fn: F) -> std::io::Result<Self>
    where
        F: WorkerFn<T, S> + 'static,
    {
        Self::start_with_hooks(workers, GateHooks::default(), worker_fn)
    }

    /// [`Gate::start`] with test pause points.
    ///
    /// # Errors
    /// As [`Gate::start`].
    pub fn start_with_hooks<F>(
        workers: usize,
        hooks: GateHooks,
        worker_fn: F,
    ) -> std::io::Result<Self>
    where
        F: WorkerFn<T, S> + 'static,
    {
        if workers == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a gate needs at least one worker",
            ));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                slots: (0..workers).map(|_| None).collect(),
                pending: 0,
                results: (0..workers).map(|_| None).collect(),
                failure: None,
                ledger: Retirements {
                    generation: 0,
                    retired: vec![0; workers],
                    never_dequeued: vec![false; workers],
                    anomalies: 0,
                },
                closed: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            stop: StopSignal::new(),
            hooks,
        });
        let gate = Self {
            shared: shared.clone(),
            threads: Mutex::new(Vec::with_capacity(workers)),
            run_lock: Mutex::new(()),
            workers,
        };
        let worker_fn = Arc::new(worker_fn);
        for slot in 0..workers {
            let (shared, f) = (shared.clone(), worker_fn.clone());
            let handle = thread::Builder::new()
                .name(format!("ferry-bench-{slot}"))
                .spawn(move || worker_loop(&shared, slot, &*f))?;
            gate.threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(handle);
        }
        Ok(gate)
    }

    /// Hands `task` to every worker and waits until each slot is retired.
    ///
    /// Returns every worker's result in slot order.
    ///
    /// # Errors
    /// [`RunError::Failed`] with the first failure when any worker failed (the gate is then
    /// stopped); [`RunError::Stopped`] when the gate was stopped, at once if it already was.
    pub fn run(&self, task: T) -> Result<Vec<S>, RunError<S>> {
        let _serial = self.run_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.shared.lock();
        if self.shared.stop.is_raised() || st.closed {
            return Err(match st.failure.take() {
                Some(f) => RunError::Failed(f),
                None => RunError::Stopped {
                    partial: Vec::new(),
                },
            });
        }
        st.generation += 1;
        let generation = st.generation;
        for slot in st.slots.iter_mut() {
            *slot = Some((generation, task.clone()));
        }
        st.results.iter_mut().for_each(|r| *r = None);
        st.ledger.generation = generation;
        st.ledger.retired.iter_mut().for_each(|c| *c = 0);
        st.ledger.never_dequeued.iter_mut().for_each(|s| *s = false);
        st.pending = self.workers;
        drop(st);
        self.shared.work.notify_all();

        let mut st = self.shared.lock();
        while st.pending != 0 {
            st = self.shared.wait(&self.shared.done, st);
        }
        if let Some(f) = st.failure.take() {
            return Err(RunError::Failed(f));
        }
        let results: Vec<Option<S>> = st.results.iter_mut().map(Option::take).collect();
        if self.shared.stop.is_raised() || results.iter().any(Option::is_none) {
            return Err(RunError::Stopped {
                partial: results.into_iter().flatten().collect(),
            });
        }
        Ok(results.into_iter().flatten().collect())
    }
}

impl<T, S> Gate<T, S> {
    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Whether stop was raised (by [`Gate::stop`] or by a failure).
    pub fn is_stopped(&self) -> bool {
        self.shared.stop.is_raised()
    }

    /// The stop flag that worker functions see.
    pub fn stop_signal(&self) -> StopSignal {
        self.shared.stop.clone()
    }

    /// Retirement bookkeeping of the latest generation.
    pub fn retirements(&self) -> Retirements {
        self.shared.lock().ledger.clone()
    }

    /// Raises stop, wakes everyone and joins every worker thread. Idempotent. A `run` in
    /// progress returns once the workers have retired their slots; later runs return
    /// [`RunError::Stopped`] at once. Called from a worker thread it joins the others only.
    pub fn stop(&self) {
        self.shared.raise_stop();
        self.shared.lock().closed = true;
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        let me = thread::current().id();
        for handle in threads {
            if handle.thread().id() != me {
                // A worker thread only ends by returning: panics in worker functions are
                // caught and turned into failures.
                let _ = handle.join();
            }
        }
    }
}

impl<T, S> Drop for Gate<T, S> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn worker_loop<T, S, F>(shared: &Shared<T, S>, slot: usize, worker_fn: &F)
where
    F: WorkerFn<T, S> + ?Sized,
{
    loop {
        // Wait for a task of the current generation, or for stop.
        {
            let mut st = shared.lock();
            loop {
                let generation = st.generation;
                let assigned = matches!(st.slots.get(slot), Some(Some((g, _))) if *g == generation);
                if shared.stop.is_raised() {
                    if assigned {
                        retire_untaken(shared, st, slot);
                    }
                    return;
                }
                if assigned {
                    break;
                }
                st = shared.wait(&shared.work, st);
            }
        }

        // A panicking hook fails the run like a panicking worker function would.
        let hook_panic = shared
            .hooks
            .before_dequeue
            .as_ref()
            .and_then(|hook| catch_unwind(AssertUnwindSafe(|| hook(slot))).err());

        // Dequeue, re-checking stop under the same mutex. A task left in its slot would
        // keep `run` waiting for good: it is retired untaken (`--cfg ferry_seed="gate"`
        // forgets to, the hang the model must catch).
        let (generation, task) = {
            let mut st = shared.lock();
            if shared.stop.is_raised() {
                #[cfg(not(ferry_seed = "gate"))]
                retire_untaken(shared, st, slot);
                return;
            }
            match st.slots.get_mut(slot).and_then(Option::take) {
                Some(taken) => taken,
                // Only this worker takes from its slot, so it still holds the task.
                None => continue,
            }
        };

        let outcome = match hook_panic {
            Some(panic) => Err(panic_failure(panic.as_ref())),
            None => catch_unwind(AssertUnwindSafe(|| worker_fn(slot, task, &shared.stop)))
                .unwrap_or_else(|panic| Err(panic_failure(panic.as_ref()))),
        };

        let mut raised = false;
        let finished = {
            let mut st = shared.lock();
            match outcome {
                Ok(stats) => {
                    if let Some(r) = st.results.get_mut(slot) {
                        *r = Some(stats);
                    }
                }
                Err(mut failure) => {
                    failure.worker.get_or_insert(slot);
                    if st.failure.is_none() && !shared.stop.is_raised() {
                        st.failure = Some(failure);
                    }
                    raised = shared.stop.raise();
                }
            }
            st.retire(slot, generation, false)
        };
        if raised {
            shared.work.notify_all();
        }
        if finished || raised {
            shared.done.notify_all();
        }
        if raised {
            if let Some(hook) = &shared.hooks.after_stop_raised {
                hook(slot);
            }
        }
    }
}

/// Takes and retires `slot`'s un-taken task of the current generation (stop came first).
fn retire_untaken<T, S>(shared: &Shared<T, S>, mut st: MutexGuard<'_, State<T, S>>, slot: usize) {
    let generation = st.generation;
    let finished = match st.slots.get_mut(slot).and_then(Option::take) {
        Some((g, _task)) if g == generation => st.retire(slot, generation, true),
        _ => false,
    };
    drop(st);
    if finished {
        shared.done.notify_all();
    }
}

fn panic_failure(panic: &(dyn std::any::Any + Send)) -> Failure {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    Failure::new(TransferStatus::Failed, format!("worker panicked: {what}"))
}

/// Loom models of the gate (`npm run test:model`). loom's condvar waits never time out, so
/// a run that relied on a wait slice to notice something would hang here, and loom reports
/// every hang as a deadlock: the models check that no wake-up is ever lost, not only that a
/// lost one costs a slice.
#[cfg(all(test, ferry_loom))]
#[path = "gate_model.rs"]
mod model;
