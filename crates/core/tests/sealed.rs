//! Sealed (encrypted) tcp data connections (`encrypt`): data moves both ways; a bit
//! flipped on the wire drops the connection with `ERR_FERRY_TAMPERED` and moves no byte
//! into either side's memory; a target that requires sealing refuses a plaintext
//! initiator. The same flip without sealing lands corrupted bytes: the relay works.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::auth::Secret;
use ferry_core::{
    Encrypt, Engine, EngineConfig, Opcode, Region, TaskSnapshot, TransferStatus, TransportKind,
};
use ferry_testkit::{bytes_of, fill, one, request, within, Flip, Proxy};

const BOUND: Duration = Duration::from_secs(60);
/// Two of the default 512 KiB slices: two frames, on two connections when the pool has
/// them.
const LEN: u64 = 1 << 20;
/// Where the relay flips a bit: past the handshake (under 300 bytes each way), inside the
/// first data frame of every connection.
const FLIP_AT: u64 = 100_000;

fn secret() -> Secret {
    Secret::new(vec![0x5a; 32]).expect("secret")
}

fn engine(encrypt: Encrypt, advertise: Option<String>) -> Engine {
    Engine::new(EngineConfig {
        transports: vec![TransportKind::Tcp],
        auth_secret: Some(secret()),
        encrypt,
        advertise,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// A target reached through a flipping relay (the target advertises the relay), an
/// initiator, a region on each (the target's filled with one pattern, the initiator's
/// with another), and the target's segment opened.
struct Wire {
    target: Engine,
    initiator: Engine,
    remote: Arc<Region>,
    local: Arc<Region>,
    seg: u64,
    relay: Proxy,
}

impl Wire {
    /// `to_target`: where the relay flips a byte (none: it forwards intact).
    fn new(encrypt: Encrypt, to_target: Option<bool>) -> Self {
        let relay = Proxy::start();
        relay.corrupt(to_target.map(|to_target| Flip {
            to_target,
            at: FLIP_AT,
        }));
        let target = Engine::new(EngineConfig {
            transports: vec![TransportKind::Tcp],
            auth_secret: Some(secret()),
            encrypt,
            advertise: Some(relay.addr().to_string()),
            ..EngineConfig::default()
        })
        .expect("target");
        relay.forward_to(target.local_addr());
        let initiator = engine(encrypt, None);
        let remote = target.allocate(LEN).expect("remote");
        let local = initiator.allocate(LEN).expect("local");
        fill(&remote, 1);
        fill(&local, 2);
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        Self {
            target,
            initiator,
            remote,
            local,
            seg,
            relay,
        }
    }

    fn run(&self, opcode: Opcode) -> TaskSnapshot {
        let req = request(opcode, &self.local, self.seg, &self.remote, 0, LEN);
        one(self.initiator.transfer_blocking(&[req]).expect("transfer"))
    }

    fn flipped(&self) -> u64 {
        self.relay.flipped()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.initiator.close();
        self.target.close();
    }
}

fn code(snap: &TaskSnapshot) -> &'static str {
    snap.error.as_ref().map_or("none", |e| e.code())
}

#[test]
fn a_sealed_pair_moves_data_both_ways() {
    within(BOUND, "sealed write and read", || {
        let w = Wire::new(Encrypt::Always, None);
        let sent = bytes_of(&w.local);
        assert_eq!(w.run(Opcode::Write).status, TransferStatus::Completed);
        assert_eq!(bytes_of(&w.remote), sent);
        fill(&w.remote, 3);
        let stored = bytes_of(&w.remote);
        assert_eq!(w.run(Opcode::Read).status, TransferStatus::Completed);
        assert_eq!(bytes_of(&w.local), stored);
    });
}

#[test]
fn a_flipped_write_frame_is_tampered_and_nothing_lands_in_the_target() {
    within(BOUND, "tampered write", || {
        let w = Wire::new(Encrypt::Always, Some(true));
        let before = bytes_of(&w.remote);
        let snap = w.run(Opcode::Write);
        assert_eq!(snap.status, TransferStatus::Failed, "{:?}", snap.error);
        assert_eq!(code(&snap), "ERR_FERRY_TAMPERED", "{:?}", snap.error);
        assert!(w.flipped() > 0, "the relay flipped nothing");
        assert!(
            bytes_of(&w.remote) == before,
            "bytes of a tampered WRITE landed"
        );
    });
}

#[test]
fn a_flipped_read_reply_is_tampered_and_nothing_lands_in_the_initiator() {
    within(BOUND, "tampered read", || {
        let w = Wire::new(Encrypt::Always, Some(false));
        let before = bytes_of(&w.local);
        let snap = w.run(Opcode::Read);
        assert_eq!(snap.status, TransferStatus::Failed, "{:?}", snap.error);
        assert_eq!(code(&snap), "ERR_FERRY_TAMPERED", "{:?}", snap.error);
        assert!(w.flipped() > 0, "the relay flipped nothing");
        assert!(
            bytes_of(&w.local) == before,
            "bytes of a tampered READ landed"
        );
    });
}

#[test]
fn without_sealing_the_same_flip_lands_corrupted_bytes() {
    // The control: the relay does corrupt, and plaintext connections cannot tell.
    within(BOUND, "plaintext write through the flipping relay", || {
        let w = Wire::new(Encrypt::Never, Some(true));
        let sent = bytes_of(&w.local);
        let snap = w.run(Opcode::Write);
        assert_eq!(snap.status, TransferStatus::Completed, "{:?}", snap.error);
        let landed = bytes_of(&w.remote);
        let differ = sent.iter().zip(&landed).filter(|(a, b)| a != b).count();
        assert!(differ >= 1, "the flip did not land");
    });
}

#[test]
fn a_target_that_requires_sealing_refuses_a_plaintext_initiator() {
    // Every connection is sealed by the same rule, the control connection that opens the
    // segment first: the open is refused, told why, and counted as a plaintext peer.
    within(BOUND, "plaintext initiator, sealing target", || {
        let target = engine(Encrypt::Always, None);
        let initiator = engine(Encrypt::Never, None);
        target.allocate(4096).expect("remote");
        let err = initiator
            .open_segment_blocking(target.segment_name())
            .expect_err("a plaintext initiator is refused");
        assert_eq!(err.code(), "ERR_FERRY_CONNECT", "{err}");
        assert!(err.to_string().contains("encrypt"), "{err}");
        let refused: u64 = target
            .metrics()
            .auth_failures
            .iter()
            .filter(|(reason, _)| *reason == "plaintext")
            .map(|(_, n)| n)
            .sum();
        assert!(refused >= 1, "the refusal was not counted as plaintext");
        initiator.close();
        target.close();
    });
}

#[test]
fn a_sealed_pair_moves_verified_data_both_ways() {
    // Both options at once: the checksum word rides inside the sealed record, and the
    // target's check runs on what the record opened to.
    within(BOUND, "sealed and verified write and read", || {
        let w = Wire::new(Encrypt::Always, None);
        let sent = bytes_of(&w.local);
        let run = |opcode| {
            let mut req = request(opcode, &w.local, w.seg, &w.remote, 0, LEN);
            req.verify = true;
            one(w.initiator.transfer_blocking(&[req]).expect("transfer"))
        };
        let wrote = run(Opcode::Write);
        assert_eq!(wrote.status, TransferStatus::Completed, "{:?}", wrote.error);
        assert_eq!(bytes_of(&w.remote), sent);
        fill(&w.remote, 3);
        let stored = bytes_of(&w.remote);
        let read = run(Opcode::Read);
        assert_eq!(read.status, TransferStatus::Completed, "{:?}", read.error);
        assert_eq!(bytes_of(&w.local), stored);
        let failures = w.initiator.metrics().integrity_failures;
        assert!(failures.iter().all(|(_, n)| *n == 0), "{failures:?}");
    });
}

#[test]
fn a_sealed_pair_moves_polled_batches_both_ways() {
    // The batch API's polled submissions, one per piece, back to back: many small sealed
    // frames queued on each connection at once, in order behind one sealer.
    within(BOUND, "sealed polled writes and reads", || {
        let w = Wire::new(Encrypt::Always, None);
        let pieces = 32;
        let piece = LEN / pieces;
        let run = |opcode| {
            let batch = w.initiator.allocate_batch(pieces as usize).expect("batch");
            for i in 0..pieces {
                let req = request(opcode, &w.local, w.seg, &w.remote, i * piece, piece);
                w.initiator.submit_transfer(batch, &[req]).expect("submit");
            }
            let snaps = ferry_testkit::wait_batch(&w.initiator, batch, BOUND);
            for s in &snaps {
                assert_eq!(s.status, TransferStatus::Completed, "{:?}", s.error);
            }
            w.initiator.free_batch(batch).expect("free");
        };
        let sent = bytes_of(&w.local);
        run(Opcode::Write);
        assert_eq!(bytes_of(&w.remote), sent);
        fill(&w.remote, 3);
        let stored = bytes_of(&w.remote);
        run(Opcode::Read);
        assert_eq!(bytes_of(&w.local), stored);
    });
}
