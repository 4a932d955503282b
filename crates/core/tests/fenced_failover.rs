//! A failover retry never races its predecessor's bytes, end to end: a large tcp WRITE
//! whose frames are held on the way (a paused relay) loses one of its data connections, so
//! its attempt fails and the task fails over to shm. The retry may start only once the
//! first attempt's frames still in flight were answered (`fence`): the test holds those
//! frames, sees the failover decided and the retry not begun while they are held, lets
//! them through, and checks that nothing of the first attempt lands over the retry's bytes,
//! nor over what the caller writes into the target once the task settled.

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::failover::FailoverPolicy;
use ferry_core::{
    Engine, EngineConfig, EngineEvent, Opcode, Region, Request, TaskSnapshot, TransferStatus,
    TransportHint, TransportKind,
};
use ferry_testkit::{assert_still, fill, hash_region, request, wait_batch, within, Proxy};

const SIZE: u64 = 64 << 20;
/// What each of two data connections holds in the relay before one is cut: frames of the
/// first attempt written and not yet answered.
const HELD: u64 = 1 << 20;
/// Bound of every wait on the engines (a loaded 2-core machine).
const BOUND: Duration = Duration::from_secs(60);

/// Both engines on this host (shm and tcp), two tcp data connections per peer; the
/// target's advertised address is the relay, so its tcp traffic goes through it. Peer and
/// attempt deadlines far beyond the test's pause, so that only the cut fails the attempt.
fn engines(proxy: &Proxy) -> (Engine, Engine) {
    let mut cfg = EngineConfig {
        transports: vec![TransportKind::Tcp, TransportKind::Shm],
        peer_timeout: BOUND,
        failover: FailoverPolicy {
            attempt_timeout: Some(BOUND),
            ..FailoverPolicy::default()
        },
        ..EngineConfig::default()
    };
    cfg.tcp.connections_per_peer = 2;
    let target = Engine::new(EngineConfig {
        listen: "127.0.0.1:0".into(),
        advertise: Some(proxy.addr().to_string()),
        ..cfg.clone()
    })
    .expect("target");
    proxy.forward_to(target.local_addr());
    (target, Engine::new(cfg).expect("initiator"))
}

/// Waits (bounded) until `ok` holds.
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn status(engine: &Engine, batch: u64) -> TaskSnapshot {
    engine.transfer_status(batch, 0).expect("status")
}

/// A 64 MiB tcp write failing over to shm with its first attempt's frames held: the relay
/// holds frames on two data connections, one of them is cut, and the failover is decided;
/// the other's frames are still held, unanswered.
struct HeldFailover {
    proxy: Proxy,
    target: Engine,
    initiator: Engine,
    remote: Arc<Region>,
    /// The hash of the source once the first attempt's frames were held: what the retry
    /// carries (pattern B; the held frames carry A).
    retry_hash: u64,
}

/// Sets up [`HeldFailover`]; `submit` starts the write (a batch or a Promise-style call).
fn held_failover(submit: impl FnOnce(&Engine, Request)) -> HeldFailover {
    let proxy = Proxy::start();
    let (target, initiator) = engines(&proxy);
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    let failovers = Arc::new(Mutex::new(Vec::new()));
    let sink = failovers.clone();
    initiator.set_event_sink(Some(Arc::new(move |e| {
        if let EngineEvent::Failover { from, to, .. } = e {
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((from, to));
        }
    })));

    // Both data connections open (a write of two slices goes out on both), then held.
    fill(&local, 21);
    let warm = Request {
        hint: TransportHint::Require(TransportKind::Tcp),
        ..request(Opcode::Write, &local, seg, &remote, 0, 1 << 20)
    };
    let warmed = initiator.transfer_blocking(&[warm]).expect("warm-up");
    assert_eq!(warmed[0].status, TransferStatus::Completed);
    proxy.pause();

    // The first attempt (tcp) carries pattern A; once both connections hold its frames,
    // the source turns to pattern B, which the retry carries.
    let write = Request {
        hint: TransportHint::Prefer(TransportKind::Tcp),
        ..request(Opcode::Write, &local, seg, &remote, 0, SIZE)
    };
    submit(&initiator, write);
    let mut busy = Vec::new();
    wait_until("both data connections hold written frames", || {
        busy = proxy.holding();
        busy.retain(|&(_, bytes)| bytes >= HELD);
        busy.len() >= 2
    });
    fill(&local, 22);
    let retry_hash = hash_region(&local);

    // One connection breaks: its frames fail, and with them the attempt; the other's
    // frames are still held, unanswered.
    proxy.cut_connection(busy[0].0);
    wait_until("the failover to shm is decided", || {
        !failovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    });
    assert_eq!(
        failovers.lock().unwrap_or_else(|p| p.into_inner())[0],
        (TransportKind::Tcp, TransportKind::Shm)
    );
    HeldFailover {
        proxy,
        target,
        initiator,
        remote,
        retry_hash,
    }
}

#[test]
fn a_failover_retry_never_races_its_predecessors_bytes() {
    let mut batch = 0;
    let HeldFailover {
        proxy,
        target,
        initiator,
        remote,
        retry_hash,
    } = held_failover(|initiator, write| {
        batch = initiator.allocate_batch(1).expect("batch");
        initiator.submit_transfer(batch, &[write]).expect("submit");
    });

    // The retry waits for the held frames: watched for the observation window of
    // `assert_still`, or until the task ended (a retry that did not wait would have run
    // its copy by then, and the held frames would land after it).
    let mut early = None;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_millis(500) {
        let s = status(&initiator, batch);
        let ended = s.status.is_terminal();
        if s.attempts > 1 || ended {
            early.get_or_insert(s);
        }
        if ended {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    // The held frames land (pattern A), are answered, and only then does the retry run.
    proxy.resume();
    let snaps = wait_batch(&initiator, batch, BOUND);
    assert_eq!(
        (snaps[0].status, snaps[0].transport, snaps[0].attempts),
        (TransferStatus::Completed, Some(TransportKind::Shm), 2),
        "{:?}",
        snaps[0]
    );
    assert_eq!(
        hash_region(&remote),
        retry_hash,
        "the retry's bytes (pattern B) were overwritten by its predecessor's"
    );

    assert!(
        early.is_none(),
        "the retry began while its predecessor's frames were still held: {early:?}"
    );

    // The caller reuses the target at once: nothing of either attempt lands any more.
    fill(&remote, 23);
    let reused = hash_region(&remote);
    assert_still(&remote, "a failed-over tcp write");
    assert_eq!(hash_region(&remote), reused);
    initiator.free_batch(batch).expect("free");
    initiator.close();
    target.close();
}

/// The engine closes (by `close`) while a failover's next attempt waits for its
/// predecessor's held frames: close returns, the task settles once with `ERR_FERRY_CLOSED`
/// (no panic, no hang), and the retry never runs: nothing lands in the target after close,
/// even once the relay lets go of what it held.
fn a_deferred_retry_never_runs_once_the_engine_closed(close: impl FnOnce(&Engine)) {
    let (tx, rx) = mpsc::channel();
    let HeldFailover {
        proxy,
        target,
        initiator,
        remote,
        retry_hash,
    } = held_failover(move |initiator, write| {
        initiator
            .transfer(&[write], move |s| {
                let _ = tx.send(s);
            })
            .expect("transfer");
    });
    assert!(
        rx.try_recv().is_err(),
        "the transfer settled while its frames were held"
    );
    close(&initiator);
    let snaps = rx
        .recv_timeout(BOUND)
        .expect("the transfer settles at close");
    assert_eq!(snaps[0].status, TransferStatus::Canceled, "{:?}", snaps[0]);
    assert_eq!(
        snaps[0].error.as_ref().map(|e| e.code()),
        Some("ERR_FERRY_CLOSED"),
        "{:?}",
        snaps[0]
    );
    assert_eq!(snaps[0].attempts, 1, "the retry began: {:?}", snaps[0]);
    wait_until("the engine is closed", || initiator.is_closed());
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "settled twice"
    );
    proxy.resume();
    assert_still(&remote, "a write whose engine closed during its failover");
    assert_ne!(
        hash_region(&remote),
        retry_hash,
        "the retry ran after close"
    );
    target.close();
}

#[test]
fn a_deferred_retry_never_runs_once_the_engine_closed_from_outside() {
    a_deferred_retry_never_runs_once_the_engine_closed(|initiator| {
        let initiator = initiator.clone();
        within(BOUND, "close", move || initiator.close());
    });
}

/// Closed from the engine's own runtime (its I/O threads), which then shuts down in the
/// background while the held connections still drop.
#[test]
fn a_deferred_retry_never_runs_once_the_engine_closed_from_its_runtime() {
    a_deferred_retry_never_runs_once_the_engine_closed(|initiator| {
        let closing = initiator.clone();
        initiator
            .spawn(async move { closing.close() })
            .expect("spawn");
    });
}
