//! The request side of the tcp data protocol: one slice of a task, the one encoder of the
//! request frame that carries it, and what its reply must match ([`reply::Asked`]). Both
//! ways a slice travels (a pool connection, `pool_conn`; a JS thread's own connection,
//! `loop_conn`) build their frames here.

use std::sync::Arc;

use super::reply::Asked;
use crate::error::Result;
use crate::fence::Landing;
use crate::kind::Opcode;
use crate::lanes::Lent;
use crate::lazy_now::LazyNow;
use crate::memory::{Region, Window};
use crate::task::Task;
use crate::wire::{FrameHead, Header, Op, Token, FLAG_CHECKSUM, HEADER_LEN};

/// One slice of a task, queued or in flight.
pub(super) struct Slice {
    pub(super) task: Arc<Task>,
    pub(super) attempt: u32,
    pub(super) opcode: Opcode,
    pub(super) region: Lent<Region>,
    pub(super) local_offset: u64,
    pub(super) buffer: u64,
    pub(super) remote_offset: u64,
    pub(super) len: u64,
    pub(super) token: Token,
    /// The peer incarnation the slice was planned against (its descriptor's engine id).
    pub(super) engine_id: u64,
    /// The first slice of its attempt's share for one connection: when its frame goes
    /// out, the attempt's deadline starts running there (`Task::started`).
    pub(super) starts_share: bool,
    /// Its payload's CRC32C once taken (`checksum`): kept while a full window holds the
    /// slice back, so that its retry does not read the payload again.
    pub(super) payload_crc: Option<u32>,
    /// Holds its task's fence while its frame may still be written or answered.
    #[allow(dead_code)] // held for its drop
    pub(super) landing: Landing<Task>,
}

impl Slice {
    /// Its frame is about to be written at `now`: the first slice of a share tells its
    /// task that the share started moving.
    pub(super) fn going_out(&self, now: &LazyNow) {
        if self.starts_share {
            self.task.started(self.attempt, now.get());
        }
    }

    /// Bytes of payload this slice's request frame carries.
    pub(super) fn payload_len(&self) -> u64 {
        match self.opcode {
            Opcode::Write => self.len,
            Opcode::Read => 0,
        }
    }

    /// The request frame's payload (empty for a READ), checked to lie in the local region.
    pub(super) fn payload(&self) -> Result<Window> {
        Window::new(&self.region, self.local_offset, self.payload_len())
    }

    /// Whether the slice may go on a connection to incarnation `remote` (the engine id its
    /// handshake answered with): only to the one it was planned against. Otherwise why
    /// not: the peer restarted. (The token would be refused there too: each incarnation
    /// draws its own.)
    pub(super) fn check_incarnation(&self, remote: u64) -> Result<()> {
        if remote == self.engine_id {
            return Ok(());
        }
        Err(crate::error::Error::PeerLost {
            peer: self.task.request().peer.name().to_string(),
            reason: crate::liveness::LossReason::Restarted { engine_id: remote },
        })
    }

    /// Whether its bytes are checked end to end (`verify`).
    pub(super) fn verify(&self) -> bool {
        self.task.request().verify
    }

    /// Whether its frame is to carry a checksum not taken yet: a verified WRITE's.
    pub(super) fn needs_checksum(&self) -> bool {
        self.payload_crc.is_none() && self.verify() && self.opcode == Opcode::Write
    }

    /// The checksum its request frame carries: a verified WRITE's CRC32C of `payload` (its
    /// `payload()`), taken before the frame is registered, off the connection's lock, and
    /// only once however often a full window holds the slice back.
    pub(super) fn checksum(&mut self, payload: &Window) -> Option<u32> {
        if self.needs_checksum() {
            self.payload_crc = Some(crate::integrity::checksum(payload.as_slice()));
        }
        self.payload_crc
    }

    /// The request frame's header, sent as request `request_id` of its connection, and
    /// the checksum word after it (`checksum`, from [`Slice::checksum`]).
    pub(super) fn header(&self, request_id: u64, checksum: Option<u32>) -> FrameHead {
        let header = encode(
            self.opcode,
            self.buffer,
            self.remote_offset,
            self.len,
            self.token,
            request_id,
            self.verify(),
        );
        FrameHead::new(header, checksum)
    }

    /// What the reply to this slice must match.
    pub(super) fn asked(&self) -> Asked {
        Asked {
            opcode: self.opcode,
            len: self.len,
            room: (self.region.len() as u64).saturating_sub(self.local_offset),
            verify: self.verify(),
        }
    }

    /// Where a READ reply's payload lands: the slice's range of the local region.
    pub(super) fn destination(&self) -> Result<Window> {
        Window::new(&self.region, self.local_offset, self.len)
    }
}

/// The header of a request frame: WRITE `len` payload bytes (which follow it) at
/// `offset` of the target's buffer `buffer`, or READ `len` bytes from there, under the
/// segment's `token`. The target echoes `request_id` in its reply. `verify`: a WRITE's
/// checksum word follows the header; a READ asks for the range's checksum.
fn encode(
    opcode: Opcode,
    buffer: u64,
    offset: u64,
    len: u64,
    token: Token,
    request_id: u64,
    verify: bool,
) -> [u8; HEADER_LEN] {
    let mut h = Header::new(match opcode {
        Opcode::Write => Op::WriteReq,
        Opcode::Read => Op::ReadReq,
    });
    if verify {
        h.flags |= FLAG_CHECKSUM;
    }
    h.request_id = request_id;
    h.buffer_id = buffer;
    h.offset = offset;
    h.length = len;
    h.token = token;
    h.encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::RegionTable;
    use crate::task::tests::waiting_task;

    fn slice(opcode: Opcode, local_offset: u64, len: u64) -> Slice {
        let region = RegionTable::default().allocate(8192).expect("region");
        let task = waiting_task().0;
        Slice {
            landing: Landing::new(&task),
            task,
            attempt: 1,
            opcode,
            region: Lent::new(region),
            local_offset,
            buffer: 7,
            remote_offset: 300,
            len,
            token: [5; 16],
            engine_id: 9,
            starts_share: true,
            payload_crc: None,
        }
    }

    #[test]
    fn a_slice_goes_only_to_the_incarnation_it_was_planned_against() {
        let s = slice(Opcode::Write, 0, 4096);
        assert!(s.check_incarnation(9).is_ok());
        let e = s.check_incarnation(10).expect_err("another incarnation");
        assert_eq!(e.code(), "ERR_FERRY_PEER_LOST");
        assert!(
            matches!(&e, crate::error::Error::PeerLost { reason, .. } if reason.kind().name() == "restarted"),
            "{e:?}"
        );
    }

    #[test]
    fn a_request_header_says_what_the_slice_asks() {
        for (opcode, op, payload) in [
            (Opcode::Write, Op::WriteReq, 4096),
            (Opcode::Read, Op::ReadReq, 0),
        ] {
            let s = slice(opcode, 100, 4096);
            let h = Header::decode(&s.header(42, None)).expect("header");
            assert_eq!(
                (h.op, h.request_id, h.buffer_id, h.offset, h.length, h.token),
                (op, 42, 7, 300, 4096, [5; 16])
            );
            // A READ asks for its length and carries none of it.
            assert_eq!(h.payload_len(), payload);
            assert_eq!(s.payload_len(), payload);
            assert_eq!(s.payload().expect("payload").len() as u64, payload);
        }
    }

    #[test]
    fn a_verified_writes_checksum_is_taken_once_however_often_it_is_held_back() {
        let mut request = crate::request::tests::sample();
        request.verify = true;
        let task = crate::task::tests::waiting_task_of(request).0;
        let mut s = Slice {
            landing: Landing::new(&task),
            task,
            payload_crc: None,
            ..slice(Opcode::Write, 0, 4096)
        };
        let payload = s.payload().expect("payload");
        let first = s.checksum(&payload).expect("a verified WRITE's checksum");
        assert_eq!(first, crate::integrity::checksum(&[0u8; 4096]));
        // Held back by a full window, then registered again: not read again (a payload
        // read again would give another checksum here).
        Window::new(&s.region, 0, 4096)
            .expect("window")
            .as_mut_slice()
            .fill(1);
        let payload = s.payload().expect("payload");
        assert_ne!(crate::integrity::checksum(payload.as_slice()), first);
        assert_eq!(s.checksum(&payload), Some(first));
        // An unverified WRITE and a READ carry none.
        let mut plain = slice(Opcode::Write, 0, 4096);
        assert_eq!(plain.checksum(&payload), None);
        let mut read = slice(Opcode::Read, 0, 4096);
        assert_eq!(read.checksum(&payload), None);
    }

    #[test]
    fn a_slice_asks_for_what_its_region_can_take() {
        let s = slice(Opcode::Read, 100, 4096);
        assert_eq!(
            s.asked(),
            Asked {
                opcode: Opcode::Read,
                len: 4096,
                room: 8192 - 100,
                verify: false,
            }
        );
        assert_eq!(s.destination().expect("dst").len(), 4096);
        // An offset past the region's end leaves no room (and no window), not a wrap.
        let s = slice(Opcode::Read, 9000, 4096);
        assert_eq!(s.asked().room, 0);
        assert!(s.destination().is_err());
    }
}
