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
//! Both ends of a sealed connection spend most of their extra time in the AES-GCM, so its
//! speed per byte is most of what sealing costs; it comes from one of two audited crates,
//! picked once per process by the CPU ([`Aead::for_this_cpu`]): aws-lc-rs where AVX-512
//! with VAES and VPCLMULQDQ runs (AWS-LC's 512-bit code: about twice ring's speed there),
//! ring elsewhere (its 256-bit VAES and AES-NI code: about twice AWS-LC's where AVX-512 is
//! missing). Both write the same records (a known-answer test pins them), so engines that
//! picked differently seal to each other. HKDF is aws-lc-rs's.

use std::sync::OnceLock;

use aws_lc_rs::aead::{Aad, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
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

/// Which crate's AES-256-GCM seals and opens records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aead {
    AwsLc,
    Ring,
}

/// What [`Aead::for_features`] reads of the CPU.
#[derive(Debug, Clone, Copy, Default)]
struct CpuFeatures {
    avx512f: bool,
    vaes: bool,
    vpclmulqdq: bool,
}

impl CpuFeatures {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            Self {
                avx512f: std::arch::is_x86_feature_detected!("avx512f"),
                vaes: std::arch::is_x86_feature_detected!("vaes"),
                vpclmulqdq: std::arch::is_x86_feature_detected!("vpclmulqdq"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self::default()
        }
    }
}

impl Aead {
    /// The faster of the two on this CPU, decided once per process.
    pub(crate) fn for_this_cpu() -> Self {
        static PICKED: OnceLock<Aead> = OnceLock::new();
        *PICKED.get_or_init(|| Self::for_features(CpuFeatures::detect()))
    }

    /// aws-lc-rs where its 512-bit AES-GCM runs, else ring.
    fn for_features(cpu: CpuFeatures) -> Self {
        if cpu.avx512f && cpu.vaes && cpu.vpclmulqdq {
            Aead::AwsLc
        } else {
            Aead::Ring
        }
    }
}

/// One direction's AES-256-GCM key, in the crate picked.
enum Key {
    AwsLc(aws_lc_rs::aead::LessSafeKey),
    /// Boxed: ring keeps its key schedule inline (over 500 bytes), aws-lc-rs behind a
    /// pointer.
    Ring(Box<ring::aead::LessSafeKey>),
}

impl Key {
    fn new(aead: Aead, bytes: &[u8; 32]) -> std::result::Result<Self, ()> {
        Ok(match aead {
            Aead::AwsLc => Key::AwsLc(aws_lc_rs::aead::LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, bytes).map_err(drop)?,
            )),
            Aead::Ring => Key::Ring(Box::new(ring::aead::LessSafeKey::new(
                ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, bytes).map_err(drop)?,
            ))),
        })
    }

    /// Seals `in_out` in place; its tag.
    fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: [u8; LEN_PREFIX],
        in_out: &mut [u8],
    ) -> std::result::Result<[u8; TAG_LEN], ()> {
        let mut tag = [0u8; TAG_LEN];
        let sealed = match self {
            Key::AwsLc(k) => k
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(aad),
                    in_out,
                )
                .map(|t| copy_tag(&mut tag, t.as_ref())),
            Key::Ring(k) => k
                .seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    ring::aead::Aad::from(aad),
                    in_out,
                )
                .map(|t| copy_tag(&mut tag, t.as_ref()))
                .map_err(|_| aws_lc_rs::error::Unspecified),
        };
        match sealed {
            Ok(true) => Ok(tag),
            _ => Err(()),
        }
    }

    /// Opens `in_out` (ciphertext and tag) in place: its plaintext.
    fn open<'a>(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: [u8; LEN_PREFIX],
        in_out: &'a mut [u8],
    ) -> std::result::Result<&'a mut [u8], ()> {
        match self {
            Key::AwsLc(k) => k
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
                .map_err(drop),
            Key::Ring(k) => k
                .open_in_place(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    ring::aead::Aad::from(aad),
                    in_out,
                )
                .map_err(drop),
        }
    }
}

/// Copies a crate's tag into `into`; whether it had the length of one.
fn copy_tag(into: &mut [u8; TAG_LEN], tag: &[u8]) -> bool {
    let fits = tag.len() == TAG_LEN;
    if fits {
        into.copy_from_slice(tag);
    }
    fits
}

/// One direction's key and the counter of the next nonce.
struct Direction {
    key: Key,
    next: u64,
}

impl Direction {
    fn new(prk: &Prk, info: &[u8], aead: Aead) -> Result<Self> {
        // The key's bytes are taken out by hand, not through aws-lc-rs's `From<Okm>` for
        // `UnboundKey` (which unwraps): a failure here is an error, not a panic.
        let failed = |_| Error::Protocol("cannot derive a connection key".into());
        let info = [info];
        let mut bytes = [0u8; 32];
        prk.expand(&info, &AES_256_GCM)
            .and_then(|okm| okm.fill(&mut bytes))
            .map_err(failed)?;
        let key = Key::new(aead, &bytes)
            .map_err(|()| Error::Protocol("cannot make a connection key".into()));
        bytes.fill(0);
        Ok(Self { key: key?, next: 0 })
    }

    /// The next nonce; the counter that would wrap ends the stream (a nonce used twice
    /// under one key would give away both plaintexts and the authentication key).
    fn take_nonce(&mut self) -> Result<[u8; NONCE_LEN]> {
        let n = self.next;
        self.next = n.checked_add(1).ok_or_else(|| {
            Error::Tampered("the connection's frame counter is exhausted; reconnect".into())
        })?;
        let mut bytes = [0u8; NONCE_LEN];
        bytes[NONCE_LEN - 8..].copy_from_slice(&n.to_be_bytes());
        Ok(bytes)
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
        Self::derive_with(extracted, side, Aead::for_this_cpu())
    }

    /// [`SealKeys::derive`] with the AES-GCM of `aead`.
    fn derive_with(extracted: &[u8; 32], side: Side, aead: Aead) -> Result<Self> {
        let prk = Prk::new_less_safe(HKDF_SHA256, extracted);
        let to_server = Direction::new(&prk, CLIENT_TO_SERVER, aead)?;
        let to_client = Direction::new(&prk, SERVER_TO_CLIENT, aead)?;
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
            .seal(nonce, prefix, &mut out[start..])
            .map_err(|_| Error::Protocol("sealing a record failed".into()))?;
        out.extend_from_slice(&tag);
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
        self.0.key.open(nonce, prefix, sealed).map_err(|_| {
            Error::Tampered("a sealed frame failed its authentication; connection dropped".into())
        })
    }

    #[cfg(test)]
    fn starting_at(&mut self, counter: u64) {
        self.0.next = counter;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Both ends' keys of a connection whose handshake had `transcript` (the other
    /// modules' sealed tests use it too).
    pub(crate) fn pair(transcript: &[u8]) -> (SealKeys, SealKeys) {
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
        for aead in [Aead::AwsLc, Aead::Ring] {
            let mut client = SealKeys::derive_with(&extracted, Side::Client, aead).expect("client");
            let mut server = SealKeys::derive_with(&extracted, Side::Server, aead).expect("server");
            let mut rec = Vec::new();
            client
                .sealer
                .seal_into(&[b"known ", b"answer"], &mut rec)
                .expect("seal");
            assert_eq!(rec, unhex(to_server), "{aead:?}");
            server.sealer.starting_at(1);
            let mut back = Vec::new();
            server
                .sealer
                .seal_into(&[b"and back"], &mut back)
                .expect("seal");
            assert_eq!(back, unhex(to_client), "{aead:?}");
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
    }

    #[test]
    fn engines_that_picked_different_aes_gcms_seal_to_each_other_and_catch_tampering() {
        let extracted = [0x17u8; 32];
        for (a, b) in [(Aead::AwsLc, Aead::Ring), (Aead::Ring, Aead::AwsLc)] {
            let mut client = SealKeys::derive_with(&extracted, Side::Client, a).expect("client");
            let mut server = SealKeys::derive_with(&extracted, Side::Server, b).expect("server");
            let payload: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
            let mut rec = Vec::new();
            client
                .sealer
                .seal_into(&[b"head", &payload], &mut rec)
                .expect("seal");
            let mut bad = rec.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0x80;
            let opened = open(&mut server.opener, &rec).expect("open");
            assert_eq!(&opened[..4], b"head", "{a:?} -> {b:?}");
            assert_eq!(&opened[4..], &payload[..], "{a:?} -> {b:?}");
            // The same record flipped, to a receiver at the same counter.
            let mut fresh = SealKeys::derive_with(&extracted, Side::Server, b).expect("server");
            let err = open(&mut fresh.opener, &bad).expect_err("a flipped tag bit");
            assert_eq!(err.code(), "ERR_FERRY_TAMPERED", "{a:?} -> {b:?}");
        }
    }

    #[test]
    fn aws_lc_only_where_its_512_bit_aes_gcm_runs() {
        let all = CpuFeatures {
            avx512f: true,
            vaes: true,
            vpclmulqdq: true,
        };
        assert_eq!(Aead::for_features(all), Aead::AwsLc);
        for missing in [
            CpuFeatures {
                avx512f: false,
                ..all
            },
            CpuFeatures { vaes: false, ..all },
            CpuFeatures {
                vpclmulqdq: false,
                ..all
            },
            CpuFeatures::default(),
        ] {
            assert_eq!(Aead::for_features(missing), Aead::Ring, "{missing:?}");
        }
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
