//! `close()` releases an engine's descriptors deterministically. One test in this binary:
//! it counts the process's open descriptors, which other tests running beside it would
//! change.

use std::time::Duration;

use ferry_core::{Engine, EngineConfig, Opcode, Request, TransferStatus, TransportKind};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[test]
fn create_use_close_cycles_leave_no_descriptor_behind() {
    let cfg = EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        peer_timeout: Duration::from_millis(1000),
        ..EngineConfig::default()
    };
    // Each cycle has a target of its own and closes it too: a target notices a departed
    // initiator's connections (EOF) in its own time, which no count here should wait for.
    let cycle = |held: &mut Vec<std::sync::Arc<ferry_core::Region>>| {
        let target = Engine::new(cfg.clone()).expect("target");
        let remote = target.allocate(1 << 16).expect("remote");
        let e = Engine::new(cfg.clone()).expect("engine");
        let local = e.allocate(1 << 20).expect("allocate");
        let seg = e
            .open_segment_blocking(target.segment_name())
            .expect("open");
        for transport in [TransportKind::Shm, TransportKind::Tcp] {
            let snaps = e
                .transfer_blocking(&[Request {
                    opcode: Opcode::Write,
                    local: local.id(),
                    local_offset: 0,
                    segment: seg.handle,
                    remote_buffer: remote.id(),
                    remote_offset: 0,
                    length: 4096,
                    hint: ferry_core::TransportHint::Require(transport),
                    verify: false,
                }])
                .expect("transfer");
            assert_eq!(snaps[0].status, TransferStatus::Completed, "{transport:?}");
        }
        e.close();
        target.close();
        // Held past close, as a JS Buffer not yet collected holds its region.
        held.push(local);
    };
    let mut held = Vec::new();
    // One cycle first: lazily created process-wide state (the loggers, the resolver) is
    // not the engine's.
    cycle(&mut held);
    let before = open_fds();
    for _ in 0..50 {
        cycle(&mut held);
    }
    let after = open_fds();
    assert!(
        after <= before + 2,
        "{before} descriptors before 50 cycles, {after} after"
    );
    assert_eq!(held.len(), 51);
}
