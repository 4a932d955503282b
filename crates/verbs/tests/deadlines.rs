//! Attempt deadlines over rdma count from when an attempt's first work requests are
//! posted: a block list far longer than the deadline ends with no TIMEOUT behind its own
//! backlog, while a peer that stops completing mid-list still ends every task within the
//! deadline.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::blocks::{BlockOutcome, Blocks, PerBlock};
use ferry_core::{Engine, EngineConfig, Opcode, TransferStatus, TransportHint, TransportKind};
use ferry_testkit::{bytes_at, fill, within, Pair};
use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
use ferry_verbs::{RdmaConfig, RdmaFactory};

fn engine(provider: Arc<EmulatedProvider>, deadline: Option<Duration>) -> Engine {
    let rdma = RdmaConfig {
        provider_instance: Some(provider),
        ..RdmaConfig::default()
    };
    let mut cfg = EngineConfig {
        transports: vec![TransportKind::Rdma, TransportKind::Tcp],
        ..EngineConfig::default()
    };
    cfg.failover.attempt_timeout = deadline;
    cfg.extra_transports = vec![Arc::new(RdmaFactory { config: rdma })];
    Engine::new(cfg).expect("engine")
}

/// A target and an initiator on the emulated device; the initiator's provider, whose
/// faults a test may change.
fn rig(len: u64, deadline: Duration) -> (Pair, Arc<EmulatedProvider>) {
    rig_with(len, Some(deadline))
}

/// [`rig`] with any deadline, or none.
fn rig_with(len: u64, deadline: Option<Duration>) -> (Pair, Arc<EmulatedProvider>) {
    let provider = Arc::new(EmulatedProvider::new(EmulatedFaults::default()));
    let target = engine(
        Arc::new(EmulatedProvider::new(EmulatedFaults::default())),
        deadline,
    );
    let p = Pair::new(target, engine(provider.clone(), deadline), len);
    fill(&p.local, 3);
    (p, provider)
}

/// `n` blocks of `len` bytes over rdma only: local block `i` to remote block
/// `(i * 7) % n` (`n` not a multiple of 7), so no two neighbours merge.
fn scattered(p: &Pair, n: u64, len: u64) -> Blocks {
    assert!(n % 7 != 0);
    Blocks {
        opcode: Opcode::Write,
        local: PerBlock::One(p.local.id()),
        segment: PerBlock::One(p.seg),
        remote_buffer: PerBlock::One(p.remote.id()),
        local_offsets: (0..n).map(|i| i * len).collect(),
        remote_offsets: (0..n).map(|i| (i * 7 % n) * len).collect(),
        lengths: PerBlock::One(len),
        hint: TransportHint::Require(TransportKind::Rdma),
    }
}

fn every_byte_right(p: &Pair, blocks: &Blocks, len: u64) {
    for (b, (l, r)) in blocks
        .local_offsets
        .iter()
        .zip(&blocks.remote_offsets)
        .enumerate()
    {
        assert!(
            bytes_at(&p.local, *l, len) == bytes_at(&p.remote, *r, len),
            "block {b} differs"
        );
    }
}

fn run(p: &Pair, blocks: &Blocks, bound: Duration) -> (BlockOutcome, Duration) {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    p.initiator
        .transfer_blocks(blocks, move |o| {
            let _ = tx.send(o);
        })
        .expect("submitted");
    let outcome = rx.recv_timeout(bound).expect("the list ended");
    (outcome, started.elapsed())
}

fn count(outcome: &BlockOutcome, status: TransferStatus) -> usize {
    outcome
        .status
        .iter()
        .filter(|s| **s == status.raw())
        .count()
}

/// A list whose backlog takes many times the deadline to drain, on a healthy peer: before,
/// every attempt's deadline ran from submission and the list's tail ended TIMEOUT.
#[test]
fn a_block_list_longer_than_the_deadline_never_times_out_over_rdma() {
    within(Duration::from_secs(240), "long list", || {
        const N: u64 = 512 * 1024 + 1;
        const LEN: u64 = 2048;
        let deadline = Duration::from_secs(2);
        let (p, _) = rig(N * LEN, deadline);
        let blocks = scattered(&p, N, LEN);
        let (outcome, took) = run(&p, &blocks, Duration::from_secs(200));
        let timeouts = count(&outcome, TransferStatus::Timeout);
        eprintln!(
            "{N} blocks: {timeouts} TIMEOUT, {took:?}, {} attempt timeouts, first failure {:?}",
            p.initiator.metrics().attempt_timeouts,
            outcome.failed.first()
        );
        assert!(
            took > deadline,
            "the list took {took:?}: too short to prove anything"
        );
        assert_eq!(
            (timeouts, outcome.failed.len()),
            (0, 0),
            "{timeouts} of {N} blocks ended TIMEOUT in {took:?}"
        );
        assert_eq!(p.initiator.metrics().attempt_timeouts, 0);
        every_byte_right(&p, &blocks, LEN);
    });
}

/// The full-size figure: 1 M × 4 KiB blocks with a 1 s deadline (8 GiB of memory; run
/// with `--release -- --ignored`).
/// The measurement's deadline: `FERRY_FULL_SIZE_DEADLINE_MS` (0 = none), 1 s by default.
fn full_size_deadline() -> Option<Duration> {
    let ms = std::env::var("FERRY_FULL_SIZE_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    (ms > 0).then(|| Duration::from_millis(ms))
}

#[test]
#[ignore = "8 GiB and a minute of two cores: a measurement, not a check"]
fn full_size_1m_blocks_of_4k_with_a_1s_deadline() {
    const N: u64 = 1024 * 1024 + 1;
    const LEN: u64 = 4096;
    let deadline = full_size_deadline();
    let (p, _) = rig_with(N * LEN, deadline);
    let blocks = scattered(&p, N, LEN);
    let (outcome, took) = run(&p, &blocks, Duration::from_secs(600));
    let timeouts = count(&outcome, TransferStatus::Timeout);
    eprintln!(
        "rdma 1M x 4KiB, deadline {deadline:?}: {timeouts} TIMEOUT ({:.1} %), {} completed, {} tasks, {took:?}, {} attempt timeouts",
        100.0 * timeouts as f64 / N as f64,
        count(&outcome, TransferStatus::Completed),
        outcome.requests,
        p.initiator.metrics().attempt_timeouts,
    );
    assert_eq!(timeouts, 0);
    every_byte_right(&p, &blocks, LEN);
}

/// Mid-list, the initiator's device stops completing (every work request posted from then
/// on is lost silently) while the control link stays healthy: every task still pending
/// ends TIMEOUT within the deadline and a margin, the backlog behind the stuck endpoints
/// too (not after the longer rdma slice deadline).
#[test]
fn a_peer_that_stops_completing_mid_list_ends_every_task_within_the_deadline() {
    within(Duration::from_secs(120), "stuck peer", || {
        const N: u64 = 64 * 1024 + 1;
        const LEN: u64 = 4096;
        let deadline = Duration::from_millis(500);
        let margin = Duration::from_secs(2);
        let (p, provider) = rig(N * LEN, deadline);
        let blocks = scattered(&p, N, LEN);
        let batch = p.initiator.allocate_batch(1024).expect("batch");
        let sub = p
            .initiator
            .submit_blocks(batch, &blocks)
            .expect("submitted");
        let tasks = sub.map.starts.len() - 1;
        let completed = |snaps: &[ferry_core::TaskSnapshot]| {
            snaps
                .iter()
                .filter(|s| s.status == TransferStatus::Completed)
                .count()
        };
        let until = Instant::now() + Duration::from_secs(60);
        while completed(&p.initiator.transfer_status_list(batch).expect("list")) < 2 {
            assert!(Instant::now() < until, "the list never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        provider.set_faults(EmulatedFaults {
            silent_loss: 1.0,
            ..EmulatedFaults::default()
        });
        let stuck_at = Instant::now();
        let snaps = ferry_testkit::wait_batch(&p.initiator, batch, Duration::from_secs(60));
        let took = stuck_at.elapsed();
        let done = completed(&snaps);
        eprintln!(
            "{tasks} tasks: {done} completed, the rest ended {took:?} after the device stopped"
        );
        assert!(
            done < tasks,
            "the list ended before the device stopped: proves nothing"
        );
        for s in snaps
            .iter()
            .filter(|s| s.status != TransferStatus::Completed)
        {
            assert_eq!(s.status, TransferStatus::Timeout, "{s:?}");
        }
        assert!(
            took <= deadline + margin,
            "pending tasks ended {took:?} after the device stopped (deadline {deadline:?})"
        );
    });
}
