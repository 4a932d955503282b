//! What a peer costs in descriptors. Opening a segment makes one connection, the link
//! (control and heartbeats), and notifications ride on it; a tcp data connection is opened
//! once the peer is written to (the pool grows only with demand); shm on the same host
//! adds its socket, a pidfd per side, the life word and one memfd per buffer reached. Both ends of every connection are
//! in this process, so each connection counts twice. Alone in its test binary, so that no
//! other test's descriptors are counted; the tests run one after the other (one lock).
//!
//! These counts are the documented per-peer cost (README "Cluster", ARCHITECTURE.md):
//! a change that makes a peer hold more descriptors fails here.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_core::{Engine, EngineConfig, NotifyOutcome, Opcode, TransferStatus, TransportKind};
use ferry_testkit::request;

/// One test at a time: each counts this process's descriptors.
static SERIAL: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fd list").count()
}

/// Waits (at most 5 s) until this process holds `want` descriptors; what it holds then.
fn settle_at(want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = open_fds();
        if now == want || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn engines(transports: Vec<TransportKind>) -> (Engine, Engine) {
    let cfg = EngineConfig {
        transports,
        ..EngineConfig::default()
    };
    let target = Engine::new(cfg.clone()).expect("target");
    let initiator = Engine::new(cfg).expect("initiator");
    (target, initiator)
}

#[test]
fn a_peer_opened_and_written_to_in_turn_holds_two_connections() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (target, initiator) = engines(vec![TransportKind::Tcp]);
    let remote = target.allocate(1 << 20).expect("remote");
    let local = initiator.allocate(1 << 20).expect("local");
    let before = open_fds();

    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    // The link, both ends in this process.
    assert_eq!(settle_at(before + 2), before + 2, "after openSegment");

    for i in 0..4 {
        let done = initiator
            .transfer_blocking(&[request(Opcode::Write, &local, seg, &remote, i * 4096, 4096)])
            .expect("write");
        assert_eq!(done[0].status, TransferStatus::Completed, "{:?}", done[0]);
    }
    // One data connection more: writes one after the other never wait for each other, so
    // the pool does not grow.
    assert_eq!(settle_at(before + 4), before + 4, "after 4 writes in turn");
    initiator.close();
    target.close();
}

#[test]
fn notifications_ride_on_the_link() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (target, initiator) = engines(vec![TransportKind::Tcp]);
    let before = open_fds();
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    assert_eq!(settle_at(before + 2), before + 2, "after openSegment");
    for i in 0..3u8 {
        let got = initiator.notify_blocking(seg, &[i]).expect("notify");
        assert_eq!(got, NotifyOutcome::Queued);
    }
    assert_eq!(target.take_notifications(8).expect("take").len(), 3);
    // No connection of their own: open, ping and notify cost one connection.
    assert_eq!(settle_at(before + 2), before + 2, "after 3 notifications");
    initiator.close();
    target.close();
}

#[test]
fn a_same_host_peer_over_shm_holds_the_link_and_its_socket() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (target, initiator) = engines(vec![TransportKind::Shm, TransportKind::Tcp]);
    let remote = target.allocate(1 << 20).expect("remote");
    let local = initiator.allocate(1 << 20).expect("local");
    let before = open_fds();
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    let opened = settle_at(before + 8);
    for i in 0..4 {
        let done = initiator
            .transfer_blocking(&[request(Opcode::Write, &local, seg, &remote, i * 4096, 4096)])
            .expect("write");
        assert_eq!(done[0].status, TransferStatus::Completed, "{:?}", done[0]);
    }
    let got = initiator.notify_blocking(seg, b"done").expect("notify");
    assert_eq!(got, NotifyOutcome::Queued);
    let written = open_fds();
    eprintln!(
        "shm pair: {} fds after openSegment, {} after writes and a notification",
        opened - before,
        written - before
    );
    // The link and the shm socket (two ends each), a pidfd per side (the peer process's
    // liveness), the life word's memfd, and the memfd of the one remote buffer mapped.
    assert_eq!(opened, before + 8, "after openSegment");
    // Writes go over shm (no tcp data connection) and the notification over the link.
    assert_eq!(settle_at(before + 8), before + 8, "after writes and a notification");
    initiator.close();
    target.close();
}
