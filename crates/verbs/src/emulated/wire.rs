//! The emulated device's wire format between an initiator QP and a responder: one request
//! frame per work request, one response frame per request (executed, refused, or dropped
//! as an HCA drops a packet for a QP not connected to its sender). Little endian,
//! fixed-size headers; payloads follow the header.

use super::Gid;

/// Frame magic ("FEVR").
const MAGIC: u32 = 0x4645_5652;
/// Protocol version (2: every request is answered, `Dropped` included).
const VERSION: u8 = 2;
/// Largest message (the verbs limit of 2 GiB).
pub(crate) const MAX_LEN: u32 = 1 << 31;
/// Bytes of a request header.
pub(crate) const REQUEST_LEN: usize = 64;
/// Bytes of a response header.
pub(crate) const RESPONSE_LEN: usize = 24;

/// Operation carried by a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Payload → responder memory.
    Write,
    /// Responder memory → response payload.
    Read,
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) seq: u64,
    pub(crate) src_qpn: u32,
    pub(crate) dst_qpn: u32,
    pub(crate) src_gid: Gid,
    pub(crate) rkey: u32,
    pub(crate) remote_addr: u64,
    pub(crate) len: u32,
}

/// How the responder answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Executed.
    Ok,
    /// Remote access NAK: nothing was touched.
    AccessNak,
    /// Dropped without effect (no QP connected to the sender): an HCA sends nothing back,
    /// so the initiator's retransmissions go unanswered until its retries run out.
    Dropped,
}

/// A response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    pub(crate) status: Status,
    pub(crate) seq: u64,
    pub(crate) len: u32,
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("bad magic {0:#x}")]
    Magic(u32),
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("unknown opcode {0}")]
    Op(u8),
    #[error("unknown status {0}")]
    Status(u8),
    #[error("length {0} above the 2 GiB message limit")]
    Length(u32),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Request {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = match self.op {
            Op::Write => 1,
            Op::Read => 2,
        };
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_qpn.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_qpn.to_le_bytes());
        b[24..40].copy_from_slice(&self.src_gid);
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b[48..56].copy_from_slice(&self.remote_addr.to_le_bytes());
        b[56..60].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header.
    pub(crate) fn decode(b: &[u8; REQUEST_LEN]) -> Result<Self, WireError> {
        check_preamble(b)?;
        let op = match b[5] {
            1 => Op::Write,
            2 => Op::Read,
            other => return Err(WireError::Op(other)),
        };
        let mut src_gid = [0u8; 16];
        src_gid.copy_from_slice(&b[24..40]);
        let len = u32_at(b, 56);
        if len > MAX_LEN {
            return Err(WireError::Length(len));
        }
        Ok(Self {
            op,
            seq: u64_at(b, 8),
            src_qpn: u32_at(b, 16),
            dst_qpn: u32_at(b, 20),
            src_gid,
            rkey: u32_at(b, 40),
            remote_addr: u64_at(b, 48),
            len,
        })
    }
}

impl Response {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = match self.status {
            Status::Ok => 0,
            Status::AccessNak => 1,
            Status::Dropped => 2,
        };
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header.
    pub(crate) fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Self, WireError> {
        check_preamble(b)?;
        let status = match b[5] {
            0 => Status::Ok,
            1 => Status::AccessNak,
            2 => Status::Dropped,
            other => return Err(WireError::Status(other)),
        };
        let len = u32_at(b, 16);
        if len > MAX_LEN {
            return Err(WireError::Length(len));
        }
        Ok(Self {
            status,
            seq: u64_at(b, 8),
            len,
        })
    }
}

fn check_preamble(b: &[u8]) -> Result<(), WireError> {
    let magic = u32_at(b, 0);
    if magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    if b[4] != VERSION {
        return Err(WireError::Version(b[4]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips() {
        let r = Request {
            op: Op::Read,
            seq: 7,
            src_qpn: 0x12_3456,
            dst_qpn: 9,
            src_gid: [3; 16],
            rkey: 0xdead_beef,
            remote_addr: 0x7fff_0000_1000,
            len: 4096,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn response_round_trips() {
        for status in [Status::Ok, Status::AccessNak, Status::Dropped] {
            let r = Response {
                status,
                seq: u64::MAX,
                len: 0,
            };
            assert_eq!(Response::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn malformed_frames_are_refused() {
        let mut b = Request {
            op: Op::Write,
            seq: 1,
            src_qpn: 1,
            dst_qpn: 1,
            src_gid: [0; 16],
            rkey: 1,
            remote_addr: 0,
            len: 1,
        }
        .encode();
        let good = b;
        b[0] ^= 1;
        assert!(matches!(Request::decode(&b), Err(WireError::Magic(_))));
        b = good;
        b[4] = 9;
        assert_eq!(Request::decode(&b), Err(WireError::Version(9)));
        b = good;
        b[5] = 3;
        assert_eq!(Request::decode(&b), Err(WireError::Op(3)));
        b = good;
        b[56..60].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Request::decode(&b), Err(WireError::Length(u32::MAX)));
        let mut r = Response {
            status: Status::Ok,
            seq: 1,
            len: 0,
        }
        .encode();
        r[5] = 7;
        assert_eq!(Response::decode(&r), Err(WireError::Status(7)));
    }
}
