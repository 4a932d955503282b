//! `verify` over rdma: RDMA WRITE and READ are one-sided, so neither side sees the other's
//! bytes move, and the check is a control message (`TransportReq`) after the completions.
//! A verified attempt expects one slice more than it posts; when the last work request
//! completed, the initiator takes the CRC32C of its side of the request (a WRITE's source,
//! a READ's landed bytes) and sends the target a [`RangeCheck`] naming the remote ranges:
//! the target takes the CRC32C of its ranges and, for a WRITE, checks it against the
//! source's it was sent. The answer is the missing slice: a match completes the attempt, a
//! mismatch fails it with `ERR_FERRY_INTEGRITY` (never retried), and a peer that does not
//! answer the check (a build without it) fails it the same way rather than claim a check.
//!
//! A WRITE's bytes land in the target before the check runs: a corrupted verified WRITE
//! leaves what arrived there, and what `verify` gives is the request's failure, never a
//! completion over corrupted bytes (tcp, which stages the payload, lands nothing). The
//! check costs one control round trip (a fresh authenticated control connection) per
//! verified attempt, and a CRC32C of the bytes on each side.
//!
//! The wire messages, the checksum of a list of ranges and the judgement of an answer are
//! pure and tested here; `Shared::start_check` and `Shared::answer_check` make the calls.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use ferry_core::blocks::GATHER;
use ferry_core::control::transport_request;
use ferry_core::integrity;
use ferry_core::memory::{Region, Window};
use ferry_core::task::Task;
use ferry_core::{Error, Opcode, Result, TransportKind};
use serde::{Deserialize, Serialize};

use super::peer_link::PeerLink;
use super::{LocalMr, Shared};

/// The control message of a check: `{"check": {...}}`, which no endpoint handshake
/// (`ConnectRequest`) parses as, and which a build without checks refuses as a malformed
/// handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckMessage {
    check: RangeCheck,
}

/// What the initiator asks the target to check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RangeCheck {
    /// The buffer, by the address its registration published (`RemoteMr::addr`).
    pub(super) addr: u64,
    /// The ranges of the buffer, `(offset, length)`, in the request's order: the CRC32C
    /// runs over them one after the other.
    pub(super) spans: Vec<(u64, u64)>,
    /// A WRITE's: the CRC32C of the source, which the target checks its ranges against.
    pub(super) expect: Option<u32>,
}

/// The target's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct CheckAnswer {
    /// The CRC32C of the ranges, as they are in the target's memory.
    crc32c: u32,
    /// Whether it matched the `expect` it was sent (a WRITE's check).
    matched: Option<bool>,
}

/// A verified attempt's work requests still to complete before its check runs.
pub(crate) struct PendingCheck {
    left: AtomicU32,
    /// The remote buffer's published address.
    remote_addr: u64,
    /// The local side's registration (and so its memory).
    local: Arc<LocalMr>,
}

impl PendingCheck {
    pub(super) fn new(slices: u32, remote_addr: u64, local: Arc<LocalMr>) -> Self {
        Self {
            left: AtomicU32::new(slices),
            remote_addr,
            local,
        }
    }

    /// Counts one work request completed; true for the last.
    pub(crate) fn landed(&self) -> bool {
        self.left.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// The check message of a request of `spans` in the buffer at `addr`.
fn encode_check(addr: u64, spans: Vec<(u64, u64)>, expect: Option<u32>) -> Result<Vec<u8>> {
    serde_json::to_vec(&CheckMessage {
        check: RangeCheck {
            addr,
            spans,
            expect,
        },
    })
    .map_err(|e| Error::Protocol(format!("encode an rdma check: {e}")))
}

/// A check, if `request` is one (otherwise it is an endpoint handshake, or malformed).
pub(super) fn parse_check(request: &[u8]) -> Option<RangeCheck> {
    serde_json::from_slice::<CheckMessage>(request)
        .ok()
        .map(|m| m.check)
}

/// The CRC32C of `spans` of `region`, one after the other, each checked to lie inside it.
/// A peer names at most what one request may (a gather's spans and bytes, or one range),
/// so that no message makes this engine checksum more than a request moves.
fn checksum_spans(region: &Arc<Region>, spans: &[(u64, u64)]) -> Result<u32> {
    let bytes = spans
        .iter()
        .try_fold(0u64, |sum, &(_, len)| sum.checked_add(len));
    let within_a_request = spans.len() == 1
        || (spans.len() <= GATHER.spans_max && bytes.is_some_and(|b| b <= GATHER.bytes_max));
    if spans.is_empty() || !within_a_request {
        return Err(Error::InvalidArgument(format!(
            "an rdma check of {} ranges ({bytes:?} bytes) is more than one request moves",
            spans.len()
        )));
    }
    let mut crc = ferry_core::integrity::Running::new();
    for &(offset, len) in spans {
        let window = Window::new(region, offset, len)?;
        crc.update(window.as_slice());
    }
    Ok(crc.value())
}

/// What the answer to a check (or the lack of one) means for the attempt. `local` is the
/// CRC32C of the initiator's side: a WRITE's source (which the target checked) or a READ's
/// landed bytes (checked here against the target's).
fn judge(opcode: Opcode, len: u64, local: u32, answer: Result<Vec<u8>>) -> Result<()> {
    let what = match opcode {
        Opcode::Write => format!("rdma WRITE of {len} bytes"),
        Opcode::Read => format!("rdma READ of {len} bytes"),
    };
    let body = match answer {
        Ok(body) => body,
        // Refused: a build without checks reads the message as a malformed handshake.
        Err(Error::Protocol(why)) => {
            return Err(integrity::unchecked(&format!("{what} ({why})")));
        }
        // The check could not be asked (no connection, a timeout): the attempt fails as
        // any failed transfer, and a retry checks again.
        Err(e) => return Err(e),
    };
    let Ok(answer) = serde_json::from_slice::<CheckAnswer>(&body) else {
        return Err(integrity::unchecked(&format!(
            "{what} (an answer that is no check)"
        )));
    };
    match (opcode, answer.matched) {
        (Opcode::Write, Some(true)) => Ok(()),
        (Opcode::Write, Some(false)) => Err(integrity::mismatch(
            &format!("{what}, checked by the target"),
            local,
            answer.crc32c,
            len as usize,
        )),
        (Opcode::Write, None) => Err(integrity::unchecked(&what)),
        (Opcode::Read, _) if answer.crc32c == local => Ok(()),
        (Opcode::Read, _) => Err(integrity::mismatch(
            &what,
            answer.crc32c,
            local,
            len as usize,
        )),
    }
}

impl Shared {
    /// Runs the check of `task`'s `attempt`, whose work requests all completed, and
    /// reports it as the attempt's last slice (or its failure).
    pub(super) fn start_check(
        self: &Arc<Self>,
        link: &Arc<PeerLink>,
        task: Arc<Task>,
        attempt: u32,
        pending: &PendingCheck,
    ) {
        let shared = self.clone();
        let addr = link.peer.addr();
        let region = pending.local.region.clone();
        let remote_addr = pending.remote_addr;
        self.handle.spawn(async move {
            let checked = tokio::select! {
                _ = shared.shutdown.cancelled() => Err(Error::Closed),
                checked = shared.check(&addr, &task, region, remote_addr) => checked,
            };
            match checked {
                Ok(()) => task.slice_done(attempt, 0),
                Err(e) => task.attempt_failed(attempt, e),
            }
        });
    }

    async fn check(
        &self,
        addr: &str,
        task: &Arc<Task>,
        region: Arc<Region>,
        remote_addr: u64,
    ) -> Result<()> {
        let req = task.request();
        let (opcode, len, engine_id) = (req.opcode, req.length, req.descriptor.engine_id);
        let local_spans: Vec<(u64, u64)> = req
            .spans()
            .iter()
            .map(|s| (s.local_offset, s.length))
            .collect();
        let remote_spans: Vec<(u64, u64)> = req
            .spans()
            .iter()
            .map(|s| (s.remote_offset, s.length))
            .collect();
        // Off the runtime's threads: a large request's checksum takes milliseconds.
        let local = tokio::task::spawn_blocking(move || checksum_spans(&region, &local_spans))
            .await
            .map_err(|e| Error::Io(format!("rdma check: {e}")))??;
        let expect = (opcode == Opcode::Write).then_some(local);
        let body = encode_check(remote_addr, remote_spans, expect)?;
        let answer = transport_request(
            addr,
            self.engine_id,
            TransportKind::Rdma,
            &body,
            self.config.connect_timeout,
        )
        .await
        .and_then(|(body, answered)| {
            // The bytes went to the incarnation the request was planned for; another
            // one's memory says nothing of them.
            if answered == engine_id {
                Ok(body)
            } else {
                Err(req.peer.restarted_error())
            }
        });
        judge(opcode, len, local, answer)
    }

    /// The target's side: the CRC32C of the ranges `check` names, compared with the
    /// source's when it came with one.
    pub(super) fn answer_check(&self, check: &RangeCheck) -> Result<Vec<u8>> {
        let region = self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|m| m.region.as_ptr() as u64 == check.addr)
            .map(|m| m.region.clone())
            .ok_or_else(|| {
                Error::OutOfRange(format!(
                    "rdma check: no buffer registered at {:#x}",
                    check.addr
                ))
            })?;
        let crc32c = checksum_spans(&region, &check.spans)?;
        let matched = check.expect.map(|expect| expect == crc32c);
        if matched == Some(false) {
            tracing::warn!(
                region = region.id(),
                ranges = check.spans.len(),
                "rdma: a verified WRITE landed corrupted"
            );
        }
        serde_json::to_vec(&CheckAnswer { crc32c, matched })
            .map_err(|e| Error::Protocol(format!("encode an rdma check answer: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(crc32c: u32, matched: Option<bool>) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec(&CheckAnswer { crc32c, matched }).expect("encode"))
    }

    #[test]
    fn a_check_is_never_taken_for_a_handshake_nor_the_reverse() {
        let body = encode_check(0x1000, vec![(0, 4096), (8192, 4096)], Some(7)).expect("enc");
        let check = parse_check(&body).expect("a check");
        assert_eq!(check.spans, [(0, 4096), (8192, 4096)]);
        assert_eq!((check.addr, check.expect), (0x1000, Some(7)));
        let handshake = br#"{"engine_id":1,"slot":0,"device":0,"endpoint":{"qpn":1,"psn":2,"gid":"","lid":0,"mtu":5}}"#;
        assert_eq!(parse_check(handshake), None);
        let as_handshake = serde_json::from_slice::<super::super::handshake::ConnectRequest>(&body);
        assert!(as_handshake.is_err(), "a build without checks refuses it");
        assert_eq!(parse_check(b"garbage"), None);
        assert_eq!(
            parse_check(br#"{"check":{"addr":1,"spans":[],"expect":null},"x":1}"#),
            None
        );
    }

    #[test]
    fn a_write_completes_only_when_the_target_says_it_matched() {
        assert!(judge(Opcode::Write, 10, 5, answer(5, Some(true))).is_ok());
        let e = judge(Opcode::Write, 10, 5, answer(6, Some(false))).expect_err("mismatch");
        assert_eq!(e.code(), "ERR_FERRY_INTEGRITY");
        let e = judge(Opcode::Write, 10, 5, answer(5, None)).expect_err("unchecked");
        assert_eq!(e.code(), "ERR_FERRY_INTEGRITY");
    }

    #[test]
    fn a_read_compares_the_target_s_checksum_with_what_landed() {
        assert!(judge(Opcode::Read, 10, 5, answer(5, None)).is_ok());
        let e = judge(Opcode::Read, 10, 5, answer(6, None)).expect_err("mismatch");
        assert_eq!(e.code(), "ERR_FERRY_INTEGRITY");
    }

    #[test]
    fn a_peer_that_does_not_answer_the_check_fails_it_as_unchecked() {
        for opcode in [Opcode::Write, Opcode::Read] {
            // What a build without checks answers: a refused (malformed) handshake.
            let refused = Err(Error::Protocol(
                "refused the rdma request: malformed".into(),
            ));
            let e = judge(opcode, 10, 5, refused).expect_err("refused");
            assert_eq!(e.code(), "ERR_FERRY_INTEGRITY", "{e}");
            assert!(e.to_string().contains("did not check"), "{e}");
            let e = judge(opcode, 10, 5, Ok(b"{}".to_vec())).expect_err("no check");
            assert_eq!(e.code(), "ERR_FERRY_INTEGRITY", "{e}");
        }
        // No answer at all (no connection): the attempt fails as a failed transfer does.
        let e = judge(Opcode::Read, 10, 5, Err(Error::Timeout)).expect_err("timeout");
        assert_eq!(e.code(), Error::Timeout.code());
    }

    #[test]
    fn the_target_checksums_only_ranges_of_its_buffer_and_of_one_request() {
        let regions = ferry_core::memory::RegionTable::default();
        let region = regions.allocate(1 << 16).expect("region");
        let whole = checksum_spans(&region, &[(0, 1 << 16)]).expect("whole");
        let halves = checksum_spans(&region, &[(0, 1 << 15), (1 << 15, 1 << 15)]).expect("two");
        assert_eq!(
            whole, halves,
            "the ranges are checksummed one after the other"
        );
        assert_eq!(whole, integrity::checksum(&vec![0u8; 1 << 16]));
        for bad in [
            vec![],
            vec![(1, 1 << 16)],
            vec![(u64::MAX, 2)],
            vec![(0, 1); GATHER.spans_max + 1],
            vec![(0, 1 << 16); (GATHER.bytes_max >> 16) as usize + 1],
        ] {
            assert!(checksum_spans(&region, &bad).is_err(), "{bad:?}");
        }
    }
}
