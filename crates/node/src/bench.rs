//! Native benchmark workers for tebench: a gate of worker threads that run cases through
//! the core API (allocate → submit → poll → free) and report tebench's columns.

use std::sync::Arc;
use std::time::Duration;

use ferry_bench::gate::{Failure, GateHooks, RunError};
use ferry_bench::report::ReportRow;
use ferry_bench::worker::{bench_gate, BenchGate, BenchSpec, Stripe, Target};
use ferry_core::Opcode;
use napi::bindgen_prelude::Object;
use napi::Env;
use napi_derive::napi;

use crate::convert::{js_error, transport};
use crate::js::to_u64;
use crate::settle::Settle;
use crate::NativeEngine;
use ferry_core::handle::{HandleKind, Handles};

/// One benchmark case.
#[napi(object)]
pub struct BenchCase {
    /// "read" or "write".
    #[napi(ts_type = "'read' | 'write'")]
    pub opcode: String,
    /// Bytes per request.
    pub block_size: f64,
    /// Requests per batch.
    pub batch_size: f64,
    /// Local region id.
    pub local: f64,
    /// Segment handle.
    pub segment: f64,
    /// Segment name (for failure reports).
    pub peer: String,
    /// Remote buffer id.
    pub remote_buffer: f64,
    /// Worker i works on [stripeBase + i·stripeLen, … + stripeLen) of both buffers.
    pub stripe_base: f64,
    /// Bytes per worker stripe.
    pub stripe_len: f64,
    /// Further targets (tebench's comma list): worker i uses target i % (1 + n).
    pub extra_targets: Option<Vec<BenchTarget>>,
    /// Pin every request to this transport.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: Option<String>,
    /// Measured time in ms.
    pub duration_ms: f64,
    /// Warm-up in ms.
    pub warmup_ms: f64,
    /// Pacing before each batch, in µs.
    pub request_interval_us: f64,
}

/// A further target segment of a case.
#[napi(object)]
pub struct BenchTarget {
    /// Segment handle.
    pub segment: f64,
    /// Segment name.
    pub peer: String,
    /// Remote buffer id.
    pub remote_buffer: f64,
}

/// tebench's columns for one case.
#[napi(object)]
#[derive(Default)]
pub struct BenchRow {
    /// Bytes per request.
    pub block_size: f64,
    /// Requests per batch.
    pub batch_size: u32,
    /// Worker threads.
    pub threads: u32,
    /// Measured operations (batches) over all threads.
    pub ops: f64,
    /// BW (GB/s).
    pub bw_gbps: f64,
    /// Avg Inst GB/s.
    pub avg_inst_gbps: f64,
    /// Avg Lat (µs).
    pub avg_lat_us: f64,
    /// Avg Tx (µs).
    pub avg_tx_us: f64,
    /// P99 Tx (µs).
    pub p99_tx_us: f64,
    /// P999 Tx (µs).
    pub p999_tx_us: f64,
}

impl From<&ReportRow> for BenchRow {
    fn from(r: &ReportRow) -> Self {
        Self {
            block_size: r.block_size as f64,
            batch_size: r.batch_size as u32,
            threads: r.threads as u32,
            ops: r.ops as f64,
            bw_gbps: r.bw_gbps,
            avg_inst_gbps: r.avg_inst_gbps,
            avg_lat_us: r.avg_lat_us,
            avg_tx_us: r.avg_tx_us,
            p99_tx_us: r.p99_tx_us,
            p999_tx_us: r.p999_tx_us,
        }
    }
}

/// Why a case failed.
#[napi(object)]
#[derive(Default)]
pub struct BenchFailure {
    /// Raw status.
    pub status: u32,
    /// Status name.
    pub status_name: String,
    /// Error code, when known.
    pub code: Option<String>,
    /// Transport of the failed attempt.
    pub transport: String,
    /// Segment name.
    pub peer: String,
    /// The request.
    pub request: String,
    /// What went wrong.
    pub reason: String,
}

impl From<&Failure> for BenchFailure {
    fn from(f: &Failure) -> Self {
        Self {
            status: u32::from(f.status.raw()),
            status_name: f.status.name().to_string(),
            code: f.code.clone(),
            transport: f.transport_name().to_string(),
            peer: f.peer.clone(),
            request: f.request.clone(),
            reason: f.reason.clone(),
        }
    }
}

/// Outcome of a case: "ok" with a row, "failed" with the first failure, or "stopped"
/// (with a row from the workers that finished, if any).
#[napi(object)]
#[derive(Default)]
pub struct BenchResult {
    /// "ok", "failed" or "stopped".
    pub outcome: String,
    /// The row, for "ok" (and "stopped" when partial results exist).
    pub row: Option<BenchRow>,
    /// The failure, for "failed".
    pub failure: Option<BenchFailure>,
}

fn spec(c: &BenchCase, handles: &Handles) -> Result<BenchSpec, ferry_core::Error> {
    let segment = |v: f64| handles.decode(HandleKind::Segment, to_u64(v, "segment")?);
    Ok(BenchSpec {
        opcode: Opcode::parse(&c.opcode)?,
        block_size: to_u64(c.block_size, "blockSize")?,
        batch_size: usize::try_from(to_u64(c.batch_size, "batchSize")?).unwrap_or(usize::MAX),
        local: handles.decode(HandleKind::Region, to_u64(c.local, "local")?)?,
        segment: segment(c.segment)?,
        peer: c.peer.clone(),
        remote_buffer: to_u64(c.remote_buffer, "remoteBuffer")?,
        extra_targets: c
            .extra_targets
            .iter()
            .flatten()
            .map(|t| {
                Ok(Target {
                    segment: segment(t.segment)?,
                    peer: t.peer.clone(),
                    remote_buffer: to_u64(t.remote_buffer, "remoteBuffer")?,
                })
            })
            .collect::<Result<_, ferry_core::Error>>()?,
        stripe: Stripe {
            base: to_u64(c.stripe_base, "stripeBase")?,
            len: to_u64(c.stripe_len, "stripeLen")?,
        },
        transport: c
            .transport
            .as_deref()
            .map(|t| transport(t, "transport"))
            .transpose()?,
        duration: Duration::from_millis(to_u64(c.duration_ms, "durationMs")?),
        warmup: Duration::from_millis(to_u64(c.warmup_ms, "warmupMs")?),
        request_interval_us: to_u64(c.request_interval_us, "requestIntervalUs")?,
        stall_timeout: Duration::from_secs(30),
    })
}

/// A gate of native benchmark worker threads bound to one engine.
#[napi]
pub struct NativeBench {
    gate: Arc<BenchGate>,
    threads: usize,
    handles: Handles,
}

#[napi]
impl NativeBench {
    /// Starts `threads` worker threads on `engine`'s core.
    #[napi(constructor, catch_unwind)]
    pub fn new(engine: &NativeEngine, threads: f64) -> napi::Result<Self, String> {
        let threads = to_u64(threads, "threads").map_err(js_error)?;
        if threads == 0 || threads > 1024 {
            return Err(js_error(ferry_core::Error::InvalidArgument(format!(
                "threads must be in 1..=1024, got {threads}"
            ))));
        }
        if engine.core().is_closed() {
            return Err(js_error(ferry_core::Error::Closed));
        }
        let gate = bench_gate(
            engine.core().clone(),
            threads as usize,
            GateHooks::default(),
        )
        .map_err(|e| napi::Error::new("ERR_FERRY_IO".to_string(), e.to_string()))?;
        Ok(Self {
            gate: Arc::new(gate),
            threads: threads as usize,
            handles: engine.core().handles(),
        })
    }

    /// Runs one case on every worker; resolves with its result. Runs one at a time.
    #[napi(catch_unwind, ts_return_type = "Promise<BenchResult>")]
    pub fn run_case<'env>(
        &self,
        env: &'env Env,
        bench_case: BenchCase,
    ) -> napi::Result<Object<'env>, String> {
        let spec = spec(&bench_case, &self.handles).map_err(js_error)?;
        let (settle, promise) = Settle::<BenchResult>::new(env)
            .map_err(|e| napi::Error::new("ERR_FERRY_INTERNAL".to_string(), e.to_string()))?;
        let gate = self.gate.clone();
        let threads = self.threads;
        let (block, batch) = (spec.block_size, spec.batch_size);
        std::thread::Builder::new()
            .name("ferry-bench-run".into())
            .spawn(move || {
                let row = |stats: &[ferry_bench::worker::WorkerStats]| {
                    ReportRow::from_stats(block, batch, stats)
                        .ok()
                        .map(|r| BenchRow::from(&r))
                };
                let result = match gate.run(spec) {
                    Ok(stats) => BenchResult {
                        outcome: "ok".into(),
                        row: row(&stats).map(|mut r| {
                            r.threads = threads as u32;
                            r
                        }),
                        failure: None,
                    },
                    Err(RunError::Failed(f)) => BenchResult {
                        outcome: "failed".into(),
                        row: None,
                        failure: Some(BenchFailure::from(&f)),
                    },
                    Err(RunError::Stopped { partial }) => BenchResult {
                        outcome: "stopped".into(),
                        row: if partial.is_empty() {
                            None
                        } else {
                            row(&partial)
                        },
                        failure: None,
                    },
                };
                settle.resolve(result);
            })
            .map_err(|e| napi::Error::new("ERR_FERRY_IO".to_string(), e.to_string()))?;
        Ok(promise)
    }

    /// Stops the workers (a running case resolves "stopped") and joins their threads.
    #[napi(catch_unwind)]
    pub fn stop(&self) {
        self.gate.stop();
    }
}
