//! Native benchmark workers for tebench: converts JS cases into `ferry_bench` specs and
//! `ferry_bench` reports back into JS values. The workers, their defaults and the thread a
//! case runs on belong to `ferry_bench::Bench`; its row type is handed to JS as it is.

use std::time::Duration;

use ferry_bench::gate::Failure;
use ferry_bench::worker::{Addressing, BenchSpec, Stripe, Target};
use ferry_bench::{Bench, CaseReport, ReportRow, TransportShare, DEFAULT_STALL_TIMEOUT};
use ferry_core::Opcode;
use napi::bindgen_prelude::Object;
use napi::Env;
use napi_derive::napi;

use crate::convert::{internal, js_error};
use crate::js::{numbered, opt_transport, to_u64};
use crate::settle::Settle;
use crate::NativeEngine;
use ferry_core::handle::{HandleKind, Handles};

/// One benchmark case, its opcode and transport by number (lib/bench.ts converts the
/// public `BenchCase`, which names them).
#[napi(object)]
pub struct BenchCaseJs {
    /// Opcode number (`Opcode`).
    pub opcode: f64,
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
    /// "fixed" (Mooncake's: every batch re-uses the blocks at the start of the stripe) or
    /// "walk" (each batch takes the next blocks, through the whole stripe). Default "walk".
    #[napi(ts_type = "'fixed' | 'walk'")]
    pub addressing: Option<String>,
    /// Further targets (tebench's comma list): worker i uses target i % (1 + n).
    pub extra_targets: Option<Vec<BenchTarget>>,
    /// Pin every request to the transport of this number [0: none].
    pub transport: Option<f64>,
    /// Measured time in ms.
    pub duration_ms: f64,
    /// Warm-up in ms.
    pub warmup_ms: f64,
    /// Pacing before each batch, in µs.
    pub request_interval_us: f64,
    /// An operation without progress for this long fails with TIMEOUT (default 30 s).
    pub stall_timeout_ms: Option<f64>,
    /// Every submission carries a notification (tebench's `--notifi`) [false].
    pub notify: Option<bool>,
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
/// (with a row when measured operations exist), and what served it, counted from the end
/// of its warm-up.
#[napi(object)]
#[derive(Default)]
pub struct BenchResult {
    /// "ok", "failed" or "stopped".
    pub outcome: String,
    /// The row, for "ok" (and "stopped" when measured operations exist).
    pub row: Option<ReportRow>,
    /// The failure, for "failed".
    pub failure: Option<BenchFailure>,
    /// Transports that moved the case's bytes, largest share first.
    pub served: Vec<TransportShare>,
    /// The same as text: `shm (100 %)`, `tcp 90 %, shm 10 %`, `none`.
    pub served_label: String,
    /// Attempts that failed over during the case.
    pub failovers: f64,
    /// Notifications sent during the case (its measured part, as every figure here).
    pub notifications_sent: f64,
    /// Notifications whose delivery failed during the case.
    pub notifications_failed: f64,
    /// When the first worker failed, ms since the Unix epoch.
    pub first_failure_at_ms: Option<f64>,
    /// When the last worker ended, ms since the Unix epoch.
    pub ended_at_ms: f64,
}

impl From<CaseReport> for BenchResult {
    fn from(r: CaseReport) -> Self {
        Self {
            outcome: r.outcome.name().to_string(),
            served_label: r.served.label(),
            failovers: r.served.failovers as f64,
            notifications_sent: r.served.notifications_sent as f64,
            notifications_failed: r.served.notifications_failed as f64,
            served: r.served.shares,
            row: r.row,
            failure: r.failure.as_ref().map(BenchFailure::from),
            first_failure_at_ms: r.first_failure_at_ms.map(|v| v as f64),
            ended_at_ms: r.ended_at_ms as f64,
        }
    }
}

/// Mooncake's table header (`--format=mooncake`): the column names and a dashed line.
#[napi(catch_unwind)]
pub fn bench_mooncake_header() -> String {
    ReportRow::mooncake_header()
}

/// A row in Mooncake's layout.
#[napi(catch_unwind)]
pub fn bench_mooncake_line(row: ReportRow) -> String {
    row.to_mooncake_line()
}

fn spec(c: &BenchCaseJs, handles: &Handles) -> Result<BenchSpec, ferry_core::Error> {
    let segment = |v: f64| handles.decode(HandleKind::Segment, to_u64(v, "segment")?);
    Ok(BenchSpec {
        opcode: numbered::<Opcode>(c.opcode, "opcode")?,
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
        addressing: match c.addressing.as_deref() {
            None => Addressing::Walk,
            Some(name) => Addressing::parse(name).ok_or_else(|| {
                ferry_core::Error::InvalidArgument(format!(
                    "addressing must be 'fixed' or 'walk', got {name:?}"
                ))
            })?,
        },
        transport: opt_transport(c.transport.unwrap_or(0.0), "transport")?,
        duration: Duration::from_millis(to_u64(c.duration_ms, "durationMs")?),
        warmup: Duration::from_millis(to_u64(c.warmup_ms, "warmupMs")?),
        request_interval_us: to_u64(c.request_interval_us, "requestIntervalUs")?,
        stall_timeout: c
            .stall_timeout_ms
            .map(|ms| to_u64(ms, "stallTimeoutMs").map(Duration::from_millis))
            .transpose()?
            .unwrap_or(DEFAULT_STALL_TIMEOUT),
        notify: c.notify.unwrap_or(false),
    })
}

/// A gate of native benchmark worker threads bound to one engine.
#[napi]
pub struct NativeBench {
    bench: Bench,
    handles: Handles,
}

#[napi]
impl NativeBench {
    /// Starts `threads` worker threads on `engine`'s core.
    #[napi(constructor, catch_unwind)]
    pub fn new(engine: &NativeEngine, threads: f64) -> napi::Result<Self, String> {
        let threads = to_u64(threads, "threads").map_err(js_error)?;
        let bench = Bench::start(
            engine.core().clone(),
            usize::try_from(threads).unwrap_or(usize::MAX),
        )
        .map_err(js_error)?;
        Ok(Self {
            bench,
            handles: engine.core().handles(),
        })
    }

    /// Runs one case on every worker; resolves with its result. Runs one at a time.
    #[napi(catch_unwind, ts_return_type = "Promise<BenchResult>")]
    pub fn run_case<'env>(
        &self,
        env: &'env Env,
        bench_case: BenchCaseJs,
    ) -> napi::Result<Object<'env>, String> {
        let spec = spec(&bench_case, &self.handles).map_err(js_error)?;
        let (settle, promise) = Settle::<BenchResult>::new(env).map_err(internal)?;
        self.bench
            .spawn_case(spec, move |report| settle.resolve(report.into()))
            .map_err(js_error)?;
        Ok(promise)
    }

    /// Stops the workers (a running case resolves "stopped") and joins their threads.
    #[napi(catch_unwind)]
    pub fn stop(&self) {
        self.bench.stop();
    }
}
