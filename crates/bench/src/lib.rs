//! # ferry-bench
//!
//! tebench's engine room: a task [`gate`] that drives N native worker threads one case at a
//! time, benchmark [`worker`]s that loop allocate → submit → poll (with backoff) → free
//! through ferry-core's public API, their samples ([`stats`]: every Tx figure of a row from
//! the same ones), the [`report`] columns of Mooncake's tebench (and Ferry's min, median and
//! max), what [`served`] a case counted from the end of its [`warmup`], and the [`runner`]
//! ([`Bench`]) that runs whole cases for a front end.
//!
//! ```no_run
//! use std::time::Duration;
//! use ferry_bench::{bench_gate, Addressing, BenchSpec, GateHooks, ReportRow, RunError, Stripe};
//! use ferry_core::{Engine, EngineConfig, Opcode};
//!
//! let target = Engine::new(EngineConfig::default())?;
//! let remote = target.allocate(8 << 20)?;
//! let initiator = Engine::new(EngineConfig::default())?;
//! let local = initiator.allocate(8 << 20)?;
//! let seg = initiator.open_segment_blocking(target.segment_name())?;
//! let gate = bench_gate(initiator.clone(), 2, GateHooks::default())?;
//! let spec = BenchSpec {
//!     opcode: Opcode::Write, block_size: 64 << 10, batch_size: 1, local: local.id(),
//!     segment: seg.handle, peer: seg.name, remote_buffer: remote.id(), extra_targets: vec![],
//!     stripe: Stripe { base: 0, len: 4 << 20 }, addressing: Addressing::Walk, transport: None,
//!     duration: Duration::from_secs(1), warmup: Duration::from_millis(100),
//!     request_interval_us: 0, stall_timeout: ferry_bench::DEFAULT_STALL_TIMEOUT, notify: false,
//! };
//! match gate.run(spec.clone()) {
//!     Ok(stats) => {
//!         let row = ReportRow::from_stats(spec.block_size, spec.batch_size, &stats)?;
//!         println!("{}\n{}", ReportRow::header(), row.to_line());
//!     }
//!     Err(RunError::Failed(f)) => eprintln!("{f}"),
//!     Err(RunError::Stopped { .. }) => eprintln!("interrupted"),
//! }
//! gate.stop();
//! initiator.close();
//! target.close();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Thread safety: a [`Gate`] is `Send + Sync`; `run` calls are serialized, `stop` may come
//! from any other thread. Worker functions run on the gate's threads and must return once
//! their [`StopSignal`] is raised (bench workers check it between polls).
//!
//! Resources: [`Gate::stop`] (or dropping the gate) joins every worker thread; bench
//! workers free each batch they allocate, on every path. Nothing in this crate exits the
//! process: failures come back as values ([`Failure`]) for the caller to report.

#![warn(missing_docs, unreachable_pub)]

pub mod backoff;
pub mod gate;
pub mod notify_room;
pub mod report;
pub mod runner;
pub mod served;
pub mod stats;
mod sync;
pub mod warmup;
pub mod worker;

pub use backoff::{Backoff, Pause};
pub use gate::{Failure, Gate, GateHooks, Hook, Retirements, RunError, StopSignal, WorkerFn};
pub use notify_room::{room_for_notification, NOTIFY_WINDOW};
pub use report::ReportRow;
pub use runner::{Bench, CaseOutcome, CaseReport, MAX_THREADS};
pub use served::{Served, TransportShare};
pub use stats::{TxSummary, WorkerStats};
pub use warmup::WarmupMark;
pub use worker::{
    bench_gate, run_worker, run_worker_marked, Addressing, BenchGate, BenchSpec, OffsetCycle,
    Stripe, DEFAULT_STALL_TIMEOUT,
};
