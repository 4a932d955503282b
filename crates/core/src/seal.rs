//! Sealed records: the keys of one encrypted connection, its per-direction nonce counters,
//! and the sealing and opening of one record. Pure code: bytes in, bytes out; the streams
//! that carry records live in `sealed_stream`.
//!
//! Keys come from the authenticated handshake (`auth`): HKDF-SHA256 with the cluster
//! secret as the extract key and the handshake's transcript (both sides' fresh random
//! nonces, both engine ids, the connection kind) as input, expanded once per direction.
//! Every connection therefore has keys of its own, unrelated to any other connection's,
//! reconnect or incarnation's, and each direction a key of its own: a nonce is a counter
//! that starts at 0 per key, and no (key, nonce) pair is ever used twice. A counter that
//! would wrap ends the connection instead ([`Error::Tampered`]).
//!
//! A record on the wire:
//!
//! ```text
//! u32 LE  length of the plaintext (≤ MAX_RECORD); also the AEAD's associated data
//! bytes   ciphertext (AES-256-GCM, nonce = 4 zero bytes ‖ u64 BE counter)
//! 16      tag
//! ```
//!
//! An opened record is whole and authentic, or it is an error and none of it is handed
//! out: the reader of a record holds it in its own buffer until the tag verified.
//!
//! The AEAD and HKDF are aws-lc-rs's (AWS-LC's AES-GCM picks the widest code the CPU
//! runs at startup: VAES with VPCLMULQDQ on AVX-512 parts, else AES-NI and PCLMULQDQ).
//! Both ends of a sealed connection spend most of their extra time in it, so its speed
//! per byte is most of what sealing costs.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf::{Prk, HKDF_SHA256};

use crate::error::{Error, Result};
use crate::wire::{HEADER_LEN, MAX_DATA_PAYLOAD};

/// Bytes of a record's length prefix.
pub(crate) const LEN_PREFIX: usize = 4;
/// Bytes of a record's tag.
pub(crate) const TAG_LEN: usize = 16;
/// The largest plaintext of one record: a whole data frame (header and its largest
/// payload), so that no frame's payload is ever handed out before all of it verified.
pub(crate) const MAX_RECORD: usize = HEADER_LEN + MAX_DATA_PAYLOAD as usize;

const CLIENT_TO_SERVER: &[u8] = b"ferry seal v1 client to server";
const SERVER_TO_CLIENT: &[u8] = b"ferry seal v1 server to client";

/// Which end of the handshake this is: it picks which derived key seals and which opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The end that sent the Hello.
    Client,
    /// The end that answered it.
    Server,
}

/// One direction's key and the counter of the next nonce.
struct Direction {
    key: LessSafeKey,
    next: u64,
}

impl Direction {
    fn new(prk: &Prk, info: &[u8]) -> Result<Self> {
        // The key's bytes are taken out by hand, not through aws-lc-rs's `From<Okm>` for
        // `UnboundKey` (which unwraps): a failure here is an error, not a panic.
        let failed = |_| Error::Protocol("cannot derive a connection key".into());
        let info = [info];
        let mut bytes = [0u8; 32];
        prk.expand(&info, &AES_256_GCM)
            .and_then(|okm| okm.fill(&mut bytes))
            .map_err(failed)?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(failed);
        bytes.fill(0);
        Ok(Self {
            key: LessSafeKey::new(key?),
            next: 0,
        })
    }

    /// The next nonce; the counter that would wrap ends the stream (a nonce used twice
    /// under one key would give away both plaintexts and the authentication key).
    fn take_nonce(&mut self) -> Result<Nonce> {
        let n = self.next;
        self.next = n.checked_add(1).ok_or_else(|| {
            Error::Tampered("the connection's frame counter is exhausted; reconnect".into())
        })?;
        let mut bytes = [0u8; NONCE_LEN];
        bytes[NONCE_LEN - 8..].copy_from_slice(&n.to_be_bytes());
        Ok(Nonce::assume_unique_for_key(bytes))
    }
}

/// The sealing half of a connection's keys: seals records this side sends.
pub(crate) struct Sealer(Direction);

/// The opening half: opens records the peer sent.
pub(crate) struct Opener(Direction);

/// Both halves of one connection's keys.
pub(crate) struct SealKeys {
    pub(crate) sealer: Sealer,
    pub(crate) opener: Opener,
}

impl std::fmt::Debug for SealKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKeys(..)")
    }
}

impl SealKeys {
    /// The keys of a connection for `side`, from its HKDF pseudorandom key `extracted`:
    /// the extract step over the secret and the handshake transcript
    /// (`auth::Secret::extract_key`).
    pub(crate) fn derive(extracted: &[u8; 32], side: Side) -> Result<Self> {
        let prk = Prk::new_less_safe(HKDF_SHA256, extracted);
        let to_server = Direction::new(&prk, CLIENT_TO_SERVER)?;
        let to_client = Direction::new(&prk, SERVER_TO_CLIENT)?;
        let (seal, open) = match side {
            Side::Client => (to_server, to_client),
            Side::Server => (to_client, to_server),
        };
        Ok(Self {
            sealer: Sealer(seal),
            opener: Opener(open),
        })
    }

    /// Both halves, for the two halves of a split stream.
    pub(crate) fn split(self) -> (Sealer, Opener) {
        (self.sealer, self.opener)
    }
}

impl Sealer {
    /// Appends one record holding `plaintext` (at most [`MAX_RECORD`] bytes) to `out`.
    pub(crate) fn seal_into(&mut self, plaintext: &[&[u8]], out: &mut Vec<u8>) -> Result<()> {
        let len: usize = plaintext.iter().map(|p| p.len()).sum();
        if len > MAX_RECORD {
            return Err(Error::Protocol(format!(
                "a record of {len} bytes is over the limit of {MAX_RECORD}"
            )));
        }
        let nonce = self.0.take_nonce()?;
        let prefix = (len as u32).to_le_bytes();
        out.reserve(LEN_PREFIX + len + TAG_LEN);
        out.extend_from_slice(&prefix);
        let start = out.len();
        for p in plaintext {
            out.extend_from_slice(p);
        }
        let tag = self
            .0
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(prefix), &mut out[start..])
            .map_err(|_| Error::Protocol("sealing a record failed".into()))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    #[cfg(test)]
    fn starting_at(&mut self, counter: u64) {
        self.0.next = counter;
    }
}

/// The plaintext length a record's prefix announces, checked against [`MAX_RECORD`]
/// before anything is allocated for it.
pub(crate) fn record_len(prefix: [u8; LEN_PREFIX]) -> Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_RECORD {
        return Err(Error::Tampered(format!(
            "a record announces {len} bytes, over the limit of {MAX_RECORD}"
        )));
    }
    Ok(len)
}

impl Opener {
    /// Opens the record whose prefix was `prefix` and whose ciphertext and tag are
    /// `sealed` (in place): the plaintext, or `Tampered` with `sealed` zeroed.
    pub(crate) fn open_in_place<'a>(
        &mut self,
        prefix: [u8; LEN_PREFIX],
        sealed: &'a mut [u8],
    ) -> Result<&'a mut [u8]> {
        let nonce = self.0.take_nonce()?;
        self.0
            .key
            .open_in_place(nonce, Aad::from(prefix), sealed)
            .map_err(|_| {
                Error::Tampered(
                    "a sealed frame failed its authentication; connection dropped".into(),
                )
            })
    }

    #[cfg(test)]
    fn starting_at(&mut self, counter: u64) {
        self.0.next = counter;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(transcript: &[u8]) -> (SealKeys, SealKeys) {
        let s = crate::auth::Secret::new(vec![7u8; 32]).expect("secret");
        let extracted = s.extract_key(transcript);
        (
            SealKeys::derive(&extracted, Side::Client).expect("client"),
            SealKeys::derive(&extracted, Side::Server).expect("server"),
        )
    }

    fn open(opener: &mut Opener, record: &[u8]) -> Result<Vec<u8>> {
        let prefix: [u8; LEN_PREFIX] = record[..LEN_PREFIX].try_into().expect("prefix");
        let len = record_len(prefix)?;
        let mut body = record[LEN_PREFIX..].to_vec();
        assert_eq!(body.len(), len + TAG_LEN);
        opener.open_in_place(prefix, &mut body).map(|p| p.to_vec())
    }

    #[test]
    fn a_record_sealed_by_one_side_opens_on_the_other_in_both_directions() {
        let (mut client, mut server) = pair(b"transcript one");
        let mut rec = Vec::new();
        client
            .sealer
            .seal_into(&[b"head", b"payload"], &mut rec)
            .expect("seal");
        assert!(!rec.windows(7).any(|w| w == b"payload"), "sealed");
        assert_eq!(
            open(&mut server.opener, &rec).expect("open"),
            b"headpayload"
        );
        let mut back = Vec::new();
        server
            .sealer
            .seal_into(&[b"reply"], &mut back)
            .expect("seal");
        assert_eq!(open(&mut client.opener, &back).expect("open"), b"reply");
    }

    #[test]
    fn every_flipped_bit_of_a_record_is_tampered() {
        let (mut client, _) = pair(b"t");
        let mut rec = Vec::new();
        client
            .sealer
            .seal_into(&[b"0123456789"], &mut rec)
            .expect("seal");
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x01;
            let (_, mut server) = pair(b"t");
            let prefix: [u8; LEN_PREFIX] = bad[..LEN_PREFIX].try_into().expect("prefix");
            let mut body = bad[LEN_PREFIX..].to_vec();
            let err = server
                .opener
                .open_in_place(prefix, &mut body)
                .expect_err("tampered");
            assert_eq!(err.code(), "ERR_FERRY_TAMPERED", "byte {i}: {err}");
        }
    }

    #[test]
    fn a_replayed_or_reordered_record_does_not_open() {
        let (mut client, mut server) = pair(b"t");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        client.sealer.seal_into(&[b"first"], &mut a).expect("seal");
        client.sealer.seal_into(&[b"second"], &mut b).expect("seal");
        assert_eq!(
            open(&mut server.opener, &b)
                .expect_err("out of order")
                .code(),
            "ERR_FERRY_TAMPERED"
        );
        let (_, mut fresh) = pair(b"t");
        assert_eq!(open(&mut fresh.opener, &a).expect("first"), b"first");
        assert_eq!(
            open(&mut fresh.opener, &a).expect_err("replayed").code(),
            "ERR_FERRY_TAMPERED"
        );
    }

    #[test]
    fn another_handshake_or_direction_has_other_keys() {
        // The same plaintext at the same counter: a new transcript (a reconnect, a new
        // incarnation: fresh nonces of both ends) or the other direction seals it apart.
        let seal = |keys: &mut SealKeys| {
            let mut rec = Vec::new();
            keys.sealer
                .seal_into(&[b"same bytes"], &mut rec)
                .expect("seal");
            rec
        };
        let (mut c1, mut s1) = pair(b"handshake with nonces A");
        let (mut c2, _) = pair(b"handshake with nonces B");
        let (r1, r2, back) = (seal(&mut c1), seal(&mut c2), seal(&mut s1));
        assert_ne!(r1, r2);
        assert_ne!(r1, back);
        let (_, mut s2) = pair(b"handshake with nonces B");
        assert_eq!(
            open(&mut s2.opener, &r1).expect_err("other keys").code(),
            "ERR_FERRY_TAMPERED"
        );
    }

    #[test]
    fn a_counter_that_would_wrap_ends_the_stream_instead() {
        let (mut client, mut server) = pair(b"t");
        client.sealer.starting_at(u64::MAX - 1);
        server.opener.starting_at(u64::MAX - 1);
        let mut rec = Vec::new();
        client
            .sealer
            .seal_into(&[b"last"], &mut rec)
            .expect("the last nonce");
        assert_eq!(open(&mut server.opener, &rec).expect("opens"), b"last");
        let mut more = Vec::new();
        let err = client
            .sealer
            .seal_into(&[b"more"], &mut more)
            .expect_err("wraps");
        assert_eq!(err.code(), "ERR_FERRY_TAMPERED", "{err}");
        assert!(more.is_empty(), "nothing sealed");
        let err = server
            .opener
            .open_in_place([0; LEN_PREFIX], &mut [0u8; TAG_LEN])
            .expect_err("wraps");
        assert_eq!(err.code(), "ERR_FERRY_TAMPERED", "{err}");
    }

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn records_are_the_known_answers_so_builds_with_another_aes_gcm_interoperate() {
        // Records of one fixed HKDF key, as an engine sealing with ring's AES-GCM and
        // HKDF wrote them: engines of either build must open each other's records, so
        // the derivation, the nonce layout and the associated data may not drift.
        let extracted = [0x42u8; 32];
        let to_server = "0c0000005349552047b708608f46967b37dd1c50033114ecdf046604d1bec2cf";
        let to_client = "080000007246cb1f91bf1ca82b3c5dd8080d96cc7d15d7061da2e58e";
        let mut client = SealKeys::derive(&extracted, Side::Client).expect("client");
        let mut server = SealKeys::derive(&extracted, Side::Server).expect("server");
        let mut rec = Vec::new();
        client
            .sealer
            .seal_into(&[b"known ", b"answer"], &mut rec)
            .expect("seal");
        assert_eq!(rec, unhex(to_server));
        server.sealer.starting_at(1);
        let mut back = Vec::new();
        server
            .sealer
            .seal_into(&[b"and back"], &mut back)
            .expect("seal");
        assert_eq!(back, unhex(to_client));
        assert_eq!(
            open(&mut server.opener, &unhex(to_server)).expect("open"),
            b"known answer"
        );
        client.opener.starting_at(1);
        assert_eq!(
            open(&mut client.opener, &unhex(to_client)).expect("open"),
            b"and back"
        );
    }

    #[test]
    fn an_oversized_length_is_refused_before_any_allocation() {
        let err = record_len(u32::MAX.to_le_bytes()).expect_err("too long");
        assert_eq!(err.code(), "ERR_FERRY_TAMPERED");
        assert_eq!(
            record_len((MAX_RECORD as u32).to_le_bytes()).expect("fits"),
            MAX_RECORD
        );
    }
}
