//! Notifications riding on rdma writes, on the emulated device. The notification is a
//! control message sent after the completion (not WRITE WITH IMMEDIATE): it relies on what
//! the device models — a WRITE completes at the initiator only once the responder placed
//! its bytes in the target's memory — and on nothing else of rdma.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::failover::FailoverPolicy;
use ferry_core::{Engine, EngineConfig, Opcode, Request, TransferStatus, TransportKind};
use ferry_testkit::notes::{handler, payloads, wait_for};
use ferry_testkit::{bytes_of, fill, within, Pair};
use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
use ferry_verbs::{RdmaConfig, RdmaFactory};

fn engine(faults: EmulatedFaults, budget: u32) -> Engine {
    let rdma = RdmaConfig {
        provider_instance: Some(Arc::new(EmulatedProvider::new(faults))),
        ..RdmaConfig::default()
    };
    Engine::new(EngineConfig {
        transports: vec![TransportKind::Rdma, TransportKind::Tcp],
        failover: FailoverPolicy {
            max_failover_attempts: budget,
            ..FailoverPolicy::default()
        },
        extra_transports: vec![Arc::new(RdmaFactory { config: rdma })],
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn rig(initiator: Engine) -> Pair {
    let r = Pair::new(engine(EmulatedFaults::default(), 3), initiator, 8 << 20);
    fill(&r.local, 3);
    r
}

fn rdma(r: &Pair, offset: u64, length: u64, require: bool) -> Request {
    Request {
        hint: if require {
            ferry_core::TransportHint::Require(TransportKind::Rdma)
        } else {
            ferry_core::TransportHint::Prefer(TransportKind::Rdma)
        },
        ..r.request(Opcode::Write, offset, length)
    }
}

/// Runs a notifying transfer; its statuses, transports and delivery error code.
fn send(
    r: &Pair,
    reqs: &[Request],
    note: &str,
) -> (Vec<(TransferStatus, Option<TransportKind>)>, Option<String>) {
    let (tx, rx) = mpsc::channel();
    r.initiator
        .transfer_notify(reqs, note.as_bytes().to_vec(), move |snaps, err| {
            let _ = tx.send((
                snaps.iter().map(|s| (s.status, s.transport)).collect(),
                err.map(|e| e.code().to_string()),
            ));
        })
        .expect("submit");
    rx.recv_timeout(Duration::from_secs(30)).expect("ended")
}

#[test]
fn after_the_completion_the_bytes_are_there() {
    within(Duration::from_secs(60), "rdma notify", || {
        // A slow completion path must not let the notification overtake the data.
        let slow = EmulatedFaults {
            delay: Duration::from_millis(20),
            ..EmulatedFaults::default()
        };
        let r = rig(engine(slow, 3));
        let (seen, ticks) = handler(&r, bytes_of(&r.local));
        for i in 0..8u64 {
            let off = i << 20;
            let (done, err) = send(
                &r,
                &[rdma(&r, off, 1 << 20, true)],
                &format!("{off}:1048576"),
            );
            assert_eq!(
                done,
                [(TransferStatus::Completed, Some(TransportKind::Rdma))]
            );
            assert_eq!(err, None);
        }
        wait_for(&ticks, 8);
        let seen = seen.lock().expect("seen");
        assert_eq!(seen.len(), 8);
        assert!(
            seen.iter().all(|(_, landed)| *landed),
            "every range was in place"
        );
        assert!(seen
            .iter()
            .all(|(n, _)| n.from == r.initiator.segment_name()));
    });
}

#[test]
fn rdma_failing_over_notifies_once_and_failing_without_failover_not_at_all() {
    within(Duration::from_secs(60), "rdma failover", || {
        // Every rdma WRITE is NAKed without touching memory: with a budget, the tasks move
        // to tcp and the call notifies once; pinned to rdma, it fails and notifies nothing.
        let naks = EmulatedFaults {
            remote_access: 1.0,
            ..EmulatedFaults::default()
        };
        let r = rig(engine(naks, 3));
        let (seen, ticks) = handler(&r, bytes_of(&r.local));
        let (done, err) = send(&r, &[rdma(&r, 0, 1 << 20, true)], "pinned");
        assert_eq!(done[0].0, TransferStatus::Failed);
        assert_eq!(err, None);
        let reqs: Vec<Request> = (0..4).map(|i| rdma(&r, i << 20, 1 << 20, false)).collect();
        let (done, err) = send(&r, &reqs, "0:4194304");
        assert_eq!(
            done,
            [(TransferStatus::Completed, Some(TransportKind::Tcp)); 4]
        );
        assert_eq!(err, None);
        r.initiator
            .notify_blocking(r.seg, b"barrier")
            .expect("barrier");
        wait_for(&ticks, 2);
        assert_eq!(payloads(&seen), ["0:4194304", "barrier"]);
        assert!(seen.lock().expect("seen")[0].1, "all 4 MiB were in place");
    });
}
