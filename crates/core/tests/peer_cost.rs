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
    assert_eq!(
        settle_at(before + 8),
        before + 8,
        "after writes and a notification"
    );
    initiator.close();
    target.close();
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// The figures of the README's "Cost of a peer": descriptors and resident memory per
/// opened pair (both sides, both in this process), after opening, after a 64 KiB write and
/// after a notification, for tcp alone and for shm on the same host. Prints them; run with
/// `cargo test -p ferry-core --test peer_cost -- --ignored --nocapture`.
#[test]
#[ignore = "prints figures; memory is too noisy to assert on a shared machine"]
fn figures_per_pair() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    const PAIRS: usize = 32;
    for transports in [
        vec![TransportKind::Tcp],
        vec![TransportKind::Shm, TransportKind::Tcp],
    ] {
        let target = engines(transports.clone()).0;
        let remote = target.allocate(1 << 20).expect("remote");
        let initiators: Vec<(Engine, std::sync::Arc<ferry_core::Region>)> = (0..PAIRS)
            .map(|_| {
                let cfg = EngineConfig {
                    transports: transports.clone(),
                    ..EngineConfig::default()
                };
                let e = Engine::new(cfg).expect("initiator");
                let local = e.allocate(64 << 10).expect("local");
                (e, local)
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let (fds0, rss0) = (open_fds(), rss());
        let segs: Vec<u64> = initiators
            .iter()
            .map(|(e, _)| {
                let seg = e.open_segment_blocking(target.segment_name());
                seg.expect("open").handle
            })
            .collect();
        let (fds1, rss1) = (open_fds(), rss());
        for ((e, local), seg) in initiators.iter().zip(&segs) {
            let req = request(Opcode::Write, local, *seg, &remote, 0, 64 << 10);
            let done = e.transfer_blocking(&[req]).expect("write");
            assert_eq!(done[0].status, TransferStatus::Completed);
        }
        let (fds2, rss2) = (open_fds(), rss());
        for ((e, _), seg) in initiators.iter().zip(&segs) {
            assert_eq!(e.notify_blocking(*seg, b"n"), Ok(NotifyOutcome::Queued));
        }
        let (fds3, rss3) = (open_fds(), rss());
        let per = |fds: usize, rss: u64| {
            format!(
                "{:.1} fds, {:.0} KiB",
                (fds - fds0) as f64 / PAIRS as f64,
                (rss.saturating_sub(rss0)) as f64 / 1024.0 / PAIRS as f64
            )
        };
        eprintln!(
            "{transports:?}, per pair (both sides): opened {}; after a 64 KiB write {}; \
             after a notification {}",
            per(fds1, rss1),
            per(fds2, rss2),
            per(fds3, rss3)
        );
        for (e, _) in initiators {
            e.close();
        }
        target.close();
    }
}
