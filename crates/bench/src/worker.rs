//! Benchmark workers over ferry-core's public batch API.
//!
//! Each worker loops allocate_batch → submit_transfer → poll batch_status (with backoff) →
//! free_batch, timing each operation from submit to completion. COMPLETED ends an
//! operation; any other terminal status, an engine error, or a poll that sees no progress
//! for [`BenchSpec::stall_timeout`] ends the worker with a [`Failure`] naming the status,
//! transport, peer and request. A notifying worker ([`BenchSpec::notify`]) first waits
//! while its engine has [`NOTIFY_WINDOW`] notifications in flight. Nothing here exits,
//! panics on engine input, or spins without bound.
//!
//! The pure parts — the offset cycle over a stripe, the backoff schedule and the stats
//! arithmetic — take no clock or engine and are tested on their own.

use std::time::{Duration, Instant};

use ferry_core::ticks::{self, Stamp};

use ferry_core::{Engine, Error, Opcode, RegionId, Request, TransferStatus, TransportKind};

use crate::backoff::{Backoff, Pause, RecentWaits};
use crate::gate::{Failure, Gate, GateHooks, StopSignal};
use crate::notify_room::{wait_for_room, Room, NOTIFY_WINDOW};
pub use crate::stats::WorkerStats;

/// Where worker `i` works: bytes `[base + i·len, base + (i+1)·len)` of both the local
/// region and the remote buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripe {
    /// Offset of worker 0's stripe.
    pub base: u64,
    /// Bytes per worker.
    pub len: u64,
}

/// How a worker addresses its stripe from one batch to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Addressing {
    /// Mooncake's tebench: every batch uses the same blocks, contiguous from the start of
    /// the worker's stripe (`+ block × i`), so a stripe's bytes stay in cache case after
    /// case. The default, so that figures compare with Mooncake's.
    #[default]
    Fixed,
    /// Each batch takes the next blocks of the stripe, wrapping at its end: the whole
    /// stripe is walked (the DRAM-bound figure for stripes larger than the caches).
    Walk,
}

impl Addressing {
    /// `fixed` or `walk`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Walk => "walk",
        }
    }

    /// The addressing named `fixed` or `walk`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "fixed" => Some(Self::Fixed),
            "walk" => Some(Self::Walk),
            _ => None,
        }
    }
}

/// A further target segment (tebench's comma list of `--target_seg_name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Segment handle.
    pub segment: u64,
    /// Segment name, for failure reports.
    pub peer: String,
    /// Buffer id in that segment.
    pub remote_buffer: u64,
}

/// One benchmark case, handed to every worker of a gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchSpec {
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Bytes per request.
    pub block_size: u64,
    /// Requests per batch (one operation).
    pub batch_size: usize,
    /// Local region the data moves from (WRITE) or into (READ).
    pub local: RegionId,
    /// Handle of the opened target segment.
    pub segment: u64,
    /// The target's segment name (for failure reports).
    pub peer: String,
    /// Buffer id inside the target segment.
    pub remote_buffer: u64,
    /// Further targets: worker `i` works against target `i % (1 + extra_targets.len())`,
    /// target 0 being `segment`/`peer`/`remote_buffer`.
    pub extra_targets: Vec<Target>,
    /// Per-worker stripes of both buffers.
    pub stripe: Stripe,
    /// Same blocks every batch (Mooncake's) or a walk through the stripe.
    pub addressing: Addressing,
    /// Pin every request to this transport (tebench's `--xport_type`).
    pub transport: Option<TransportKind>,
    /// Measured time per worker.
    pub duration: Duration,
    /// Unmeasured time before it.
    pub warmup: Duration,
    /// Pause before each batch, in µs (tebench's `--request_interval_us`); counted in the
    /// worker's wall time, not in the operation's.
    pub request_interval_us: u64,
    /// An operation that shows no progress for this long fails with TIMEOUT, and so does a
    /// notifying worker whose engine's notification backlog does not drain for this long.
    pub stall_timeout: Duration,
    /// Every submission carries a notification to its target (tebench's `--notifi`),
    /// sent once all its requests completed.
    ///
    /// Before each submission a notifying worker waits while its engine has
    /// [`NOTIFY_WINDOW`] notifications in flight ([`crate::notify_room`]): in the worker's
    /// wall time (BW, Avg Lat), not in the operation's Tx time.
    pub notify: bool,
}

/// Default [`BenchSpec::stall_timeout`].
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);

impl BenchSpec {
    /// The target of worker `slot`: (segment, peer, remote buffer).
    pub fn target(&self, slot: usize) -> (u64, &str, u64) {
        match slot % (1 + self.extra_targets.len()) {
            0 => (self.segment, &self.peer, self.remote_buffer),
            i => {
                let t = &self.extra_targets[i - 1];
                (t.segment, &t.peer, t.remote_buffer)
            }
        }
    }

    /// Bytes one operation moves.
    pub fn op_bytes(&self) -> u64 {
        self.block_size.saturating_mul(self.batch_size as u64)
    }

    /// Checks that a batch fits in a stripe and that the stripes are addressable.
    ///
    /// # Errors
    /// An INVALID [`Failure`] naming the bad parameter.
    pub fn check(&self, workers: usize) -> Result<(), Failure> {
        let invalid = |why: String| Err(Failure::new(TransferStatus::Invalid, why));
        if self.block_size == 0 || self.batch_size == 0 {
            return invalid(format!(
                "block size and batch size must be > 0 (got {} and {})",
                self.block_size, self.batch_size
            ));
        }
        if self.batch_size > ferry_core::batch::MAX_BATCH_CAPACITY {
            return invalid(format!(
                "batch size must be at most {}, got {}",
                ferry_core::batch::MAX_BATCH_CAPACITY,
                self.batch_size
            ));
        }
        let need = self.block_size.checked_mul(self.batch_size as u64);
        if need.is_none_or(|n| n > self.stripe.len) {
            return invalid(format!(
                "{} × {} B does not fit in a {} B stripe",
                self.batch_size, self.block_size, self.stripe.len
            ));
        }
        let end = (workers as u64)
            .checked_mul(self.stripe.len)
            .and_then(|n| n.checked_add(self.stripe.base));
        if end.is_none() {
            return invalid(format!(
                "{workers} stripes of {} B overflow",
                self.stripe.len
            ));
        }
        Ok(())
    }
}

/// Cycles block-sized offsets through one stripe: each batch takes the next `batch`
/// positions, wrapping at the stripe's end ([`Addressing::Walk`]) or after the batch
/// ([`Addressing::Fixed`]). Offsets within a batch never overlap as long as
/// `block × batch ≤ stripe len`.
#[derive(Debug, Clone)]
pub struct OffsetCycle {
    start: u64,
    block: u64,
    positions: u64,
    next: u64,
}

impl OffsetCycle {
    /// The cycle of worker `slot` for `spec` (call [`BenchSpec::check`] first).
    pub fn new(spec: &BenchSpec, slot: usize) -> Self {
        let start = spec
            .stripe
            .base
            .saturating_add((slot as u64).saturating_mul(spec.stripe.len));
        let block = spec.block_size.max(1);
        let positions = match spec.addressing {
            Addressing::Fixed => spec.batch_size as u64,
            Addressing::Walk => spec.stripe.len / block,
        };
        Self {
            start,
            block,
            positions: positions.max(1),
            next: 0,
        }
    }

    /// The next offset.
    pub fn next_offset(&mut self) -> u64 {
        let off = self.start + self.next * self.block;
        self.next = (self.next + 1) % self.positions;
        off
    }
}

/// A bench gate: every worker runs [`run_worker`] on `engine` for each [`BenchSpec`].
pub type BenchGate = Gate<BenchSpec, WorkerStats>;

/// Starts a gate of `threads` benchmark workers on `engine`.
///
/// # Errors
/// As [`Gate::start`].
pub fn bench_gate(engine: Engine, threads: usize, hooks: GateHooks) -> std::io::Result<BenchGate> {
    Gate::start_with_hooks(threads, hooks, move |slot, spec: BenchSpec, stop| {
        run_worker(&engine, slot, &spec, stop)
    })
}

/// Runs one benchmark worker: warm-up, then `spec.duration` of measured operations.
/// Returns early (with the stats so far) once `stop` is raised.
///
/// # Errors
/// A [`Failure`] when an operation ends other than COMPLETED, an engine call fails, or an
/// operation stalls for `spec.stall_timeout`.
pub fn run_worker(
    engine: &Engine,
    slot: usize,
    spec: &BenchSpec,
    stop: &StopSignal,
) -> Result<WorkerStats, Failure> {
    run_worker_marked(engine, slot, spec, stop, |_| true)
}

/// [`run_worker`], calling `warmed` between the warm-up and the first measured operation
/// (nothing of this worker in flight): a case's workers meet there ([`crate::warmup`]).
/// `warmed` returning `false` (stop raised while waiting) ends the worker with no
/// measurement.
///
/// # Errors
/// As [`run_worker`].
pub fn run_worker_marked(
    engine: &Engine,
    slot: usize,
    spec: &BenchSpec,
    stop: &StopSignal,
    warmed: impl FnOnce(&StopSignal) -> bool,
) -> Result<WorkerStats, Failure> {
    spec.check(slot + 1)?;
    precise_sleeps();
    let mut stats = WorkerStats::new()
        .map_err(|e| Failure::new(TransferStatus::Failed, format!("histogram: {e}")))?;
    let mut op = Operation::new(engine, slot, spec);

    let warm_end = Instant::now() + spec.warmup;
    while Instant::now() < warm_end {
        pace(spec);
        if stop.is_raised() || op.run(stop)?.is_none() {
            return Ok(stats);
        }
    }
    if !warmed(stop) {
        return Ok(stats);
    }
    let started = Instant::now();
    let bytes = spec.op_bytes();
    // Operations are timed by the engine's stamps (`ferry_core::ticks`: the CPU's counter
    // where the kernel keeps time by it), not by the clock: two clock reads cost a tenth of
    // a 4 KiB shm operation, which the figures would count as the engine's. The stamp
    // taken when an operation ends is the next check's; once the stamps say the duration
    // has passed, the clock has the last word (the wall time is the clock's, and a run
    // never ends before it).
    let first = ticks::stamp();
    let length = u64::try_from(spec.duration.as_nanos()).unwrap_or(u64::MAX);
    let mut now = first;
    while ticks::nanos_between(first, now) < length || started.elapsed() < spec.duration {
        pace(spec);
        if stop.is_raised() {
            break;
        }
        match op.run(stop)? {
            Some((took, ended)) => {
                stats.record(bytes, took);
                now = ended;
            }
            None => break,
        }
    }
    stats.wall = started.elapsed();
    Ok(stats)
}

/// What a worker was doing when its notification backlog failed it.
const NOTIFY_WAIT: &str = "submit_transfer_notify (waiting for notification room)";

/// Longest single wait for a batch to end, between the poll loop's stop and stall checks.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// Timer slack of a bench worker thread: the backoff's sleeps end within this of when
/// they were asked to, not within Linux's default 50 µs, which would be added to every
/// operation of a few hundred microseconds that a poller sleeps through.
const TIMER_SLACK_NS: libc::c_ulong = 1_000;

/// Sets this thread's timer slack to [`TIMER_SLACK_NS`] (Linux; best effort: a refusal
/// only leaves the default).
fn precise_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument, reads no memory of ours and
    // changes only the calling thread's timer slack.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
}

fn pace(spec: &BenchSpec) {
    if spec.request_interval_us > 0 {
        std::thread::sleep(Duration::from_micros(spec.request_interval_us));
    }
}

/// One worker's reusable operation state: its requests and offset cycle.
struct Operation<'a> {
    engine: &'a Engine,
    spec: &'a BenchSpec,
    slot: usize,
    cycle: OffsetCycle,
    requests: Vec<Request>,
    /// How long this worker's last operations took, from submission to their end: how it
    /// waits for the next (`Backoff::expecting`).
    waits: RecentWaits,
}

impl<'a> Operation<'a> {
    fn new(engine: &'a Engine, slot: usize, spec: &'a BenchSpec) -> Self {
        let (segment, _, remote_buffer) = spec.target(slot);
        let template = Request {
            opcode: spec.opcode,
            local: spec.local,
            local_offset: 0,
            segment,
            remote_buffer,
            remote_offset: 0,
            length: spec.block_size,
            hint: spec.transport.map_or(
                ferry_core::TransportHint::Auto,
                ferry_core::TransportHint::Require,
            ),
            // tebench's --verify sets the engine's default (`EngineConfig::verify`).
            verify: false,
        };
        Self {
            engine,
            spec,
            slot,
            cycle: OffsetCycle::new(spec, slot),
            requests: vec![template; spec.batch_size],
            waits: RecentWaits::default(),
        }
    }

    /// Runs one batch to completion; returns how long it took and when it ended. `Ok(None)`
    /// when `stop` was raised while waiting for notification room or polling (the batch is
    /// freed, which cancels what is left of it).
    fn run(&mut self, stop: &StopSignal) -> Result<Option<(Duration, Stamp)>, Failure> {
        if self.spec.notify && !self.notification_room(stop)? {
            return Ok(None);
        }
        for r in &mut self.requests {
            let off = self.cycle.next_offset();
            r.local_offset = off;
            r.remote_offset = off;
        }
        let batch = self
            .engine
            .allocate_batch(self.requests.len())
            .map_err(|e| self.engine_failure(&e, "allocate_batch", None))?;
        let submitted = ticks::stamp();
        let submit = if self.spec.notify {
            // Which worker, which submission: 12 bytes, like a small KV-block id.
            let mut note = (self.slot as u32).to_le_bytes().to_vec();
            let first = self.requests.first().map_or(0, |r| r.remote_offset);
            note.extend_from_slice(&first.to_le_bytes());
            self.engine
                .submit_transfer_notify(batch, &self.requests, note)
        } else {
            self.engine.submit_transfer(batch, &self.requests)
        };
        if let Err(e) = submit {
            let _ = self.engine.free_batch(batch);
            return Err(self.engine_failure(&e, "submit_transfer", self.requests.first()));
        }
        let mut backoff = Backoff::expecting(self.waits.expected());
        // Bytes moved so far, and how long after submission they were first seen.
        let mut progress = (0u64, Duration::ZERO);
        let took = loop {
            let snap = match self.engine.batch_status(batch) {
                Ok(s) => s,
                Err(e) => {
                    let _ = self.engine.free_batch(batch);
                    return Err(self.engine_failure(&e, "batch_status", self.requests.first()));
                }
            };
            if snap.status == TransferStatus::Completed {
                let ended = ticks::stamp();
                break (
                    Duration::from_nanos(ticks::nanos_between(submitted, ended)),
                    ended,
                );
            }
            if snap.status.is_terminal() {
                return Err(self.task_failure(batch, snap.status, None));
            }
            let waited = Duration::from_nanos(ticks::nanos_between(submitted, ticks::stamp()));
            if snap.transferred > progress.0 {
                progress = (snap.transferred, waited);
            } else if waited.saturating_sub(progress.1) >= self.spec.stall_timeout {
                let why = format!(
                    "no progress for {:.1} s ({} of {} B moved)",
                    self.spec.stall_timeout.as_secs_f64(),
                    snap.transferred,
                    self.spec.op_bytes()
                );
                return Err(self.task_failure(batch, TransferStatus::Timeout, Some(why)));
            }
            if stop.is_raised() {
                let _ = self.engine.free_batch(batch);
                return Ok(None);
            }
            match backoff.next_pause(waited) {
                // Past the spins and yields, the worker sleeps until the batch ends (a task
                // ending wakes it) rather than for a guessed time: no oversleep added to
                // the op, no CPU taken from the transport's threads meanwhile. Bounded, so
                // the stop and stall checks above still run.
                Pause::Sleep(_) => {
                    let _ = self.engine.wait_batch(batch, WAIT_SLICE);
                }
                Pause::Spin(n) => (0..n).for_each(|_| std::hint::spin_loop()),
                Pause::Yield => std::thread::yield_now(),
            }
        };
        self.engine
            .free_batch(batch)
            .map_err(|e| self.engine_failure(&e, "free_batch", None))?;
        self.waits.record(took.0);
        Ok(Some(took))
    }

    /// Waits for notification room ([`wait_for_room`]): `Ok(true)` once there is, `Ok(false)`
    /// if `stop` was raised first; a TIMEOUT failure naming the backlog when it stalled for
    /// `stall_timeout`, a CANCELED one when the engine closed meanwhile.
    fn notification_room(&self, stop: &StopSignal) -> Result<bool, Failure> {
        let mut backoff = Backoff::default();
        match wait_for_room(self.engine, stop, self.spec.stall_timeout, |waited| {
            backoff.wait(waited)
        }) {
            Room::Ready => Ok(true),
            Room::Stopped => Ok(false),
            Room::Closed => Err(self.engine_failure(&Error::Closed, NOTIFY_WAIT, None)),
            Room::Stalled { in_flight } => Err(self.backlog_failure(in_flight)),
        }
    }

    /// The failure of a worker whose engine's notification backlog stopped draining.
    fn backlog_failure(&self, in_flight: u64) -> Failure {
        Failure {
            worker: Some(self.slot),
            status: TransferStatus::Timeout,
            code: None,
            transport: self.spec.transport,
            peer: self.spec.target(self.slot).1.to_string(),
            request: NOTIFY_WAIT.to_string(),
            reason: format!(
                "notification backlog: {in_flight} notifications in flight \
                 (window {NOTIFY_WINDOW}), none delivered or failed for {:.1} s",
                self.spec.stall_timeout.as_secs_f64()
            ),
        }
    }

    fn describe(&self, r: &Request, task: Option<usize>) -> String {
        let op = match r.opcode {
            Opcode::Read => "READ",
            Opcode::Write => "WRITE",
        };
        let task = task.map(|t| format!("task {t}: ")).unwrap_or_default();
        format!(
            "{task}{op} {} B, local region {} @ {}, {} buffer {} @ {}",
            r.length,
            r.local,
            r.local_offset,
            self.spec.target(self.slot).1,
            r.remote_buffer,
            r.remote_offset
        )
    }

    fn engine_failure(&self, e: &Error, call: &str, request: Option<&Request>) -> Failure {
        // An engine that is closing can answer a call that raced with `close` with the
        // error of a lookup that the close emptied (an unknown batch); report the cause.
        let (status, code, reason) = if self.engine.is_closed() && *e != Error::Closed {
            (
                TransferStatus::Canceled,
                Error::Closed.code(),
                format!("{} ({call} answered: {e})", Error::Closed),
            )
        } else {
            (e.status(), e.code(), e.to_string())
        };
        Failure {
            worker: Some(self.slot),
            status,
            code: Some(code.to_string()),
            transport: self.spec.transport,
            peer: self.spec.target(self.slot).1.to_string(),
            request: match request {
                Some(r) => format!(
                    "{call} of {} request(s), first: {}",
                    self.requests.len(),
                    self.describe(r, None)
                ),
                None => call.to_string(),
            },
            reason,
        }
    }

    /// A failure for a batch that ended `status` (or stalled): the first task that did not
    /// complete names the transport and the reason. Frees the batch.
    fn task_failure(&self, batch: u64, status: TransferStatus, stalled: Option<String>) -> Failure {
        let list = self.engine.transfer_status_list(batch);
        let freed = self.engine.free_batch(batch);
        let (index, snap) = match &list {
            Ok(list) => match list
                .iter()
                .enumerate()
                .find(|(_, s)| s.status != TransferStatus::Completed)
            {
                Some((i, s)) => (Some(i), Some(s)),
                None => (None, None),
            },
            Err(_) => (None, None),
        };
        let request = index
            .and_then(|i| self.requests.get(i).map(|r| self.describe(r, Some(i))))
            .unwrap_or_else(|| format!("batch of {} request(s)", self.requests.len()));
        let mut reason = match (stalled, snap.and_then(|s| s.error.as_ref())) {
            (Some(why), _) => why,
            (None, Some(e)) => e.to_string(),
            (None, None) => format!("batch ended {status}"),
        };
        if let Err(e) = freed {
            reason.push_str(&format!(" (free_batch: {e})"));
        }
        Failure {
            worker: Some(self.slot),
            status,
            code: snap
                .and_then(|s| s.error.as_ref())
                .map(|e| e.code().to_string()),
            transport: snap.and_then(|s| s.transport).or(self.spec.transport),
            peer: self.spec.target(self.slot).1.to_string(),
            request,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(block: u64, batch: usize, stripe: Stripe) -> BenchSpec {
        BenchSpec {
            opcode: Opcode::Write,
            block_size: block,
            batch_size: batch,
            local: 1,
            segment: 1,
            peer: "127.0.0.1:1".into(),
            remote_buffer: 0,
            extra_targets: Vec::new(),
            stripe,
            addressing: Addressing::Walk,
            transport: None,
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            request_interval_us: 0,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            notify: false,
        }
    }

    #[test]
    fn offsets_cycle_within_the_stripe() {
        let s = spec(
            4096,
            2,
            Stripe {
                base: 1 << 20,
                len: 3 * 4096 + 100,
            },
        );
        let mut c = OffsetCycle::new(&s, 2);
        let start = (1 << 20) + 2 * (3 * 4096 + 100);
        let got: Vec<u64> = (0..7).map(|_| c.next_offset() - start).collect();
        assert_eq!(got, [0, 4096, 8192, 0, 4096, 8192, 0]);
    }

    #[test]
    fn fixed_addressing_reuses_one_batch_of_contiguous_blocks() {
        let mut s = spec(
            4096,
            3,
            Stripe {
                base: 0,
                len: 1 << 20,
            },
        );
        s.addressing = Addressing::Fixed;
        let mut c = OffsetCycle::new(&s, 1);
        let got: Vec<u64> = (0..7).map(|_| c.next_offset() - (1 << 20)).collect();
        assert_eq!(got, [0, 4096, 8192, 0, 4096, 8192, 0]);
        assert_eq!(Addressing::parse("walk"), Some(Addressing::Walk));
        assert_eq!(
            Addressing::parse(Addressing::Fixed.name()),
            Some(Addressing::Fixed)
        );
        assert_eq!(Addressing::parse("stripe"), None);
    }

    #[test]
    fn spec_check_refuses_what_does_not_fit() {
        let stripe = Stripe { base: 0, len: 8192 };
        assert!(spec(4096, 2, stripe).check(4).is_ok());
        let too_big = spec(4096, 3, stripe).check(1).expect_err("too big");
        assert_eq!(too_big.status, TransferStatus::Invalid);
        assert!(spec(0, 1, stripe).check(1).is_err());
        assert!(spec(4096, 0, stripe).check(1).is_err());
        assert!(spec(u64::MAX, 2, stripe).check(1).is_err());
        let huge = Stripe {
            base: u64::MAX - 10,
            len: 8192,
        };
        assert!(spec(4096, 1, huge).check(2).is_err());
    }
}
