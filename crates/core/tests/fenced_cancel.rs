//! Fenced cancel: once a cancelled (or freed) transfer has settled, nothing of it lands in
//! the target any more. Each test starts a 256 MiB WRITE, waits until its first bytes
//! landed in the target (so it is mid-flight, whatever the machine's speed), cancels it,
//! waits for it to settle, and then hashes the target's whole buffer at 0, ~100, ~250 and
//! ~500 ms: the observation window in which a late byte would show (`ferry_testkit::still`).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, Opcode, Region, Request, TransferStatus, TransportHint, TransportKind,
};
use ferry_testkit::{assert_still, fill, request, wait_first_bytes, Proxy};

const SIZE: u64 = 256 << 20;

fn engines(transports: Vec<TransportKind>) -> (Engine, Engine) {
    let cfg = EngineConfig {
        transports,
        peer_timeout: Duration::from_secs(5),
        ..EngineConfig::default()
    };
    (
        Engine::new(cfg.clone()).expect("target"),
        Engine::new(cfg).expect("initiator"),
    )
}

fn write_request(local: &Region, segment: u64, remote: &Region, kind: TransportKind) -> Request {
    Request {
        hint: TransportHint::Require(kind),
        ..request(Opcode::Write, local, segment, remote, 0, SIZE)
    }
}

/// A 256 MiB write through `transfer`, cancelled mid-flight: once its callback ran, the
/// target's buffer stays as it is.
fn cancelled_write_lands_nothing_after_settling(kind: TransportKind) {
    let (target, initiator) = engines(vec![kind]);
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    fill(&local, 7);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let (tx, rx) = mpsc::channel();
    let op = initiator
        .transfer(
            &[write_request(&local, seg.handle, &remote, kind)],
            move |s| {
                let _ = tx.send(s);
            },
        )
        .expect("transfer");
    wait_first_bytes(&remote);
    let cancelled = initiator.cancel(op);
    let snaps = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the cancelled transfer settles");
    if !cancelled {
        // The whole write finished before the cancel: nothing to fence.
        assert_eq!(snaps[0].status, TransferStatus::Completed);
    } else {
        assert_eq!(snaps[0].status, TransferStatus::Canceled);
    }
    assert_still(&remote, kind.name());
    initiator.close();
    target.close();
}

#[test]
fn tcp_cancelled_write_lands_nothing_after_settling() {
    cancelled_write_lands_nothing_after_settling(TransportKind::Tcp);
}

#[test]
fn shm_cancelled_write_lands_nothing_after_settling() {
    cancelled_write_lands_nothing_after_settling(TransportKind::Shm);
}

/// A polled batch freed before its 256 MiB write completed: once `free_batch` returned,
/// the target's buffer stays as it is.
fn freed_batch_lands_nothing_after_free(kind: TransportKind) {
    let (target, initiator) = engines(vec![kind]);
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    fill(&local, 9);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let batch = initiator.allocate_batch(1).expect("batch");
    initiator
        .submit_transfer(batch, &[write_request(&local, seg.handle, &remote, kind)])
        .expect("submit");
    wait_first_bytes(&remote);
    initiator.free_batch(batch).expect("free");
    assert_still(&remote, kind.name());
    initiator.close();
    target.close();
}

#[test]
fn tcp_freed_batch_lands_nothing_after_free() {
    freed_batch_lands_nothing_after_free(TransportKind::Tcp);
}

#[test]
fn shm_freed_batch_lands_nothing_after_free() {
    freed_batch_lands_nothing_after_free(TransportKind::Shm);
}

/// A target behind a proxy that the test can pause (a slow network), tcp only.
fn proxied() -> (Proxy, Engine, Engine) {
    let proxy = Proxy::start();
    let cfg = EngineConfig {
        transports: vec![TransportKind::Tcp],
        peer_timeout: Duration::from_secs(5),
        ..EngineConfig::default()
    };
    let target = Engine::new(EngineConfig {
        listen: "127.0.0.1:0".into(),
        advertise: Some(proxy.addr().to_string()),
        ..cfg.clone()
    })
    .expect("target");
    proxy.forward_to(target.local_addr());
    (proxy, target, Engine::new(cfg).expect("initiator"))
}

/// Resumes `proxy` 200 ms from now, on a thread of its own: frames written before the
/// cancel reach the target only then, as over a congested link.
fn resume_later(proxy: &std::sync::Arc<Proxy>) -> std::thread::JoinHandle<()> {
    let proxy = proxy.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        proxy.resume();
    })
}

/// Waits (bounded) until the paused proxy holds at least a MiB: frames the initiator
/// wrote that have not reached the target.
fn wait_held(proxy: &Proxy) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.held() < (1 << 20) {
        assert!(
            Instant::now() < deadline,
            "nothing written towards the paused target"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Opens the target and warms its data connection (a small write through the proxy).
fn opened_and_warm(initiator: &Engine, target: &Engine, local: &Region, remote: &Region) -> u64 {
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let warm = Request {
        hint: TransportHint::Require(TransportKind::Tcp),
        ..request(Opcode::Write, local, seg.handle, remote, SIZE - 4096, 4096)
    };
    let snaps = initiator.transfer_blocking(&[warm]).expect("warm-up");
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    seg.handle
}

/// Frames written before the cancel are held on the way (a paused proxy) and reach the
/// target only after it: the cancel settles only once the target answered them, so none
/// lands after. Deterministic: the cancel comes while the proxy holds written frames.
#[test]
fn tcp_cancel_behind_a_slow_network_settles_after_the_written_frames_landed() {
    let (proxy, target, initiator) = proxied();
    let proxy = std::sync::Arc::new(proxy);
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    fill(&local, 11);
    let segment = opened_and_warm(&initiator, &target, &local, &remote);
    proxy.pause();
    let (tx, rx) = mpsc::channel();
    let op = initiator
        .transfer(
            &[write_request(&local, segment, &remote, TransportKind::Tcp)],
            move |s| {
                let _ = tx.send(s);
            },
        )
        .expect("transfer");
    wait_held(&proxy);
    assert!(
        initiator.cancel(op),
        "a write held on its way is still pending"
    );
    let resumer = resume_later(&proxy);
    let snaps = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the cancelled transfer settles");
    assert_eq!(snaps[0].status, TransferStatus::Canceled);
    assert_still(&remote, "tcp behind a slow network");
    resumer.join().expect("resumer");
    initiator.close();
    target.close();
}

/// As above, for a batch freed mid-flight: `free_batch` returns once the written frames
/// were answered.
#[test]
fn tcp_free_behind_a_slow_network_returns_after_the_written_frames_landed() {
    let (proxy, target, initiator) = proxied();
    let proxy = std::sync::Arc::new(proxy);
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    fill(&local, 13);
    let segment = opened_and_warm(&initiator, &target, &local, &remote);
    proxy.pause();
    let batch = initiator.allocate_batch(1).expect("batch");
    initiator
        .submit_transfer(
            batch,
            &[write_request(&local, segment, &remote, TransportKind::Tcp)],
        )
        .expect("submit");
    wait_held(&proxy);
    let resumer = resume_later(&proxy);
    initiator.free_batch(batch).expect("free");
    assert_still(&remote, "tcp free behind a slow network");
    resumer.join().expect("resumer");
    initiator.close();
    target.close();
}
