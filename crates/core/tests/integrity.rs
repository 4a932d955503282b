//! End-to-end integrity (`verify`) over tcp, through a relay that flips one byte of the
//! data stream after the handshake: with `verify`, the corruption fails the request with
//! `ERR_FERRY_INTEGRITY` and nothing of a corrupted WRITE slice lands in the target;
//! without it, the corruption goes through unseen (what `verify` is for).

use std::time::Duration;

use ferry_core::{
    Engine, EngineConfig, Opcode, Region, Request, TaskSnapshot, TransferStatus, TransportHint,
    TransportKind,
};
use ferry_testkit::{bytes_at, fill, one, within, Flip, Proxy};

const LEN: u64 = 1 << 20;
const BOUND: Duration = Duration::from_secs(30);
/// Past the handshake (a few hundred bytes) and inside the first slice's payload.
const FLIP_AT: u64 = 100_000;

/// A target behind a proxy that flips a byte where `flip` says, and an initiator that
/// opened it through the proxy, over tcp alone; `verify_all` is the initiator's default.
struct Relayed {
    _proxy: Proxy,
    target: Engine,
    initiator: Engine,
    remote: std::sync::Arc<Region>,
    local: std::sync::Arc<Region>,
    seg: u64,
}

impl Relayed {
    fn new(flip: Flip, verify_all: bool) -> Self {
        Self::with_lanes(
            flip,
            verify_all,
            EngineConfig::default().tcp.connections_per_peer,
        )
    }

    /// The same with `lanes` data connections from the initiator to the target.
    fn with_lanes(flip: Flip, verify_all: bool, lanes: usize) -> Self {
        let tcp = vec![TransportKind::Tcp];
        let proxy = Proxy::start();
        proxy.corrupt(Some(flip));
        let target = Engine::new(EngineConfig {
            transports: tcp.clone(),
            advertise: Some(proxy.addr().to_string()),
            ..EngineConfig::default()
        })
        .expect("target");
        proxy.forward_to(target.local_addr());
        let mut config = EngineConfig {
            transports: tcp,
            verify: verify_all,
            ..EngineConfig::default()
        };
        config.tcp.connections_per_peer = lanes;
        let initiator = Engine::new(config).expect("initiator");
        let remote = target.allocate(LEN).expect("remote");
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        Self {
            _proxy: proxy,
            target,
            initiator,
            remote,
            local,
            seg,
        }
    }

    fn run(&self, opcode: Opcode, verify: bool) -> TaskSnapshot {
        let req = Request {
            opcode,
            local: self.local.id(),
            local_offset: 0,
            segment: self.seg,
            remote_buffer: self.remote.id(),
            remote_offset: 0,
            length: LEN,
            hint: TransportHint::Require(TransportKind::Tcp),
            verify,
        };
        one(self.initiator.transfer_blocking(&[req]).expect("transfer"))
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        self.initiator.close();
        self.target.close();
    }
}

fn to_target() -> Flip {
    Flip {
        to_target: true,
        at: FLIP_AT,
    }
}

fn to_initiator() -> Flip {
    Flip {
        to_target: false,
        at: FLIP_AT,
    }
}

fn assert_integrity_failure(snap: &TaskSnapshot) {
    assert_eq!(snap.status, TransferStatus::Failed, "{snap:?}");
    let error = snap.error.as_ref().expect("an error");
    assert_eq!(error.code(), "ERR_FERRY_INTEGRITY", "{error}");
}

#[test]
fn a_corrupted_verified_write_fails_and_lands_nothing() {
    within(BOUND, "verified write", || {
        let r = Relayed::new(to_target(), false);
        fill(&r.remote, 1);
        fill(&r.local, 2);
        let before = bytes_at(&r.remote, 0, LEN);
        let snap = r.run(Opcode::Write, true);
        assert_integrity_failure(&snap);
        assert_eq!(snap.attempts, 1, "an integrity failure is never retried");
        assert!(
            bytes_at(&r.remote, 0, LEN) == before,
            "no byte of the corrupted write landed in the target"
        );
        let m = r.initiator.metrics();
        assert!(
            m.integrity_failures.contains(&(TransportKind::Tcp, 1)),
            "{:?}",
            m.integrity_failures
        );
        assert!(m
            .to_prometheus()
            .contains("ferry_integrity_failures_total{transport=\"tcp\"} 1\n"));
    });
}

#[test]
fn a_verified_write_of_several_slices_lands_no_corrupted_slice() {
    within(BOUND, "verified write, second slice corrupted", || {
        // One lane: the 1 MiB WRITE's two 512 KiB slices follow each other on one stream,
        // and the flip lands in the second one's payload (past the first frame).
        let slice = EngineConfig::default().tcp.slice_size;
        assert_eq!(LEN, 2 * slice, "two slices");
        let flip = Flip {
            to_target: true,
            at: slice + FLIP_AT,
        };
        let r = Relayed::with_lanes(flip, false, 1);
        fill(&r.remote, 1);
        fill(&r.local, 2);
        let (old, source) = (bytes_at(&r.remote, 0, LEN), bytes_at(&r.local, 0, LEN));
        let snap = r.run(Opcode::Write, true);
        assert_integrity_failure(&snap);
        assert_eq!(snap.attempts, 1, "an integrity failure is never retried");
        // Each slice is checked before it lands: the corrupted one left its range as it
        // was; the other, checked and intact, landed whole. No other byte is there.
        let landed = bytes_at(&r.remote, 0, LEN);
        let half = slice as usize;
        let untouched = |range: std::ops::Range<usize>| landed[range.clone()] == old[range];
        let arrived = |range: std::ops::Range<usize>| landed[range.clone()] == source[range];
        assert!(
            (untouched(0..half) && arrived(half..2 * half))
                || (arrived(0..half) && untouched(half..2 * half)),
            "one slice landed whole and the corrupted one not at all"
        );
    });
}

#[test]
fn the_engine_default_verifies_every_request() {
    within(BOUND, "engine default", || {
        let r = Relayed::new(to_target(), true);
        fill(&r.remote, 1);
        fill(&r.local, 2);
        let before = bytes_at(&r.remote, 0, LEN);
        assert_integrity_failure(&r.run(Opcode::Write, false));
        assert!(bytes_at(&r.remote, 0, LEN) == before);
    });
}

#[test]
fn a_corrupted_verified_read_fails() {
    within(BOUND, "verified read", || {
        let r = Relayed::new(to_initiator(), false);
        fill(&r.remote, 3);
        fill(&r.local, 4);
        assert_integrity_failure(&r.run(Opcode::Read, true));
    });
}

#[test]
fn without_verify_the_corruption_goes_unseen() {
    within(BOUND, "unverified", || {
        let r = Relayed::new(to_target(), false);
        fill(&r.remote, 1);
        fill(&r.local, 2);
        let snap = r.run(Opcode::Write, false);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        let (landed, sent) = (bytes_at(&r.remote, 0, LEN), bytes_at(&r.local, 0, LEN));
        let differ = landed.iter().zip(&sent).filter(|(a, b)| a != b).count();
        // One byte flipped on each lane's stream that carried a slice.
        assert!(
            differ >= 1,
            "the flipped bytes landed, and nothing told the caller"
        );

        let r = Relayed::new(to_initiator(), false);
        fill(&r.remote, 3);
        let snap = r.run(Opcode::Read, false);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        let (landed, source) = (bytes_at(&r.local, 0, LEN), bytes_at(&r.remote, 0, LEN));
        assert!(landed.iter().zip(&source).any(|(a, b)| a != b));
    });
}

#[test]
fn a_clean_verified_transfer_completes() {
    within(BOUND, "clean", || {
        // A flip past every stream's end: nothing is corrupted.
        let r = Relayed::new(
            Flip {
                to_target: true,
                at: u64::MAX,
            },
            false,
        );
        fill(&r.local, 5);
        let snap = r.run(Opcode::Write, true);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert!(bytes_at(&r.remote, 0, LEN) == bytes_at(&r.local, 0, LEN));
        fill(&r.remote, 6);
        let snap = r.run(Opcode::Read, true);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert!(bytes_at(&r.remote, 0, LEN) == bytes_at(&r.local, 0, LEN));
    });
}

#[test]
fn a_verified_shm_transfer_is_checked_and_completes() {
    within(BOUND, "shm", || {
        let shm = vec![TransportKind::Shm];
        let config = || EngineConfig {
            transports: shm.clone(),
            ..EngineConfig::default()
        };
        let target = Engine::new(config()).expect("target");
        let initiator = Engine::new(config()).expect("initiator");
        let remote = target.allocate(LEN).expect("remote");
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        fill(&local, 7);
        for opcode in [Opcode::Write, Opcode::Read] {
            let req = Request {
                opcode,
                local: local.id(),
                local_offset: 0,
                segment: seg,
                remote_buffer: remote.id(),
                remote_offset: 0,
                length: LEN,
                hint: TransportHint::Require(TransportKind::Shm),
                verify: true,
            };
            let snap = one(initiator.transfer_blocking(&[req]).expect("transfer"));
            assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
            assert!(bytes_at(&remote, 0, LEN) == bytes_at(&local, 0, LEN));
        }
        initiator.close();
        target.close();
    });
}
