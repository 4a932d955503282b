//! Notifying bench workers against a target that stops acknowledging notifications, two
//! engines in one process: the workers hold back once their engine has [`NOTIFY_WINDOW`]
//! notifications in flight, resume when the acks come, and give up with a failure naming
//! the backlog when none come. Every wait is bounded: a hang fails the test.
//!
//! How the target stops acknowledging: its application's notification handler (the inbox
//! waker) blocks until the test releases it. A target serves each sender's notification
//! connection in order and acknowledges a notification once it was offered to its inbox, so
//! while the handler is held, nothing after the first notification is acknowledged. The
//! data moves over shared memory, which the target's threads take no part in.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferry_bench::{bench_gate, Addressing, BenchSpec, GateHooks, RunError, Stripe, NOTIFY_WINDOW};
use ferry_core::{Engine, EngineConfig, Opcode, TransferStatus, TransportKind};
use ferry_testkit::{within, Pair};

const BOUND: Duration = Duration::from_secs(30);
const WORKERS: usize = 2;
const STRIPE: u64 = 64 << 10;

/// A notification handler that blocks while held (each wait bounded by [`BOUND`]).
#[derive(Default)]
struct Hold {
    released: Mutex<bool>,
    cv: Condvar,
}

impl Hold {
    fn wait(&self) {
        let released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.cv.wait_timeout_while(released, BOUND, |r| !*r);
    }

    fn release(&self) {
        *self.released.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// Releases the hold when dropped, so that a failed assertion does not leave the target's
/// thread blocked.
struct Release(Arc<Hold>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release();
    }
}

fn shm(peer_timeout: Duration) -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Shm],
        peer_timeout,
        io_threads: 2,
        ..EngineConfig::default()
    }
}

/// A target whose notification handler is held, an initiator, and a notifying spec of
/// `duration` over shared memory.
fn held(duration: Duration, stall_timeout: Duration) -> (Pair, Arc<Hold>, BenchSpec) {
    let target = Engine::new(shm(Duration::from_secs(3))).expect("target");
    // The held notifications must not reach their deadline (peer timeout + connect
    // timeout) while the test holds them.
    let initiator = Engine::new(shm(Duration::from_secs(120))).expect("initiator");
    let pair = Pair::new(target, initiator, WORKERS as u64 * STRIPE);
    let hold = Arc::new(Hold::default());
    let h = hold.clone();
    pair.target
        .set_notification_waker(Some(Arc::new(move |_| h.wait())));
    let spec = BenchSpec {
        opcode: Opcode::Write,
        block_size: 4096,
        batch_size: 1,
        local: pair.local.id(),
        segment: pair.seg,
        peer: pair.peer.clone(),
        remote_buffer: pair.remote.id(),
        extra_targets: Vec::new(),
        stripe: Stripe {
            base: 0,
            len: STRIPE,
        },
        addressing: Addressing::Walk,
        transport: Some(TransportKind::Shm),
        duration,
        warmup: Duration::ZERO,
        request_interval_us: 0,
        stall_timeout,
        notify: true,
    };
    (pair, hold, spec)
}

/// Polls `done` until it holds; panics (naming `what`) after [`BOUND`] or once `ended`
/// says the run is over.
fn wait_until(what: &str, ended: impl Fn() -> bool, done: impl Fn() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !done() {
        assert!(!ended(), "the run ended before {what}");
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn notifying_workers_hold_back_at_the_window_and_resume_when_acks_come() {
    // Long enough never to end by itself: the test stops it.
    let (pair, hold, spec) = held(Duration::from_secs(600), Duration::from_secs(60));
    let _release = Release(hold.clone());
    let gate =
        Arc::new(bench_gate(pair.initiator.clone(), WORKERS, GateHooks::default()).expect("gate"));
    let (tx, rx) = mpsc::channel();
    let g = gate.clone();
    std::thread::spawn(move || {
        let _ = tx.send(g.run(spec));
    });
    let (ini, tgt) = (&pair.initiator, &pair.target);
    let ended = || gate.is_stopped();

    // The target acknowledges nothing: the window fills.
    wait_until("the window filled", ended, || {
        ini.notifications_in_flight() >= NOTIFY_WINDOW
    });
    // Then the workers submit nothing more: over an interval that, without the window,
    // would see thousands of operations, at most each worker's operation under way then.
    let submitted = ini.metrics().tasks_submitted;
    std::thread::sleep(Duration::from_millis(300));
    let in_flight = ini.notifications_in_flight();
    let later = ini.metrics().tasks_submitted;
    assert!(
        in_flight < NOTIFY_WINDOW + WORKERS as u64,
        "{in_flight} notifications in flight, window {NOTIFY_WINDOW}"
    );
    assert!(
        later - submitted <= WORKERS as u64,
        "{} submissions while the window was full",
        later - submitted
    );
    assert_eq!(ini.metrics().notifications.failed, 0);
    assert!(
        tgt.metrics().notifications.received <= 1,
        "the target is held"
    );

    // The acks come: the workers submit again, past another window's worth.
    hold.release();
    wait_until("the workers resumed", ended, || {
        ini.metrics().tasks_submitted > later + NOTIFY_WINDOW
    });
    within(BOUND, "stop", {
        let g = gate.clone();
        move || g.stop()
    });
    match rx.recv_timeout(BOUND).expect("the run returned") {
        Err(RunError::Stopped { partial }) => {
            assert_eq!(partial.len(), WORKERS);
            let ops: u64 = partial.iter().map(|s| s.ops).sum();
            assert!(ops > 2 * NOTIFY_WINDOW, "{ops} operations");
        }
        other => panic!("expected a stopped run, got {other:?}"),
    }
    // Every notification sent was delivered: none lost to a deadline.
    wait_until(
        "the backlog drained",
        || false,
        || ini.notifications_in_flight() == 0,
    );
    let sent = ini.metrics().notifications;
    assert_eq!(sent.failed, 0, "{sent:?}");
    assert_eq!(sent.delivered, sent.sent, "{sent:?}");
    let got = tgt.metrics().notifications;
    assert_eq!(got.received + got.dropped, sent.sent, "{got:?}");
}

#[test]
fn a_backlog_that_does_not_drain_fails_the_workers_naming_it() {
    let stall = Duration::from_secs(1);
    let (pair, hold, spec) = held(Duration::from_secs(600), stall);
    let _release = Release(hold);
    let gate =
        Arc::new(bench_gate(pair.initiator.clone(), WORKERS, GateHooks::default()).expect("gate"));
    let g = gate.clone();
    let started = Instant::now();
    let result = within(
        BOUND,
        "a run against a target that never acknowledges",
        move || g.run(spec),
    );
    match result {
        Err(RunError::Failed(f)) => {
            assert_eq!(f.status, TransferStatus::Timeout, "{f}");
            assert!(f.reason.contains("notification backlog"), "{f}");
            assert!(f.request.contains("notification room"), "{f}");
            assert_eq!(f.peer, pair.peer, "{f}");
            assert!(f.worker.is_some(), "{f}");
        }
        other => panic!("expected a TIMEOUT failure, got {other:?}"),
    }
    assert!(started.elapsed() >= stall);
    assert!(pair.initiator.notifications_in_flight() >= NOTIFY_WINDOW);
    within(BOUND, "stop", move || gate.stop());
}
