//! Fenced cancel over rdma on the emulated device: a 256 MiB WRITE cancelled mid-flight
//! settles only once its posted work requests completed (or their queue pair was moved to
//! ERR), so nothing of it lands in the target afterwards. The target's whole buffer is
//! hashed at 0, ~100, ~250 and ~500 ms after it settled.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Engine, EngineConfig, Opcode, TransferStatus, TransportHint, TransportKind};
use ferry_testkit::{assert_still, fill, wait_first_bytes, Pair};
use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
use ferry_verbs::{RdmaConfig, RdmaFactory};

const SIZE: u64 = 256 << 20;

fn engine() -> Engine {
    let rdma = RdmaConfig {
        provider_instance: Some(Arc::new(EmulatedProvider::new(EmulatedFaults::default()))),
        ..RdmaConfig::default()
    };
    Engine::new(EngineConfig {
        transports: vec![TransportKind::Rdma, TransportKind::Tcp],
        peer_timeout: Duration::from_secs(5),
        extra_transports: vec![Arc::new(RdmaFactory { config: rdma })],
        ..EngineConfig::default()
    })
    .expect("engine")
}

#[test]
fn rdma_cancelled_write_lands_nothing_after_settling() {
    let r = Pair::new(engine(), engine(), SIZE);
    fill(&r.local, 3);
    let request = ferry_core::Request {
        hint: TransportHint::Require(TransportKind::Rdma),
        ..r.request(Opcode::Write, 0, SIZE)
    };
    let (tx, rx) = mpsc::channel();
    let op = r
        .initiator
        .transfer(&[request], move |s| {
            let _ = tx.send(s);
        })
        .expect("transfer");
    wait_first_bytes(&r.remote);
    let cancelled = r.initiator.cancel(op);
    let snaps = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the cancelled transfer settles");
    let expected = if cancelled {
        TransferStatus::Canceled
    } else {
        TransferStatus::Completed // the whole write finished first: nothing to fence
    };
    assert_eq!(snaps[0].status, expected);
    assert_still(&r.remote, "rdma");
}

#[test]
fn rdma_freed_batch_lands_nothing_after_free() {
    let r = Pair::new(engine(), engine(), SIZE);
    fill(&r.local, 5);
    let request = ferry_core::Request {
        hint: TransportHint::Require(TransportKind::Rdma),
        ..r.request(Opcode::Write, 0, SIZE)
    };
    let batch = r.initiator.allocate_batch(1).expect("batch");
    r.initiator
        .submit_transfer(batch, &[request])
        .expect("submit");
    wait_first_bytes(&r.remote);
    r.initiator.free_batch(batch).expect("free");
    assert_still(&r.remote, "rdma free");
}
