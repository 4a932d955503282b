//! The one decoder of a tcp data reply. Both ways a request travels — a pool connection
//! run by the I/O threads (`pool_conn`) and a JS thread's own connection watched by its
//! event loop (`loop_conn`) — read every reply header through [`decode`], so both apply
//! the same guards. Pure: it takes the header's bytes and the request in flight they claim
//! to answer, and returns what follows the header or why the connection must break. The
//! shells then read exactly the bytes the outcome names (a READ's payload, an error's
//! text), and nothing else.
//!
//! Every byte here came from the network and is hostile until checked: no `unwrap`, no
//! unchecked slice, no panic. A reply that breaks a guard breaks the connection: once a
//! peer frames differently from what we asked, no later byte on that stream can be trusted
//! to start a frame.
//!
//! Replies carry no token: the target echoes only the request id (the token authorised
//! the request on its side). The request id is what ties a reply to its request, and it
//! is checked against the connection's own books, which only this side writes.

use crate::error::Error;
use crate::integrity::Running;
use crate::kind::Opcode;
use crate::wire::{Header, Op, RejectCode, WireError, MAX_ERROR_PAYLOAD};

/// What the request in flight asked for: what its reply must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Asked {
    /// WRITE or READ.
    pub(super) opcode: Opcode,
    /// Bytes written, or asked to read.
    pub(super) len: u64,
    /// Bytes the request's local region holds from where a READ lands (its end minus the
    /// local offset): the most a READ's payload may fill.
    pub(super) room: u64,
    /// Whether its bytes are checked end to end (`verify`).
    pub(super) verify: bool,
}

/// A well-formed reply: what follows its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// The WRITE was copied into the target's memory; nothing follows.
    Written {
        /// The target checked the payload against its checksum first (`verify`).
        checked: bool,
    },
    /// The READ's bytes follow: exactly `len` of them, what was asked, to land at the
    /// request's destination.
    Read {
        /// Payload bytes.
        len: u64,
        /// The CRC32C of the source's bytes, when the target took one (`verify`).
        checksum: Option<u32>,
    },
    /// The target refused the request: `text_len` bytes of reason follow.
    Refused {
        /// Why (unknown codes read as `BadRequest`).
        code: RejectCode,
        /// Bytes of reason text, at most [`MAX_ERROR_PAYLOAD`].
        text_len: usize,
    },
}

/// Why a reply breaks its connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Violation {
    /// The bytes are no header of ours (magic, version, op, a length over the op's cap,
    /// too few bytes).
    #[error("{0}")]
    Header(#[from] WireError),
    /// No request of that id is in flight on this connection.
    #[error("reply to unknown request {0}")]
    Unknown(u64),
    /// The op or the length does not answer what was asked.
    #[error("{op:?} (len {len}) in reply to a {asked:?}")]
    Mismatch {
        /// The reply's op.
        op: Op,
        /// Its length field.
        len: u64,
        /// What the request was.
        asked: Opcode,
    },
    /// A READ's payload would run past the end of the region it lands in.
    #[error("a READ reply of {len} bytes past its destination, which holds {room}")]
    PastDestination {
        /// Payload bytes.
        len: u64,
        /// Bytes the destination holds.
        room: u64,
    },
}

impl From<Violation> for Error {
    fn from(v: Violation) -> Self {
        match v {
            // Our own request could not land (the region is smaller than its range): the
            // range error it would have met opening the destination.
            Violation::PastDestination { .. } => Error::OutOfRange(v.to_string()),
            _ => Error::Protocol(v.to_string()),
        }
    }
}

/// A reply that breaks the connection, and the request it answered when one was in
/// flight under its id (taken out of the books: fail it with the connection).
#[derive(Debug)]
pub(super) struct Broken<S> {
    /// The request the reply named, if any.
    pub(super) request: Option<S>,
    /// What was wrong.
    pub(super) violation: Violation,
}

/// Decodes the reply whose header is `bytes` (its first `HEADER_LEN` bytes). `take` takes
/// the request of a given id out of the connection's books, `asked` says what that
/// request asked for. A request taken comes back either way: with the outcome, to
/// complete or read into; or in [`Broken`], to fail.
pub(super) fn decode<S>(
    bytes: &[u8],
    take: impl FnOnce(u64) -> Option<S>,
    asked: impl FnOnce(&S) -> Asked,
) -> Result<(S, Reply), Broken<S>> {
    let header = Header::decode(bytes).map_err(|e| Broken {
        request: None,
        violation: e.into(),
    })?;
    let Some(request) = take(header.request_id) else {
        return Err(Broken {
            request: None,
            violation: Violation::Unknown(header.request_id),
        });
    };
    match answer(&header, asked(&request)) {
        Ok(reply) => Ok((request, reply)),
        Err(violation) => Err(Broken {
            request: Some(request),
            violation,
        }),
    }
}

/// Checks a decoded header against the request it answers. Each guard, and why:
///
/// - the op answers the request's kind (`WriteAck` a WRITE, `ReadResp` a READ, `Error`
///   either): anything else — a request sent back, a heartbeat, the other kind's reply —
///   means the peer's idea of this stream differs from ours;
/// - a `WriteAck`'s length is 0: an ack carries no payload, so a length there is a peer
///   that frames differently from how we read;
/// - a `ReadResp` carries exactly the length asked: fewer bytes would leave part of the
///   destination stale while the read reports done, more would land past the range the
///   caller gave (in memory that may hold other data) or desynchronise the stream;
/// - a `ReadResp` fits the destination's room: the bytes are written into registered
///   memory, never past its region's end, whatever the length checks above allowed;
/// - an `Error`'s text is at most [`MAX_ERROR_PAYLOAD`]: it is held in memory whole, so a
///   hostile length must not size an allocation (the wire's cap says the same; this does
///   not rely on it);
/// - an `Error`'s reject code is read leniently (`RejectCode::from_raw`: unknown codes
///   are `BadRequest`): it only words the failure, and a newer peer may add codes.
pub(super) fn answer(header: &Header, asked: Asked) -> Result<Reply, Violation> {
    let mismatch = || Violation::Mismatch {
        op: header.op,
        len: header.length,
        asked: asked.opcode,
    };
    match (header.op, asked.opcode) {
        (Op::WriteAck, Opcode::Write) if header.length == 0 => Ok(Reply::Written {
            checked: header.checksummed(),
        }),
        (Op::ReadResp, Opcode::Read) if header.length == asked.len => {
            if header.length > asked.room {
                return Err(Violation::PastDestination {
                    len: header.length,
                    room: asked.room,
                });
            }
            Ok(Reply::Read {
                len: header.length,
                checksum: header.token_checksum(),
            })
        }
        (Op::Error, _) if header.length <= MAX_ERROR_PAYLOAD => {
            let text_len = usize::try_from(header.length).map_err(|_| mismatch())?;
            Ok(Reply::Refused {
                code: RejectCode::from_raw(header.flags),
                text_len,
            })
        }
        _ => Err(mismatch()),
    }
}

/// The error a refused request fails with: the code and the target's reason. A verified
/// WRITE whose payload failed its check at the target fails as corrupted.
pub(super) fn refusal(code: RejectCode, text: &[u8]) -> Error {
    let text = String::from_utf8_lossy(text);
    match code {
        RejectCode::Integrity => Error::Integrity(format!("at the target: {text}")),
        _ => Error::RemoteRejected(format!("{code:?}: {text}")),
    }
}

/// Whether a WRITE acknowledged as landed completes: a verified one only if the target
/// says it checked the payload (a target too old for `verify` does not).
pub(super) fn check_written(verify: bool, checked: bool) -> Result<(), Error> {
    if verify && !checked {
        return Err(crate::integrity::unchecked("WRITE"));
    }
    Ok(())
}

/// Whether a READ whose bytes are in completes: a verified one only if the target sent
/// the source's checksum and the bytes match it (`landed`: their CRC32C, taken as they
/// arrived). On a mismatch the bytes stay where they landed (the request's own
/// destination) and the request fails.
pub(super) fn check_read(
    verify: bool,
    checksum: Option<u32>,
    landed: &Running,
) -> Result<(), Error> {
    match (verify, checksum) {
        (false, _) => Ok(()),
        (true, None) => Err(crate::integrity::unchecked("READ")),
        (true, Some(expected)) => landed.check("READ payload", expected),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{HEADER_LEN, MAX_DATA_PAYLOAD};
    use std::collections::HashMap;

    const LEN: u64 = 4096;

    fn asked(opcode: Opcode) -> Asked {
        Asked {
            opcode,
            len: LEN,
            room: 2 * LEN,
            verify: false,
        }
    }

    fn header(op: Op, request_id: u64, length: u64) -> Header {
        Header {
            op,
            flags: 0,
            request_id,
            buffer_id: 0,
            offset: 0,
            length,
            token: [0; 16],
        }
    }

    /// Decodes `bytes` against a connection with `books` in flight (what the reply names
    /// is taken out of them).
    fn decode_with(
        books: &mut HashMap<u64, Asked>,
        bytes: &[u8],
    ) -> Result<(Asked, Reply), Broken<Asked>> {
        decode(bytes, |id| books.remove(&id), |a| *a)
    }

    #[test]
    fn a_verified_request_completes_only_when_its_check_passed() {
        // WRITE: only an ack that says the target checked the payload.
        assert!(check_written(false, false).is_ok());
        assert!(check_written(true, true).is_ok());
        let e = check_written(true, false).expect_err("a target that did not check");
        assert_eq!(e.code(), "ERR_FERRY_INTEGRITY");
        // READ: only bytes that match the checksum the target took of its source.
        let bytes = [9u8; 100];
        let sum = crate::integrity::checksum(&bytes);
        let mut landed = Running::new();
        landed.update(&bytes[..30]);
        landed.update(&bytes[30..]);
        assert!(check_read(false, None, &landed).is_ok());
        assert!(check_read(true, Some(sum), &landed).is_ok());
        for (checksum, why) in [(None, "no checksum sent"), (Some(sum ^ 1), "a mismatch")] {
            let e = check_read(true, checksum, &landed).expect_err(why);
            assert_eq!(e.code(), "ERR_FERRY_INTEGRITY", "{why}");
        }
        // The reply's flag and token carry what was checked and the checksum.
        let mut books = HashMap::from([(1, asked(Opcode::Write)), (2, asked(Opcode::Read))]);
        let mut ack = header(Op::WriteAck, 1, 0);
        ack.flags = crate::wire::FLAG_CHECKSUM;
        let (_, reply) = decode_with(&mut books, &ack.encode()).expect("ack");
        assert_eq!(reply, Reply::Written { checked: true });
        let mut read = header(Op::ReadResp, 2, LEN);
        read.set_token_checksum(sum);
        let (_, reply) = decode_with(&mut books, &read.encode()).expect("read");
        assert_eq!(
            reply,
            Reply::Read {
                len: LEN,
                checksum: Some(sum)
            }
        );
    }

    #[test]
    fn well_formed_replies_decode_to_what_follows() {
        let mut books = HashMap::from([(1, asked(Opcode::Write)), (2, asked(Opcode::Read))]);
        let ack = header(Op::WriteAck, 1, 0).encode();
        let (req, reply) = decode_with(&mut books, &ack).expect("ack");
        assert_eq!(
            (req.opcode, reply),
            (Opcode::Write, Reply::Written { checked: false })
        );
        let read = header(Op::ReadResp, 2, LEN).encode();
        let (req, reply) = decode_with(&mut books, &read).expect("read");
        assert_eq!(
            (req.opcode, reply),
            (
                Opcode::Read,
                Reply::Read {
                    len: LEN,
                    checksum: None
                }
            )
        );
        assert!(
            books.is_empty(),
            "each reply took its request out of the books"
        );
    }

    #[test]
    fn a_reply_of_the_wrong_op_breaks_and_hands_its_request_back() {
        let every_op = [
            Op::Hello,
            Op::HelloAck,
            Op::WriteReq,
            Op::WriteAck,
            Op::ReadReq,
            Op::ReadResp,
            Op::Error,
            Op::Ping,
            Op::Pong,
            Op::GetDescriptor,
            Op::Descriptor,
            Op::TransportReq,
            Op::TransportResp,
            Op::AuthChallenge,
            Op::AuthProof,
            Op::NotifyOpen,
            Op::Notify,
            Op::NotifyAck,
        ];
        for opcode in [Opcode::Write, Opcode::Read] {
            let fits = |op| {
                matches!(
                    (op, opcode),
                    (Op::WriteAck, Opcode::Write) | (Op::ReadResp, Opcode::Read) | (Op::Error, _)
                )
            };
            for op in every_op.into_iter().filter(|&op| !fits(op)) {
                // Length 0 passes every op's cap on the wire: only the op is wrong.
                let mut books = HashMap::from([(9, asked(opcode))]);
                let bytes = header(op, 9, 0).encode();
                let broken = decode_with(&mut books, &bytes).expect_err("wrong op");
                assert_eq!(broken.request, Some(asked(opcode)), "{op:?} to {opcode:?}");
                assert!(
                    matches!(broken.violation, Violation::Mismatch { op: o, .. } if o == op),
                    "{op:?} to {opcode:?}: {:?}",
                    broken.violation
                );
                assert!(matches!(Error::from(broken.violation), Error::Protocol(_)));
            }
        }
    }

    #[test]
    fn a_reply_for_a_request_not_in_flight_breaks_and_takes_nothing() {
        // A wrong id (the sequence does not match), and a reply on a connection with
        // nothing in flight at all.
        let mut books = HashMap::from([(3, asked(Opcode::Read))]);
        for id in [4, 0, u64::MAX] {
            let bytes = header(Op::ReadResp, id, LEN).encode();
            let broken = decode_with(&mut books, &bytes).expect_err("unknown id");
            assert!(broken.request.is_none());
            assert_eq!(broken.violation, Violation::Unknown(id));
        }
        assert!(
            books.contains_key(&3),
            "the request in flight stays in flight"
        );
        let mut empty = HashMap::new();
        let broken =
            decode_with(&mut empty, &header(Op::WriteAck, 1, 0).encode()).expect_err("none");
        assert_eq!(broken.violation, Violation::Unknown(1));
    }

    #[test]
    fn a_read_reply_of_another_length_than_asked_breaks() {
        for length in [0, 1, LEN - 1, LEN + 1, 2 * LEN, MAX_DATA_PAYLOAD] {
            let h = header(Op::ReadResp, 1, length);
            assert!(
                matches!(
                    answer(&h, asked(Opcode::Read)),
                    Err(Violation::Mismatch { len, .. }) if len == length
                ),
                "length {length}"
            );
        }
        // Beyond the wire's cap the header itself is refused.
        let mut books = HashMap::from([(1, asked(Opcode::Read))]);
        let bytes = header(Op::ReadResp, 1, u64::MAX).encode();
        let broken = decode_with(&mut books, &bytes).expect_err("huge");
        assert!(matches!(
            broken.violation,
            Violation::Header(WireError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_read_reply_larger_than_its_destination_breaks() {
        // The length asked, but the region it lands in holds less from that offset.
        for room in [0, 1, LEN - 1] {
            let a = Asked {
                opcode: Opcode::Read,
                len: LEN,
                room,
                verify: false,
            };
            let got = answer(&header(Op::ReadResp, 1, LEN), a);
            assert_eq!(got, Err(Violation::PastDestination { len: LEN, room }));
            assert!(matches!(
                Error::from(got.expect_err("past")),
                Error::OutOfRange(_)
            ));
        }
        // Exactly the room is fine.
        let a = Asked {
            opcode: Opcode::Read,
            len: LEN,
            room: LEN,
            verify: false,
        };
        assert_eq!(
            answer(&header(Op::ReadResp, 1, LEN), a),
            Ok(Reply::Read {
                len: LEN,
                checksum: None
            })
        );
    }

    #[test]
    fn a_write_ack_with_a_length_breaks() {
        for length in [1, LEN, u64::MAX] {
            assert!(
                matches!(
                    answer(&header(Op::WriteAck, 1, length), asked(Opcode::Write)),
                    Err(Violation::Mismatch { .. })
                ),
                "length {length}"
            );
        }
    }

    #[test]
    fn every_reject_code_words_a_refusal_of_either_kind() {
        let codes = [
            (1, RejectCode::BadToken),
            (2, RejectCode::UnknownBuffer),
            (3, RejectCode::OutOfRange),
            (4, RejectCode::Permission),
            (5, RejectCode::BadRequest),
            (6, RejectCode::Auth),
            (7, RejectCode::ResourceLimit),
            (8, RejectCode::Integrity),
            (9, RejectCode::Tampered),
            // Unknown codes (none, or a newer peer's) read as BadRequest.
            (0, RejectCode::BadRequest),
            (10, RejectCode::BadRequest),
            (u16::MAX, RejectCode::BadRequest),
        ];
        for opcode in [Opcode::Write, Opcode::Read] {
            for (raw, code) in codes {
                let mut h = header(Op::Error, 1, 5);
                h.flags = raw;
                assert_eq!(
                    answer(&h, asked(opcode)),
                    Ok(Reply::Refused { code, text_len: 5 }),
                    "code {raw} to {opcode:?}"
                );
            }
        }
        let e = refusal(RejectCode::Permission, b"read-only\xff");
        assert!(matches!(&e, Error::RemoteRejected(m) if m.starts_with("Permission: read-only")));
        // A verified WRITE the target found corrupted fails as such, not as a refusal.
        let e = refusal(RejectCode::Integrity, b"CRC32C mismatch");
        assert_eq!(e.code(), "ERR_FERRY_INTEGRITY", "{e}");
    }

    #[test]
    fn error_text_is_capped() {
        let at_cap = header(Op::Error, 1, MAX_ERROR_PAYLOAD);
        assert_eq!(
            answer(&at_cap, asked(Opcode::Read)),
            Ok(Reply::Refused {
                code: RejectCode::BadRequest,
                text_len: MAX_ERROR_PAYLOAD as usize
            })
        );
        for length in [MAX_ERROR_PAYLOAD + 1, u64::MAX] {
            // Checked here even when the header did not pass through the wire's cap.
            assert!(matches!(
                answer(&header(Op::Error, 1, length), asked(Opcode::Write)),
                Err(Violation::Mismatch { .. })
            ));
            let mut books = HashMap::from([(1, asked(Opcode::Write))]);
            let broken = decode_with(&mut books, &header(Op::Error, 1, length).encode())
                .expect_err("too long");
            assert!(matches!(broken.violation, Violation::Header(_)));
        }
    }

    #[test]
    fn a_truncated_or_foreign_header_breaks_and_takes_nothing() {
        let good = header(Op::ReadResp, 1, LEN).encode();
        let mut books = HashMap::from([(1, asked(Opcode::Read))]);
        for n in 0..HEADER_LEN {
            let broken = decode_with(&mut books, &good[..n]).expect_err("truncated");
            assert_eq!(
                broken.violation,
                Violation::Header(WireError::Truncated(n)),
                "{n} bytes"
            );
        }
        let mut magic = good;
        magic[0] ^= 0xff;
        let mut version = good;
        version[4] = version[4].wrapping_add(1);
        let mut op = good;
        op[5] = 0xee;
        for bytes in [magic, version, op] {
            let broken = decode_with(&mut books, &bytes).expect_err("foreign");
            assert!(matches!(broken.violation, Violation::Header(_)));
            assert!(broken.request.is_none());
        }
        assert!(books.contains_key(&1), "nothing was taken out of the books");
    }

    #[test]
    fn random_and_mutated_bytes_never_panic() {
        // A small xorshift: deterministic, no dependency.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let good = header(Op::ReadResp, 1, LEN).encode();
        for round in 0..20_000 {
            let mut bytes = good.to_vec();
            if round % 2 == 0 {
                for b in bytes.iter_mut() {
                    *b = next() as u8;
                }
            } else {
                // A valid header with a few bytes flipped, sometimes cut short.
                for _ in 0..(next() % 4 + 1) {
                    let at = (next() % HEADER_LEN as u64) as usize;
                    bytes[at] ^= next() as u8;
                }
                bytes.truncate(HEADER_LEN - (next() % 3) as usize);
            }
            let opcode = if next() % 2 == 0 {
                Opcode::Read
            } else {
                Opcode::Write
            };
            let a = Asked {
                opcode,
                len: next() % (2 * LEN),
                room: next() % (2 * LEN),
                verify: false,
            };
            let mut books = HashMap::from([(1, a)]);
            if let Ok((_, reply)) = decode_with(&mut books, &bytes) {
                // Whatever passed obeys the guards.
                match reply {
                    Reply::Written { .. } => assert_eq!(a.opcode, Opcode::Write),
                    Reply::Read { len, .. } => {
                        assert_eq!(a.opcode, Opcode::Read);
                        assert!(len == a.len && len <= a.room);
                    }
                    Reply::Refused { text_len, .. } => {
                        assert!(text_len as u64 <= MAX_ERROR_PAYLOAD)
                    }
                }
            }
        }
    }
}
