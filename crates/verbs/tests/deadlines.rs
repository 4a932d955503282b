//! Attempt deadlines over rdma count from when an attempt's first work requests are
//! posted: a block list far longer than the deadline ends with no TIMEOUT behind its own
//! backlog, while a peer that stops completing mid-list still ends every task within the
//! deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{Engine, EngineConfig, TransferStatus, TransportHint, TransportKind};
use ferry_testkit::lists::{
    assert_no_timeout, completed, full_size_deadline, report_full_size, run_list, scattered,
};
use ferry_testkit::{fill, within, Pair};
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

const RDMA: TransportHint = TransportHint::Require(TransportKind::Rdma);

/// A list whose backlog takes many times the deadline to drain, on a healthy peer: before,
/// every attempt's deadline ran from submission and the list's tail ended TIMEOUT.
#[test]
fn a_block_list_longer_than_the_deadline_never_times_out_over_rdma() {
    within(Duration::from_secs(240), "long list", || {
        const N: u64 = 512 * 1024 + 1;
        const LEN: u64 = 2048;
        let deadline = Duration::from_secs(2);
        let (p, _) = rig(N * LEN, deadline);
        let blocks = scattered(&p, N, LEN, RDMA);
        let ran = run_list(&p, &blocks, Duration::from_secs(200));
        assert_no_timeout(&p, &blocks, LEN, ran, deadline);
    });
}

/// The full-size figure: 1 M × 4 KiB blocks with a 1 s deadline (8 GiB of memory; run
/// with `--release -- --ignored`; `FERRY_FULL_SIZE_DEADLINE_MS` sets the deadline, 0 none).
#[test]
#[ignore = "8 GiB and a minute of two cores: a measurement, not a check"]
fn full_size_1m_blocks_of_4k_with_a_1s_deadline() {
    const N: u64 = 1024 * 1024 + 1;
    const LEN: u64 = 4096;
    let deadline = full_size_deadline();
    let (p, _) = rig_with(N * LEN, deadline);
    let blocks = scattered(&p, N, LEN, RDMA);
    let ran = run_list(&p, &blocks, Duration::from_secs(600));
    report_full_size("rdma 1M x 4KiB", &p, &blocks, LEN, ran, deadline);
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
        let blocks = scattered(&p, N, LEN, RDMA);
        let batch = p.initiator.allocate_batch(1024).expect("batch");
        let sub = p
            .initiator
            .submit_blocks(batch, &blocks)
            .expect("submitted");
        let tasks = sub.map.starts.len() - 1;
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
