//! The wire codec shared by the control plane and the TCP data path: one fixed, versioned
//! header, optionally followed by a payload. Pure code: no sockets, fully unit tested.
//!
//! ```text
//! 0      4    5   6       8            16           24       32       40         56
//! | FRRY | ver| op| flags | request id | buffer id  | offset | length | token    |
//! ```
//! All integers little-endian. `length` is the payload length for frames that carry one
//! (WRITE, READ response, error text, descriptor) and the requested length for READ.

/// Frame magic: "FRRY".
pub const MAGIC: [u8; 4] = *b"FRRY";
/// Protocol version spoken by this build.
pub const VERSION: u8 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 56;
/// Largest data payload a frame may carry (one slice).
pub const MAX_DATA_PAYLOAD: u64 = 64 << 20;
/// Largest control payload (a segment descriptor).
pub const MAX_CONTROL_PAYLOAD: u64 = 4 << 20;
/// Largest error text.
pub const MAX_ERROR_PAYLOAD: u64 = 4096;
/// Largest notification payload any engine accepts (its own `notifyMaxBytes` may be lower).
pub const MAX_NOTIFY_PAYLOAD: u64 = 64 << 10;
/// Largest sender name in `NotifyOpen`.
pub const MAX_NOTIFY_NAME: u64 = 1024;
/// Payload of the handshake's `AuthChallenge` and `AuthProof` frames: one MAC, an
/// HMAC-SHA256 tag (`auth` makes and checks it).
pub const MAC_LEN: usize = 32;

/// `flags` bit of the data ops (`verify`): on a `WriteReq`, a [`CHECKSUM_LEN`]-byte
/// CRC32C of the payload follows the header, before the payload (counted by
/// `payload_len`, not by `length`); on a `ReadReq`, the initiator asks for the CRC32C of
/// the range; on a `ReadResp`, the token field's first four bytes carry it; on a
/// `WriteAck`, the target checked the payload against its checksum before it landed.
pub const FLAG_CHECKSUM: u16 = 1;
/// Bytes of a checksum word (a CRC32C, little-endian).
pub const CHECKSUM_LEN: usize = 4;

/// Access token: 128 random bits per segment.
pub type Token = [u8; 16];

/// Connection kinds announced in `Hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// Descriptor fetch and heartbeats.
    Control = 1,
    /// READ/WRITE slices.
    Data = 2,
    /// The shm transport's unix socket (memfds).
    Shm = 3,
    /// Notifications from one sender (`notify`), in order.
    Notify = 4,
}

impl ConnKind {
    /// Parses the kind field of a `Hello`.
    pub fn from_raw(raw: u64) -> Option<Self> {
        match raw {
            1 => Some(Self::Control),
            2 => Some(Self::Data),
            3 => Some(Self::Shm),
            4 => Some(Self::Notify),
            _ => None,
        }
    }
}

/// Frame operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// First frame of a connection: `buffer_id` = kind, `request_id` = sender engine id.
    Hello = 1,
    /// Reply to Hello: `request_id` = the server's engine id.
    HelloAck = 2,
    /// Write `length` payload bytes at `offset` of `buffer_id`.
    WriteReq = 3,
    /// The write was copied into the target's memory.
    WriteAck = 4,
    /// Read `length` bytes at `offset` of `buffer_id`.
    ReadReq = 5,
    /// The bytes of a read, as payload.
    ReadResp = 6,
    /// The request failed: `flags` = reject code, payload = reason text.
    Error = 7,
    /// Heartbeat.
    Ping = 8,
    /// Heartbeat reply.
    Pong = 9,
    /// Ask for the segment descriptor.
    GetDescriptor = 10,
    /// The segment descriptor as JSON payload.
    Descriptor = 11,
    /// A transport's own control request (e.g. an RDMA endpoint handshake):
    /// `buffer_id` = transport kind, payload = the transport's message.
    TransportReq = 12,
    /// The reply to `TransportReq`, payload = the transport's answer.
    TransportResp = 13,
    /// The server's half of the handshake (`auth`): `token` = server nonce, payload = MAC.
    AuthChallenge = 14,
    /// The client's proof (`auth`): payload = MAC.
    AuthProof = 15,
    /// First frame of a notification connection: payload = the sender's segment name.
    NotifyOpen = 16,
    /// A notification: `request_id` = the sender's sequence number, `offset` = bytes of
    /// the call it rode on, payload = its data.
    Notify = 17,
    /// The target took the notification: `request_id` = its sequence number, `flags` =
    /// `NotifyOutcome`.
    NotifyAck = 18,
    /// The sender's engine is closing (on a control connection, from the server): the
    /// peer said goodbye, so its loss is `closed`, not a crash.
    Goodbye = 19,
}

impl Op {
    fn from_raw(raw: u8) -> Option<Self> {
        Some(match raw {
            1 => Self::Hello,
            2 => Self::HelloAck,
            3 => Self::WriteReq,
            4 => Self::WriteAck,
            5 => Self::ReadReq,
            6 => Self::ReadResp,
            7 => Self::Error,
            8 => Self::Ping,
            9 => Self::Pong,
            10 => Self::GetDescriptor,
            11 => Self::Descriptor,
            12 => Self::TransportReq,
            13 => Self::TransportResp,
            14 => Self::AuthChallenge,
            15 => Self::AuthProof,
            16 => Self::NotifyOpen,
            17 => Self::Notify,
            18 => Self::NotifyAck,
            19 => Self::Goodbye,
            _ => return None,
        })
    }

    /// Largest payload a frame with this op may carry.
    fn payload_cap(self) -> u64 {
        match self {
            Self::WriteReq | Self::ReadResp => MAX_DATA_PAYLOAD,
            Self::Descriptor | Self::TransportReq | Self::TransportResp => MAX_CONTROL_PAYLOAD,
            Self::Error => MAX_ERROR_PAYLOAD,
            Self::Notify => MAX_NOTIFY_PAYLOAD,
            Self::NotifyOpen => MAX_NOTIFY_NAME,
            Self::AuthChallenge | Self::AuthProof => MAC_LEN as u64,
            Self::ReadReq => MAX_DATA_PAYLOAD, // requested length, not payload
            _ => 0,
        }
    }

    /// Whether `length` counts payload bytes that follow the header.
    fn has_payload(self) -> bool {
        matches!(
            self,
            Self::WriteReq
                | Self::ReadResp
                | Self::Error
                | Self::Descriptor
                | Self::TransportReq
                | Self::TransportResp
                | Self::AuthChallenge
                | Self::AuthProof
                | Self::NotifyOpen
                | Self::Notify
        )
    }
}

/// Why a target refused a request (carried in `flags` of an `Error` frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectCode {
    /// The access token did not match.
    BadToken = 1,
    /// No such buffer.
    UnknownBuffer = 2,
    /// The range lies outside the buffer.
    OutOfRange = 3,
    /// The buffer is read-only.
    Permission = 4,
    /// Anything else.
    BadRequest = 5,
    /// The handshake failed: no secret, wrong secret, or a refused connection.
    Auth = 6,
    /// The connection was refused because a limit was reached: open files, memory, or a
    /// connection cap (the text names which).
    ResourceLimit = 7,
    /// A verified WRITE's payload did not match its checksum: nothing of it landed.
    Integrity = 8,
    /// A sealed connection's frame failed its authentication: the connection is dropped
    /// (request id 0: it concerns the connection, not one request).
    Tampered = 9,
}

impl RejectCode {
    /// Parses a reject code; unknown values read as `BadRequest`.
    pub fn from_raw(raw: u16) -> Self {
        match raw {
            1 => Self::BadToken,
            2 => Self::UnknownBuffer,
            3 => Self::OutOfRange,
            4 => Self::Permission,
            6 => Self::Auth,
            7 => Self::ResourceLimit,
            8 => Self::Integrity,
            9 => Self::Tampered,
            _ => Self::BadRequest,
        }
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Operation.
    pub op: Op,
    /// Op-specific flags (reject code for `Error`).
    pub flags: u16,
    /// Request id, echoed in the reply.
    pub request_id: u64,
    /// Remote buffer id (or connection kind for `Hello`).
    pub buffer_id: u64,
    /// Offset inside the buffer.
    pub offset: u64,
    /// Payload or requested length.
    pub length: u64,
    /// Access token.
    pub token: Token,
}

/// Why bytes could not be decoded as a header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer than `HEADER_LEN` bytes.
    #[error("truncated header: {0} of {HEADER_LEN} bytes")]
    Truncated(usize),
    /// Not a Ferry frame.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A version this build does not speak.
    #[error("unsupported protocol version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    /// An unknown op.
    #[error("unknown op {0}")]
    UnknownOp(u8),
    /// The length exceeds what the op allows.
    #[error("frame length {length} exceeds the cap of {cap} for {op:?}")]
    TooLarge {
        /// Op.
        op: Op,
        /// Announced length.
        length: u64,
        /// Allowed maximum.
        cap: u64,
    },
}

impl Header {
    /// A header with everything but the op zeroed.
    pub fn new(op: Op) -> Self {
        Self {
            op,
            flags: 0,
            request_id: 0,
            buffer_id: 0,
            offset: 0,
            length: 0,
            token: [0; 16],
        }
    }

    /// Number of payload bytes following this header (a WRITE's checksum word included).
    pub fn payload_len(&self) -> u64 {
        if self.op.has_payload() {
            self.length + self.checksum_word_len() as u64
        } else {
            0
        }
    }

    /// Bytes of the checksum word between this header and its payload: a verified WRITE
    /// has one ([`FLAG_CHECKSUM`]).
    pub fn checksum_word_len(&self) -> usize {
        if self.op == Op::WriteReq && self.flags & FLAG_CHECKSUM != 0 {
            CHECKSUM_LEN
        } else {
            0
        }
    }

    /// Whether `flags` has [`FLAG_CHECKSUM`].
    pub fn checksummed(&self) -> bool {
        self.flags & FLAG_CHECKSUM != 0
    }

    /// A `ReadResp`'s checksum, carried in its token field (which a reply does not use),
    /// when it has [`FLAG_CHECKSUM`].
    pub fn token_checksum(&self) -> Option<u32> {
        let word = [self.token[0], self.token[1], self.token[2], self.token[3]];
        self.checksummed().then(|| u32::from_le_bytes(word))
    }

    /// Sets [`FLAG_CHECKSUM`] and puts `checksum` in the token field (a `ReadResp`).
    pub fn set_token_checksum(&mut self, checksum: u32) {
        self.flags |= FLAG_CHECKSUM;
        self.token[..CHECKSUM_LEN].copy_from_slice(&checksum.to_le_bytes());
    }

    /// Encodes into a fixed buffer.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.buffer_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.length.to_le_bytes());
        b[40..56].copy_from_slice(&self.token);
        b
    }

    /// Decodes and validates a header from the first `HEADER_LEN` bytes of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated(bytes.len()))?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::BadVersion(b[4]));
        }
        let op = Op::from_raw(b[5]).ok_or(WireError::UnknownOp(b[5]))?;
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut token = [0u8; 16];
        token.copy_from_slice(&b[40..56]);
        let header = Self {
            op,
            flags: u16::from_le_bytes([b[6], b[7]]),
            request_id: u64_at(8),
            buffer_id: u64_at(16),
            offset: u64_at(24),
            length: u64_at(32),
            token,
        };
        let cap = op.payload_cap();
        if header.length > cap && (op.has_payload() || op == Op::ReadReq) {
            return Err(WireError::TooLarge {
                op,
                length: header.length,
                cap,
            });
        }
        Ok(header)
    }
}

/// A header as written, and the checksum word that follows a verified WRITE's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    bytes: [u8; HEADER_LEN + CHECKSUM_LEN],
    len: usize,
}

impl FrameHead {
    /// A header, and the checksum word after it when `checksum` is given (its header must
    /// say so: [`FLAG_CHECKSUM`]).
    pub fn new(header: [u8; HEADER_LEN], checksum: Option<u32>) -> Self {
        let mut bytes = [0u8; HEADER_LEN + CHECKSUM_LEN];
        bytes[..HEADER_LEN].copy_from_slice(&header);
        let len = match checksum {
            Some(c) => {
                bytes[HEADER_LEN..].copy_from_slice(&c.to_le_bytes());
                HEADER_LEN + CHECKSUM_LEN
            }
            None => HEADER_LEN,
        };
        Self { bytes, len }
    }
}

impl From<[u8; HEADER_LEN]> for FrameHead {
    fn from(header: [u8; HEADER_LEN]) -> Self {
        Self::new(header, None)
    }
}

impl std::ops::Deref for FrameHead {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Compares two tokens in constant time.
pub fn token_eq(a: &Token, b: &Token) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    // black_box keeps the optimizer from short-circuiting the loop above.
    std::hint::black_box(diff) == 0
}

/// Splits a stream of bytes into frames: the incremental decoder used by tests and tools
/// to check what a peer sent. Returns the header and payload of the first complete frame,
/// `Ok(None)` when more bytes are needed.
pub fn split_frame(bytes: &[u8]) -> Result<Option<(Header, &[u8])>, WireError> {
    if bytes.len() < HEADER_LEN {
        // Check what we can early, so garbage is refused before it is complete.
        if bytes.len() >= 4 && bytes[..4] != MAGIC {
            return Err(WireError::BadMagic([
                bytes[0], bytes[1], bytes[2], bytes[3],
            ]));
        }
        return Ok(None);
    }
    let header = Header::decode(bytes)?;
    let payload_len = usize::try_from(header.payload_len()).map_err(|_| WireError::TooLarge {
        op: header.op,
        length: header.length,
        cap: header.op.payload_cap(),
    })?;
    let end = HEADER_LEN.saturating_add(payload_len);
    if bytes.len() < end {
        return Ok(None);
    }
    Ok(Some((header, &bytes[HEADER_LEN..end])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(op: Op, length: u64) -> Header {
        Header {
            op,
            flags: 3,
            request_id: 0x0102_0304_0506_0708,
            buffer_id: 42,
            offset: u64::MAX - 7,
            length,
            token: [0xAB; 16],
        }
    }

    #[test]
    fn round_trip_every_op() {
        for raw in 1..=19u8 {
            // Each op at a length it allows (auth frames carry exactly one MAC).
            let op = Op::from_raw(raw).expect("op");
            let h = sample(op, op.payload_cap().min(100));
            let bytes = h.encode();
            assert_eq!(Header::decode(&bytes).expect("decode"), h);
        }
    }

    #[test]
    fn a_verified_write_carries_its_checksum_word_before_the_payload() {
        let mut h = sample(Op::WriteReq, 5);
        h.flags = FLAG_CHECKSUM;
        assert_eq!((h.length, h.payload_len()), (5, 5 + CHECKSUM_LEN as u64));
        let head = FrameHead::new(h.encode(), Some(0xDEAD_BEEF));
        assert_eq!(head.len(), HEADER_LEN + CHECKSUM_LEN);
        assert_eq!(&head[HEADER_LEN..], &0xDEAD_BEEFu32.to_le_bytes());
        let mut bytes = head.to_vec();
        bytes.extend_from_slice(b"hello");
        let (got, payload) = split_frame(&bytes).expect("ok").expect("complete");
        assert_eq!(got, h);
        assert_eq!(payload, b"\xEF\xBE\xAD\xDEhello");
        // The flag means nothing else on other ops' lengths.
        let mut ack = sample(Op::ReadResp, 5);
        ack.flags = 0;
        assert_eq!(ack.token_checksum(), None);
        ack.set_token_checksum(7);
        assert_eq!((ack.payload_len(), ack.token_checksum()), (5, Some(7)));
    }

    #[test]
    fn frame_split_with_payload() {
        let mut h = sample(Op::WriteReq, 5);
        h.flags = 2; // no FLAG_CHECKSUM: the payload follows the header at once
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(b"hello");
        bytes.extend_from_slice(b"next");
        let (got, payload) = split_frame(&bytes).expect("ok").expect("complete");
        assert_eq!(got, h);
        assert_eq!(payload, b"hello");
    }

    #[test]
    fn truncated_frames_need_more_bytes() {
        let h = sample(Op::WriteReq, 5);
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(b"hello");
        for cut in 0..bytes.len() {
            assert_eq!(
                split_frame(&bytes[..cut]).expect("no error"),
                None,
                "cut {cut}"
            );
        }
        assert!(matches!(
            Header::decode(&bytes[..HEADER_LEN - 1]),
            Err(WireError::Truncated(55))
        ));
    }

    #[test]
    fn oversized_frames_are_refused() {
        let too_big = sample(Op::WriteReq, MAX_DATA_PAYLOAD + 1).encode();
        assert!(matches!(
            Header::decode(&too_big),
            Err(WireError::TooLarge { .. })
        ));
        let read_too_big = sample(Op::ReadReq, u64::MAX).encode();
        assert!(matches!(
            Header::decode(&read_too_big),
            Err(WireError::TooLarge { .. })
        ));
        let desc = sample(Op::Descriptor, MAX_CONTROL_PAYLOAD + 1).encode();
        assert!(Header::decode(&desc).is_err());
        let err = sample(Op::Error, MAX_ERROR_PAYLOAD + 1).encode();
        assert!(Header::decode(&err).is_err());
        let note = sample(Op::Notify, MAX_NOTIFY_PAYLOAD + 1).encode();
        assert!(Header::decode(&note).is_err());
        let name = sample(Op::NotifyOpen, MAX_NOTIFY_NAME + 1).encode();
        assert!(Header::decode(&name).is_err());
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let mut b = sample(Op::Ping, 0).encode();
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(WireError::BadMagic(_))));
        assert!(split_frame(b"GET / HTTP/1.1\r\n").is_err());
        let mut v = sample(Op::Ping, 0).encode();
        v[4] = 9;
        assert_eq!(Header::decode(&v), Err(WireError::BadVersion(9)));
        let mut o = sample(Op::Ping, 0).encode();
        o[5] = 200;
        assert_eq!(Header::decode(&o), Err(WireError::UnknownOp(200)));
        // A cheap deterministic fuzz: xorshift bytes, with and without a valid prefix.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..20_000 {
            let mut buf = [0u8; HEADER_LEN + 8];
            for byte in buf.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            if i % 2 == 0 {
                buf[..4].copy_from_slice(&MAGIC);
                buf[4] = VERSION;
            }
            let _ = Header::decode(&buf);
            let _ = split_frame(&buf);
        }
    }

    #[test]
    fn tokens_compare() {
        assert!(token_eq(&[1; 16], &[1; 16]));
        let mut other = [1; 16];
        other[15] = 2;
        assert!(!token_eq(&[1; 16], &other));
    }
}
