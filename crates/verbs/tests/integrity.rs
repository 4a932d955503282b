//! End-to-end integrity (`verify`) over rdma, on the emulated device: a verified WRITE is
//! checked by the target (its CRC32C of the range against the source's, sent after the
//! completions) and a verified READ by the initiator (the target's CRC32C of the range
//! against the bytes that landed). The device's `corrupt` fault flips one byte of what each
//! work request carries: with `verify` the request fails with `ERR_FERRY_INTEGRITY`, is
//! counted, and is not retried into success over tcp; without it the corruption goes
//! through unseen.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::blocks::{Blocks, PerBlock};
use ferry_core::memory::{Region, RegionId};
use ferry_core::segment::Peer;
use ferry_core::transport::{Attempt, BoxFuture, Transport, TransportContext, TransportFactory};
use ferry_core::{
    Engine, EngineConfig, Error, Opcode, Request, TaskSnapshot, TransferStatus, TransportHint,
    TransportKind,
};
use ferry_testkit::{bytes_at, bytes_of, fill, one, within, Pair};
use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
use ferry_verbs::{RdmaConfig, RdmaFactory};

const LEN: u64 = 1 << 20;
const BOUND: Duration = Duration::from_secs(60);

/// An engine on the emulated device through `provider`, with tcp to fail over to.
fn engine(provider: Arc<EmulatedProvider>) -> Engine {
    let rdma = RdmaConfig {
        provider_instance: Some(provider),
        ..RdmaConfig::default()
    };
    Engine::new(EngineConfig {
        transports: vec![TransportKind::Rdma, TransportKind::Tcp],
        extra_transports: vec![Arc::new(RdmaFactory { config: rdma })],
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// A target and an initiator on the emulated device; the initiator's provider, whose
/// faults its work requests draw, comes back too.
fn rig() -> (Pair, Arc<EmulatedProvider>) {
    let initiator_provider = Arc::new(EmulatedProvider::default());
    let target = engine(Arc::new(EmulatedProvider::default()));
    let initiator = engine(initiator_provider.clone());
    let r = Pair::new(target, initiator, LEN);
    fill(&r.local, 1);
    fill(&r.remote, 2);
    (r, initiator_provider)
}

/// Every work request of the initiator corrupted on the way.
fn corrupt_everything(provider: &EmulatedProvider) {
    provider.set_faults(EmulatedFaults {
        corrupt: 1.0,
        ..EmulatedFaults::default()
    });
}

/// A request of the whole region that prefers rdma (tcp stays there to fail over to).
fn run(r: &Pair, opcode: Opcode, verify: bool) -> TaskSnapshot {
    let req = Request {
        hint: TransportHint::Prefer(TransportKind::Rdma),
        verify,
        ..r.request(opcode, 0, LEN)
    };
    one(r.initiator.transfer_blocking(&[req]).expect("transfer"))
}

fn assert_integrity_failure(snap: &TaskSnapshot) {
    assert_eq!(snap.status, TransferStatus::Failed, "{snap:?}");
    let error = snap.error.as_ref().expect("an error");
    assert_eq!(error.code(), "ERR_FERRY_INTEGRITY", "{error}");
    assert_eq!(snap.transport, Some(TransportKind::Rdma), "{snap:?}");
    assert_eq!(
        snap.attempts, 1,
        "an integrity failure is never retried (tcp would have moved it cleanly)"
    );
}

fn assert_counted(r: &Pair, failures: u64) {
    let m = r.initiator.metrics();
    assert!(
        m.integrity_failures
            .contains(&(TransportKind::Rdma, failures)),
        "{:?}",
        m.integrity_failures
    );
    assert!(m.to_prometheus().contains(&format!(
        "ferry_integrity_failures_total{{transport=\"rdma\"}} {failures}\n"
    )));
}

#[test]
fn verified_rdma_write_and_read_complete_with_the_right_bytes() {
    within(BOUND, "clean", || {
        let (r, _) = rig();
        let snap = run(&r, Opcode::Write, true);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert_eq!(snap.transport, Some(TransportKind::Rdma));
        assert!(bytes_of(&r.remote) == bytes_of(&r.local), "written bytes");
        fill(&r.remote, 3);
        let snap = run(&r, Opcode::Read, true);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert_eq!(snap.transport, Some(TransportKind::Rdma));
        assert!(bytes_of(&r.local) == bytes_of(&r.remote), "read bytes");
        assert_counted(&r, 0);
    });
}

/// A gather's spans are checked as one: the CRC32C runs over them in order on both sides.
#[test]
fn a_verified_gather_of_scattered_blocks_completes() {
    within(BOUND, "gather", || {
        const SLOT: u64 = 4096;
        const N: u64 = 61; // prime: i * 7 % N visits every slot once
        let (r, _) = rig();
        for opcode in [Opcode::Write, Opcode::Read] {
            fill(&r.local, 4);
            fill(&r.remote, 5);
            let blocks = Blocks {
                opcode,
                local: PerBlock::One(r.local.id()),
                segment: PerBlock::One(r.seg),
                remote_buffer: PerBlock::One(r.remote.id()),
                local_offsets: (0..N).map(|i| i * SLOT).collect(),
                remote_offsets: (0..N).map(|i| (i * 7 % N) * SLOT).collect(),
                lengths: PerBlock::One(SLOT),
                hint: TransportHint::Require(TransportKind::Rdma),
                verify: true,
            };
            let (tx, rx) = mpsc::channel();
            r.initiator
                .transfer_blocks(&blocks, move |o| {
                    let _ = tx.send(o);
                })
                .expect("submitted");
            let out = rx.recv_timeout(Duration::from_secs(30)).expect("outcome");
            assert!(out.failed.is_empty(), "{opcode:?}: {:?}", out.failed);
            for b in 0..N as usize {
                let (l, rm) = (blocks.local_offsets[b], blocks.remote_offsets[b]);
                assert!(
                    bytes_at(&r.local, l, SLOT) == bytes_at(&r.remote, rm, SLOT),
                    "{opcode:?}: block {b} differs"
                );
            }
        }
    });
}

/// rdma WRITE is one-sided: the bytes land in the target before anyone can check them,
/// so a corrupted verified WRITE leaves them there; what `verify` gives is the request's
/// failure, never a completion over corrupted bytes.
#[test]
fn a_corrupted_verified_write_fails_with_the_integrity_code() {
    within(BOUND, "corrupted write", || {
        let (r, initiator_provider) = rig();
        corrupt_everything(&initiator_provider);
        let snap = run(&r, Opcode::Write, true);
        assert_integrity_failure(&snap);
        assert_counted(&r, 1);
        assert!(
            bytes_of(&r.remote) != bytes_of(&r.local),
            "the corrupted bytes landed (one-sided), and the request failed"
        );
    });
}

#[test]
fn a_corrupted_verified_read_fails_with_the_integrity_code() {
    within(BOUND, "corrupted read", || {
        let (r, initiator_provider) = rig();
        corrupt_everything(&initiator_provider);
        assert_integrity_failure(&run(&r, Opcode::Read, true));
        assert_counted(&r, 1);
    });
}

#[test]
fn without_verify_the_corruption_goes_unseen() {
    within(BOUND, "unverified", || {
        let (r, initiator_provider) = rig();
        corrupt_everything(&initiator_provider);
        let snap = run(&r, Opcode::Write, false);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert!(
            bytes_of(&r.remote) != bytes_of(&r.local),
            "corrupted, unseen"
        );
        let snap = run(&r, Opcode::Read, false);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert_counted(&r, 0);
    });
}

/// The check runs before the request counts as complete, so a notification attached to
/// a corrupted verified WRITE is never sent: the next one the target gets is the barrier.
#[test]
fn a_corrupted_verified_write_sends_no_notification() {
    within(BOUND, "notify", || {
        let (r, initiator_provider) = rig();
        let (seen, ticks) = ferry_testkit::notes::handler(&r, bytes_of(&r.local));
        corrupt_everything(&initiator_provider);
        let req = Request {
            hint: TransportHint::Prefer(TransportKind::Rdma),
            verify: true,
            ..r.request(Opcode::Write, 0, LEN)
        };
        let (tx, rx) = mpsc::channel();
        r.initiator
            .transfer_notify(&[req], b"corrupted".to_vec(), move |snaps, err| {
                let _ = tx.send((snaps, err.map(|e| e.code().to_string())));
            })
            .expect("submit");
        let (snaps, err) = rx.recv_timeout(Duration::from_secs(30)).expect("ended");
        assert_integrity_failure(&one(snaps));
        assert_eq!(err, None, "nothing was sent, so nothing was refused");
        r.initiator
            .notify_blocking(r.seg, b"barrier")
            .expect("barrier");
        ferry_testkit::notes::wait_for(&ticks, 1);
        assert_eq!(ferry_testkit::notes::payloads(&seen), ["barrier"]);
    });
}

/// The rdma transport of a build without checks: it reads every control message as an
/// endpoint handshake, so it refuses a check as a malformed one.
#[derive(Debug)]
struct WithoutChecks(RdmaFactory);

impl TransportFactory for WithoutChecks {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn build(&self, context: TransportContext) -> ferry_core::Result<Arc<dyn Transport>> {
        Ok(Arc::new(OldTarget(self.0.build(context)?)))
    }
}

struct OldTarget(Arc<dyn Transport>);

impl Transport for OldTarget {
    fn kind(&self) -> TransportKind {
        self.0.kind()
    }
    fn submit(&self, attempts: &[Attempt]) -> Vec<ferry_core::Result<()>> {
        self.0.submit(attempts)
    }
    fn reports_starts(&self) -> bool {
        self.0.reports_starts()
    }
    fn fail_peer(&self, peer: &Peer, error: Error) {
        self.0.fail_peer(peer, error);
    }
    fn forget_peer(&self, peer: &Peer, error: Error) {
        self.0.forget_peer(peer, error);
    }
    fn shutdown(&self) {
        self.0.shutdown();
    }
    fn reachable(&self, peer: &Peer) -> Result<(), String> {
        self.0.reachable(peer)
    }
    fn attach(&self, peer: &Arc<Peer>) -> Option<BoxFuture<ferry_core::Result<()>>> {
        self.0.attach(peer)
    }
    fn region_added(&self, region: &Arc<Region>) -> ferry_core::Result<()> {
        self.0.region_added(region)
    }
    fn region_released(&self, id: RegionId) {
        self.0.region_released(id);
    }
    fn serves(&self, region: &Region) -> bool {
        self.0.serves(region)
    }
    fn describe(&self) -> Option<serde_json::Value> {
        self.0.describe()
    }
    fn describe_buffer(&self, region: &Region) -> Option<serde_json::Value> {
        self.0.describe_buffer(region)
    }
    fn control(&self, request: &[u8]) -> ferry_core::Result<Vec<u8>> {
        if request.starts_with(br#"{"check""#) {
            return Err(Error::Protocol(
                "rdma handshake: malformed: missing field `engine_id`".into(),
            ));
        }
        self.0.control(request)
    }
}

/// A target too old to check: the verified request fails rather than claim a check, and
/// an unverified one still moves.
#[test]
fn a_target_that_does_not_check_fails_verified_requests() {
    within(BOUND, "old target", || {
        let rdma = RdmaConfig {
            provider_instance: Some(Arc::new(EmulatedProvider::default())),
            ..RdmaConfig::default()
        };
        let target = Engine::new(EngineConfig {
            transports: vec![TransportKind::Rdma, TransportKind::Tcp],
            extra_transports: vec![Arc::new(WithoutChecks(RdmaFactory { config: rdma }))],
            ..EngineConfig::default()
        })
        .expect("target");
        let initiator = engine(Arc::new(EmulatedProvider::default()));
        let r = Pair::new(target, initiator, LEN);
        fill(&r.local, 6);
        for opcode in [Opcode::Write, Opcode::Read] {
            let snap = run(&r, opcode, true);
            assert_integrity_failure(&snap);
            let error = snap.error.expect("an error").to_string();
            assert!(error.contains("did not check"), "{opcode:?}: {error}");
        }
        let snap = run(&r, Opcode::Write, false);
        assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
        assert_eq!(snap.transport, Some(TransportKind::Rdma));
    });
}

/// What a check costs: median request time of verified and unverified rdma WRITEs and
/// READs, interleaved in the same run. Prints; asserts nothing:
/// `cargo test --release -p ferry-verbs --test integrity -- --ignored --nocapture cost`.
#[test]
#[ignore = "a measurement"]
fn cost_of_a_check() {
    let (r, _) = rig();
    for (len, rounds) in [(4u64 << 10, 200), (LEN, 50)] {
        for opcode in [Opcode::Write, Opcode::Read] {
            let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..rounds {
                for (i, verify) in [false, true].into_iter().enumerate() {
                    let req = Request {
                        hint: TransportHint::Require(TransportKind::Rdma),
                        verify,
                        ..r.request(opcode, 0, len)
                    };
                    let start = std::time::Instant::now();
                    let snap = one(r.initiator.transfer_blocking(&[req]).expect("transfer"));
                    times[i].push(start.elapsed());
                    assert_eq!(snap.status, TransferStatus::Completed, "{snap:?}");
                }
            }
            let median = |v: &mut Vec<Duration>| {
                v.sort();
                v[v.len() / 2]
            };
            let (plain, verified) = (median(&mut times[0]), median(&mut times[1]));
            println!(
                "{opcode:?} {len} B: plain {plain:?}, verified {verified:?} (median of {rounds})"
            );
        }
    }
}
