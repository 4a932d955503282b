//! The RDMA transport in cluster mode (etcd metadata) on the emulated verbs device: the
//! segment's name is logical ("kv-7"), not the peer's `host:port`, so the rdma handshake
//! must go to the control address from the peer's record, and to the new one after the
//! peer restarts elsewhere. Every transfer here requires rdma: a fallback to tcp would
//! hide a handshake that never reached the peer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, EtcdConfig, Opcode, Region, Request, TransferStatus, TransportHint,
    TransportKind,
};
use ferry_testkit::{bytes_of, fill, one, request, skip_without_etcd, within, EtcdServer};
use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
use ferry_verbs::{RdmaConfig, RdmaFactory};

const LEN: u64 = 1 << 20;

/// An engine on its own emulated device, registered in `etcd` under `name` (its
/// `host:port` when `None`), with rdma and tcp.
fn engine(etcd: &EtcdServer, name: Option<&str>) -> Engine {
    let rdma = RdmaConfig {
        provider_instance: Some(Arc::new(EmulatedProvider::new(EmulatedFaults::default()))),
        ..RdmaConfig::default()
    };
    Engine::new(EngineConfig {
        transports: vec![TransportKind::Rdma, TransportKind::Tcp],
        extra_transports: vec![Arc::new(RdmaFactory { config: rdma })],
        metadata: Some(EtcdConfig {
            segment_name: name.map(str::to_string),
            lease_ttl: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            ..EtcdConfig::from_url(&etcd.url()).expect("url")
        }),
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// A write of all of `local` into `remote` of segment `seg`, over rdma only.
fn rdma_write(local: &Region, seg: u64, remote: &Region) -> Request {
    Request {
        hint: TransportHint::Require(TransportKind::Rdma),
        verify: false,
        ..request(Opcode::Write, local, seg, remote, 0, LEN)
    }
}

/// Retries the write (bounded) until it completes over rdma, then checks the bytes landed.
fn write_until_done(initiator: &Engine, local: &Region, seg: u64, remote: &Region, what: &str) {
    let req = rdma_write(local, seg, remote);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let outcome = initiator
            .transfer_blocking(std::slice::from_ref(&req))
            .map(one);
        match &outcome {
            Ok(s) if s.status == TransferStatus::Completed => {
                assert_eq!(s.transport, Some(TransportKind::Rdma), "{what}: {s:?}");
                break;
            }
            _ => assert!(
                Instant::now() < deadline,
                "{what}: no rdma write within 20 s; last: {outcome:?}, rdma: {:?}",
                initiator.transport_reachable(seg, TransportKind::Rdma)
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(bytes_of(local) == bytes_of(remote), "{what}: bytes differ");
}

#[test]
fn rdma_reaches_a_logically_named_peer_through_its_etcd_record() {
    skip_without_etcd!();
    within(Duration::from_secs(90), "test body", || {
        let etcd = EtcdServer::start();
        let target = engine(&etcd, Some("kv-7"));
        let remote = target.allocate(LEN).expect("remote");
        let initiator = engine(&etcd, None);
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking("kv-7")
            .expect("open")
            .handle;
        assert_eq!(
            initiator
                .transport_reachable(seg, TransportKind::Rdma)
                .expect("segment"),
            Ok(()),
            "rdma is not set up towards kv-7"
        );
        fill(&local, 7);
        let snap = one(initiator
            .transfer_blocking(&[rdma_write(&local, seg, &remote)])
            .expect("transfer"));
        assert_eq!(snap.status, TransferStatus::Completed, "{:?}", snap.error);
        assert_eq!(snap.transport, Some(TransportKind::Rdma));
        assert!(bytes_of(&local) == bytes_of(&remote), "bytes differ");
        initiator.close();
        target.close();
    });
}

#[test]
fn after_a_restart_at_a_new_address_rdma_reaches_the_new_incarnation() {
    skip_without_etcd!();
    within(Duration::from_secs(90), "test body", || {
        let etcd = EtcdServer::start();
        let first = engine(&etcd, Some("kv-7"));
        let old = first.allocate(LEN).expect("old buffer");
        let initiator = engine(&etcd, None);
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking("kv-7")
            .expect("open")
            .handle;
        fill(&local, 1);
        write_until_done(&initiator, &local, seg, &old, "before the restart");
        let old_addr = first.local_addr();
        first.close();

        // The name comes back on another port: only the etcd record says where.
        let second = engine(&etcd, Some("kv-7"));
        assert_ne!(second.local_addr(), old_addr);
        let fresh = second.allocate(LEN).expect("fresh buffer");
        assert_eq!(fresh.id(), old.id(), "the buffer keeps its identity");
        fill(&local, 2);
        write_until_done(&initiator, &local, seg, &fresh, "after the restart");
        initiator.close();
        second.close();
    });
}
