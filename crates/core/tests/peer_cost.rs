//! What a peer costs in descriptors: one control connection from opening its segment, and
//! one data connection once it is written to now and then (the pool grows only with
//! demand). Alone in its test binary, so that no other test's descriptors are counted.

use std::time::{Duration, Instant};

use ferry_core::{Engine, EngineConfig, Opcode, TransferStatus, TransportKind};
use ferry_testkit::request;

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

#[test]
fn a_peer_opened_and_written_to_in_turn_holds_two_connections() {
    let cfg = EngineConfig {
        transports: vec![TransportKind::Tcp],
        ..EngineConfig::default()
    };
    let target = Engine::new(cfg.clone()).expect("target");
    let initiator = Engine::new(cfg).expect("initiator");
    let remote = target.allocate(1 << 20).expect("remote");
    let local = initiator.allocate(1 << 20).expect("local");
    let before = open_fds();

    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    // The control connection, both ends in this process.
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
