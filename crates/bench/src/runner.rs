//! A bench: a gate of benchmark workers on one engine that runs whole cases and reports
//! each as a [`CaseReport`] — the row, the failure, what served it and when it ended.
//!
//! This is what a front end (the Node binding, a CLI) drives: it owns the defaults (thread
//! bounds, the stall timeout) and the thread a case runs on off the caller's thread, so
//! that a binding only converts values.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ferry_core::metrics::Metrics;
use ferry_core::{Engine, Error};

use crate::gate::{Failure, GateHooks, RunError};
use crate::report::ReportRow;
use crate::served::Served;
use crate::warmup::WarmupMark;
use crate::worker::{run_worker_marked, BenchGate, BenchSpec, WorkerStats};

/// Most worker threads one bench takes.
pub const MAX_THREADS: usize = 1024;

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseOutcome {
    /// Every worker ran its time.
    Ok,
    /// A worker failed: [`CaseReport::failure`] says how. The bench is stopped.
    Failed,
    /// The bench was stopped (Ctrl-C) before every worker finished.
    Stopped,
}

impl CaseOutcome {
    /// `ok`, `failed` or `stopped`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }
}

/// One case's result.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseReport {
    /// How it ended.
    pub outcome: CaseOutcome,
    /// The row: for `Ok`, and for `Stopped` only when measured operations exist (an
    /// interrupt during warm-up gives no row rather than a row of zeros).
    pub row: Option<ReportRow>,
    /// The first failure, for `Failed`.
    pub failure: Option<Failure>,
    /// Transports that moved the case's bytes, its failovers and notifications, counted
    /// from the end of its warm-up (from its start when it was stopped before).
    pub served: Served,
    /// When the first worker failed, ms since the Unix epoch (comparable with a fault
    /// injected by another process).
    pub first_failure_at_ms: Option<u64>,
    /// When the last worker ended (every request of the case had its terminal status),
    /// ms since the Unix epoch.
    pub ended_at_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A gate of `threads` benchmark workers on `engine`, run one case at a time.
pub struct Bench {
    gate: Arc<BenchGate>,
    engine: Engine,
    threads: usize,
    /// ms since the epoch of the running case's first failure; 0 = none yet.
    first_failure: Arc<AtomicU64>,
    /// The engine's metrics when the running case's warm-up ended.
    warm: Arc<WarmupMark<Metrics>>,
}

impl Bench {
    /// Starts `threads` (1..=[`MAX_THREADS`]) worker threads on `engine`.
    ///
    /// # Errors
    /// `InvalidArgument` for a thread count out of bounds, `Closed` for a closed engine,
    /// an I/O error when a thread cannot be started.
    pub fn start(engine: Engine, threads: usize) -> Result<Self, Error> {
        if threads == 0 || threads > MAX_THREADS {
            return Err(Error::InvalidArgument(format!(
                "threads must be in 1..={MAX_THREADS}, got {threads}"
            )));
        }
        if engine.is_closed() {
            return Err(Error::Closed);
        }
        let first_failure = Arc::new(AtomicU64::new(0));
        let warm = Arc::new(WarmupMark::new(threads));
        let (worker_engine, first, mark) = (engine.clone(), first_failure.clone(), warm.clone());
        let gate = BenchGate::start_with_hooks(
            threads,
            GateHooks::default(),
            move |slot, spec: BenchSpec, stop| {
                let warmed = |stop: &_| mark.arrive(stop, || worker_engine.metrics());
                let result = run_worker_marked(&worker_engine, slot, &spec, stop, warmed);
                if result.is_err() {
                    // Only the first failure of the case sets it.
                    let _ =
                        first.compare_exchange(0, now_ms(), Ordering::AcqRel, Ordering::Acquire);
                }
                result
            },
        )
        .map_err(|e| Error::Io(format!("start bench workers: {e}")))?;
        Ok(Self {
            gate: Arc::new(gate),
            engine,
            threads,
            first_failure,
            warm,
        })
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs one case on every worker and waits for it.
    pub fn run_case(&self, spec: BenchSpec) -> CaseReport {
        run_case(&self.shared(), self.threads, spec)
    }

    /// Runs one case on a thread of its own and hands the report to `done` there.
    ///
    /// # Errors
    /// When the thread cannot be started (`done` is then dropped uncalled).
    pub fn spawn_case(
        &self,
        spec: BenchSpec,
        done: impl FnOnce(CaseReport) + Send + 'static,
    ) -> Result<(), Error> {
        let (shared, threads) = (self.shared(), self.threads);
        std::thread::Builder::new()
            .name("ferry-bench-case".into())
            .spawn(move || done(run_case(&shared, threads, spec)))
            .map(drop)
            .map_err(|e| Error::Io(format!("start bench case thread: {e}")))
    }

    fn shared(&self) -> Shared {
        Shared {
            gate: self.gate.clone(),
            engine: self.engine.clone(),
            first_failure: self.first_failure.clone(),
            warm: self.warm.clone(),
        }
    }

    /// Stops the workers (a running case ends `Stopped`) and joins their threads.
    pub fn stop(&self) {
        self.gate.stop();
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        self.gate.stop();
    }
}

/// What a case runs on, shared with the thread it runs on.
struct Shared {
    gate: Arc<BenchGate>,
    engine: Engine,
    first_failure: Arc<AtomicU64>,
    warm: Arc<WarmupMark<Metrics>>,
}

fn run_case(shared: &Shared, threads: usize, spec: BenchSpec) -> CaseReport {
    let Shared {
        gate,
        engine,
        first_failure,
        warm,
    } = shared;
    let (block, batch, op) = (spec.block_size, spec.batch_size, spec.opcode);
    first_failure.store(0, Ordering::Release);
    warm.reset();
    let before = engine.metrics();
    let result = gate.run(spec);
    let ended_at_ms = now_ms();
    let from = warm.take_mark().unwrap_or(before);
    let served = Served::between(&from, &engine.metrics(), op);
    let row = |stats: &[WorkerStats]| {
        ReportRow::from_stats(block, batch, stats)
            .ok()
            .map(|mut r| {
                r.threads = u32::try_from(threads).unwrap_or(u32::MAX);
                r
            })
    };
    let (outcome, row, failure) = match result {
        Ok(stats) => (CaseOutcome::Ok, row(&stats), None),
        Err(RunError::Failed(f)) => (CaseOutcome::Failed, None, Some(f)),
        Err(RunError::Stopped { partial }) => {
            let measured = partial.iter().any(|s| s.ops > 0);
            (
                CaseOutcome::Stopped,
                if measured { row(&partial) } else { None },
                None,
            )
        }
    };
    let first = first_failure.load(Ordering::Acquire);
    CaseReport {
        outcome,
        row,
        first_failure_at_ms: (first != 0).then_some(first),
        failure,
        served,
        ended_at_ms,
    }
}
