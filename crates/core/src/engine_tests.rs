//! Engine teardown: what close releases, and what it leaves behind (nothing).

use super::*;
use crate::kind::{Opcode, TransportHint};
use std::time::Instant;

fn tcp_only() -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

fn write(local: &Region, seg: u64, remote: &Region, len: u64) -> Request {
    Request {
        opcode: Opcode::Write,
        local: local.id(),
        local_offset: 0,
        segment: seg,
        remote_buffer: remote.id(),
        remote_offset: 0,
        length: len,
        hint: TransportHint::Auto,
        verify: false,
    }
}

fn inner_of(e: &Engine) -> Weak<Inner> {
    Arc::downgrade(&e.inner())
}

#[test]
fn close_lets_go_of_the_engine_and_detaches_held_regions() {
    let target = Engine::new(tcp_only()).expect("target");
    let initiator = Engine::new(tcp_only()).expect("initiator");
    let remote = target.allocate(1 << 16).expect("remote");
    let local = initiator.allocate(1 << 16).expect("local");
    let p = local.range_ptr(0, 4096).expect("range");
    // SAFETY: the region is ours and nothing transfers into it yet.
    unsafe { std::ptr::write_bytes(p, 7, 4096) };
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let snaps = initiator
        .transfer_blocking(&[write(&local, seg.handle, &remote, 4096)])
        .expect("transfer");
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    let released = initiator.allocate(4096).expect("released");
    initiator.release(released.id()).expect("release");

    let weak = inner_of(&initiator);
    let name = initiator.segment_name().to_string();
    initiator.close();
    assert!(
        weak.upgrade().is_none(),
        "nothing keeps the closed engine's resources"
    );
    for r in [&local, &released] {
        assert!(!r.mapping().expect("owned").is_attached(), "memfd closed");
    }
    // SAFETY: the region's range stays mapped while we hold it; nothing writes it now.
    let bytes = unsafe { std::slice::from_raw_parts(p, 4096) };
    assert!(
        bytes.iter().all(|&b| b == 0),
        "a detached region reads zeros"
    );
    // The handle is an inert shell.
    assert!(initiator.is_closed());
    assert_eq!(
        initiator.allocate(1).unwrap_err().code(),
        "ERR_FERRY_CLOSED"
    );
    assert_eq!(
        initiator.allocate_batch(1).unwrap_err().code(),
        "ERR_FERRY_CLOSED"
    );
    assert!(!initiator.cancel(1));
    let m = initiator.metrics();
    assert_eq!((m.tasks_completed, m.segments_open, m.regions), (1, 0, 0));
    assert_eq!(initiator.segment_name(), name);
    initiator.close(); // idempotent
    target.close();
}

#[test]
fn dropping_the_last_handle_closes_the_engine() {
    let engine = Engine::new(tcp_only()).expect("engine");
    let region = engine.allocate(4096).expect("region");
    let weak = inner_of(&engine);
    drop(engine);
    assert!(weak.upgrade().is_none());
    assert!(!region.mapping().expect("owned").is_attached());
}

#[test]
fn ended_attempts_leave_no_deadline_behind() {
    let target = Engine::new(tcp_only()).expect("target");
    let initiator = Engine::new(tcp_only()).expect("initiator");
    let remote = target.allocate(1 << 16).expect("remote");
    let local = initiator.allocate(1 << 16).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let req = write(&local, seg.handle, &remote, 4096);
    for _ in 0..200 {
        initiator
            .transfer_blocking(std::slice::from_ref(&req))
            .expect("transfer");
    }
    let batch = initiator.allocate_batch(64).expect("batch");
    initiator
        .submit_transfer(batch, &vec![req.clone(); 64])
        .expect("submit");
    let deadline = Instant::now() + Duration::from_secs(20);
    while initiator.batch_status(batch).expect("status").status == TransferStatus::Pending {
        assert!(Instant::now() < deadline, "batch did not finish");
        std::thread::yield_now();
    }
    // Canceled tasks leave none either.
    let pending = initiator.allocate_batch(8).expect("batch");
    initiator
        .submit_transfer(pending, &vec![req; 8])
        .expect("submit");
    initiator.free_batch(pending).expect("free");
    let live = initiator.inner();
    assert_eq!(live.deadlines.len(), 0);
    assert_eq!(live.ops.lock().expect("ops").len(), 0);
    drop(live);
    initiator.close();
    target.close();
}

#[test]
fn close_ends_an_open_segment_that_the_peer_never_answers_with_closed() {
    // A listener that accepts and never replies.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    let (accepted_tx, accepted_rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let conn = silent.accept().map(|(c, _)| c);
        let _ = accepted_tx.send(());
        // Keep the connection open until the test ends (the sender side drops).
        conn
    });
    let mut cfg = tcp_only();
    cfg.tcp.connect_timeout = Duration::from_secs(30);
    let engine = Engine::new(cfg).expect("engine");
    let (tx, rx) = std::sync::mpsc::channel();
    let opener = engine.clone();
    let name = addr.to_string();
    let open = std::thread::spawn(move || {
        let _ = tx.send(opener.open_segment_blocking(&name));
    });
    accepted_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the engine connected");
    let started = Instant::now();
    engine.close();
    let result = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("open_segment ended");
    assert_eq!(result.unwrap_err().code(), "ERR_FERRY_CLOSED");
    assert!(started.elapsed() < Duration::from_secs(5));
    open.join().expect("opener");
    drop(holder.join().expect("holder"));
}
