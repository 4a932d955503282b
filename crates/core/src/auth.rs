//! The cluster secret and the mutual challenge–response every connection starts with.
//! Pure code: message bytes in, message bytes out; the I/O lives in `net` (client) and
//! `server` / `transports::shm` (server).
//!
//! ```text
//! client → server  Hello      header; token field = client nonce Nc, flags = AUTH
//! server → client  Challenge  header; token field = server nonce Ns, request id = server
//!                             engine id; payload = HMAC(K, "server" ‖ transcript)
//! client → server  Proof      header; payload = HMAC(K, "client" ‖ transcript)
//! server → client  HelloAck   (as without a secret)
//! ```
//!
//! `transcript` is the 56 bytes of Hello followed by the 56 bytes of the Challenge header:
//! both nonces, the connection kind and both engine ids. A MAC is therefore good for one
//! connection only (fresh nonces from both ends: no replay) and one direction only (the
//! label: no reflection of the server's own proof). MACs are HMAC-SHA256 and verified in
//! constant time by the `hmac` crate. Nothing larger than a header and a 32-byte MAC is
//! read before the client's proof is checked.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};
use crate::seal::{SealKeys, Side};
use crate::sealing::{self, Encrypt, Stance};
pub use crate::wire::MAC_LEN;
use crate::wire::{Header, Op, HEADER_LEN};

type HmacSha256 = Hmac<Sha256>;

/// Shortest secret accepted (bytes).
pub const MIN_SECRET_LEN: usize = 32;
/// `flags` bit of a Hello that announces the sender holds the secret.
pub const HELLO_AUTH: u16 = 1;
/// Environment variable naming a file that holds the secret.
pub const SECRET_FILE_ENV: &str = "FERRY_AUTH_SECRET_FILE";

const SERVER_LABEL: &[u8] = b"ferry auth v1 server\0";
const CLIENT_LABEL: &[u8] = b"ferry auth v1 client\0";
const SEAL_LABEL: &[u8] = b"ferry seal v1 extract\0";

/// The cluster secret, held as a keyed HMAC. Debug never prints it.
#[derive(Clone)]
pub struct Secret {
    keyed: HmacSha256,
    len: usize,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

impl Secret {
    /// A secret of at least [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(Error::InvalidArgument(format!(
                "authSecret must be at least {MIN_SECRET_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        let keyed = HmacSha256::new_from_slice(&bytes)
            .map_err(|e| Error::InvalidArgument(format!("authSecret: {e}")))?;
        Ok(Self {
            keyed,
            len: bytes.len(),
        })
    }

    /// Reads a secret from a file; one trailing newline (as editors and `echo` leave) is
    /// not part of it.
    pub fn from_file(path: &str) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::InvalidArgument(format!("cannot read the auth secret file {path:?}: {e}"))
        })?;
        Self::from_contents(bytes).map_err(|e| Error::InvalidArgument(format!("{path:?}: {e}")))
    }

    /// A secret file's contents as the secret: one trailing newline is not part of it.
    pub(crate) fn from_contents(mut bytes: Vec<u8>) -> Result<Self> {
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Self::new(bytes)
    }

    /// The secret named by `FERRY_AUTH_SECRET_FILE`, if that is set.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(SECRET_FILE_ENV) {
            Ok(path) if !path.is_empty() => Self::from_file(&path).map(Some),
            _ => Ok(None),
        }
    }

    fn mac(&self, label: &[u8], transcript: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(label);
        mac.update(transcript);
        mac
    }

    fn tag(&self, label: &[u8], transcript: &[u8]) -> [u8; MAC_LEN] {
        self.mac(label, transcript).finalize().into_bytes().into()
    }

    /// The HKDF extract step of a sealed connection's keys (`seal`): HMAC with the
    /// secret as key over a label of its own and the handshake's transcript, so the keys
    /// are bound to this secret and this handshake's fresh nonces, and unrelated to the
    /// handshake's MACs.
    pub(crate) fn extract_key(&self, transcript: &[u8]) -> [u8; MAC_LEN] {
        self.tag(SEAL_LABEL, transcript)
    }

    fn verify(&self, label: &[u8], transcript: &[u8], tag: &[u8]) -> bool {
        self.mac(label, transcript).verify_slice(tag).is_ok()
    }
}

/// Why a handshake failed: the `reason` label of `ferry_auth_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The peer did not announce a secret where one is required.
    NoSecret,
    /// The peer's proof did not verify (wrong secret, replay, reflection).
    BadProof,
    /// The peer sent something else than the next handshake message.
    Protocol,
    /// The peer closed the connection during the handshake (e.g. it found that we do
    /// not hold its secret).
    Aborted,
    /// The peer did not finish in time.
    Timeout,
    /// The peer's uid differs from ours (shm socket).
    Uid,
    /// This engine requires a sealed (encrypted) connection and the peer refuses
    /// one (`encrypt`).
    Plaintext,
}

impl Failure {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Failure; 7] = [
        Failure::NoSecret,
        Failure::BadProof,
        Failure::Protocol,
        Failure::Aborted,
        Failure::Timeout,
        Failure::Uid,
        Failure::Plaintext,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::NoSecret => "no_secret",
            Failure::BadProof => "bad_proof",
            Failure::Protocol => "protocol",
            Failure::Aborted => "aborted",
            Failure::Timeout => "timeout",
            Failure::Uid => "uid",
            Failure::Plaintext => "plaintext",
        }
    }
}

/// The secret each open engine dials with, by engine id: the paths that connect know the
/// local engine's id (control, descriptor fetch, transport requests from other crates) and
/// find its secret here.
static DIALERS: std::sync::Mutex<Vec<(u64, Secret, Encrypt)>> = std::sync::Mutex::new(Vec::new());

/// Keeps an engine's secret registered for dialing while it lives.
pub(crate) struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        dialers().retain(|(id, _, _)| *id != self.0);
    }
}

fn dialers() -> std::sync::MutexGuard<'static, Vec<(u64, Secret, Encrypt)>> {
    DIALERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the secret engine `engine_id` dials with (none: it dials without), and its
/// `encrypt` setting (which needs the secret: without one nothing is sealed).
pub(crate) fn register(engine_id: u64, secret: Option<Secret>, encrypt: Encrypt) -> Registered {
    if let Some(s) = secret {
        dialers().push((engine_id, s, encrypt));
    }
    Registered(engine_id)
}

/// The secret engine `engine_id` dials with.
pub(crate) fn dialing_secret(engine_id: u64) -> Option<Secret> {
    dialers()
        .iter()
        .find(|(id, _, _)| *id == engine_id)
        .map(|(_, s, _)| s.clone())
}

/// Engine `engine_id`'s stance on sealing a connection to a peer (loopback or not):
/// refused without a secret (no keys).
pub(crate) fn dialing_stance(engine_id: u64, peer_is_loopback: bool) -> Stance {
    dialers()
        .iter()
        .find(|(id, _, _)| *id == engine_id)
        .map_or(Stance::Refuse, |(_, _, e)| e.stance(peer_is_loopback))
}

/// A fresh 128-bit nonce from the OS.
pub fn nonce() -> Result<[u8; 16]> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n)
        .map_err(|e| Error::Protocol(format!("no randomness for a handshake nonce: {e}")))?;
    Ok(n)
}

/// The client's side: build the Hello, check the server's challenge, answer with a proof.
pub struct ClientHandshake {
    secret: Option<Secret>,
    hello: [u8; HEADER_LEN],
}

impl ClientHandshake {
    /// A Hello of connection `kind` from engine `engine_id`, with `nonce` when a secret is
    /// held.
    pub fn new(secret: Option<Secret>, kind: u64, engine_id: u64, nonce: [u8; 16]) -> Self {
        let mut h = Header::new(Op::Hello);
        h.buffer_id = kind;
        h.request_id = engine_id;
        if secret.is_some() {
            h.flags = HELLO_AUTH;
            h.token = nonce;
        }
        Self {
            secret,
            hello: h.encode(),
        }
    }

    /// The Hello of a client with `stance` on sealing this (data) connection; a client
    /// without a secret seals nothing (no keys).
    pub(crate) fn sealing(mut self, stance: Stance) -> Self {
        if self.secret.is_some() {
            if let Ok(mut h) = Header::decode(&self.hello) {
                h.flags |= sealing::hello_flags(stance);
                self.hello = h.encode();
            }
        }
        self
    }

    /// After [`answer`](Self::answer) accepted `challenge`: the connection's keys when the
    /// server sealed it, or why this client (with `stance`) cannot take the outcome.
    pub(crate) fn keys(
        &self,
        challenge: &[u8; HEADER_LEN],
        stance: Stance,
    ) -> std::result::Result<Option<SealKeys>, String> {
        let sealed = Header::decode(challenge)
            .map(|h| h.flags & sealing::CHALLENGE_SEALED != 0)
            .map_err(|e| format!("handshake: {e}"))?;
        if !sealing::client_accepts(stance, sealed) {
            return Err(if sealed {
                "the peer requires encrypted connections (its encrypt option); this \
                 engine has encrypt: false"
                    .into()
            } else {
                "the peer did not seal a connection this engine requires encrypted (encrypt); \
                 a build that seals only data connections does not"
                    .into()
            });
        }
        match (&self.secret, sealed) {
            (Some(secret), true) => {
                let t = transcript(&self.hello, challenge);
                SealKeys::derive(&secret.extract_key(&t), Side::Client)
                    .map(Some)
                    .map_err(|e| e.to_string())
            }
            _ => Ok(None),
        }
    }

    /// The Hello bytes to send.
    pub fn hello(&self) -> &[u8; HEADER_LEN] {
        &self.hello
    }

    /// Whether the server must answer with a challenge.
    pub fn expects_challenge(&self) -> bool {
        self.secret.is_some()
    }

    /// Checks the challenge (header bytes and its MAC) and returns the proof frame to send.
    pub fn answer(
        &self,
        challenge: &[u8; HEADER_LEN],
        server_mac: &[u8],
    ) -> std::result::Result<[u8; HEADER_LEN + MAC_LEN], Failure> {
        let secret = self.secret.as_ref().ok_or(Failure::Protocol)?;
        let transcript = transcript(&self.hello, challenge);
        if !secret.verify(SERVER_LABEL, &transcript, server_mac) {
            return Err(Failure::BadProof);
        }
        Ok(proof_frame(
            Op::AuthProof,
            &secret.tag(CLIENT_LABEL, &transcript),
        ))
    }
}

/// What the server makes of a Hello.
pub enum HelloOutcome {
    /// No secret here and none announced: answer HelloAck at once.
    Open,
    /// Send this challenge frame, then check the client's proof with `verify`.
    Challenge(Box<ServerHandshake>),
}

/// The server's side after a Hello that asked for (or owed) authentication.
pub struct ServerHandshake {
    secret: Secret,
    transcript: [u8; 2 * HEADER_LEN],
    frame: [u8; HEADER_LEN + MAC_LEN],
    sealed: bool,
}

impl ServerHandshake {
    /// The challenge frame to send (header + MAC).
    pub fn challenge(&self) -> &[u8; HEADER_LEN + MAC_LEN] {
        &self.frame
    }

    /// The connection's keys when it is sealed (after [`verify`](Self::verify) passed).
    pub(crate) fn keys(&self) -> Result<Option<SealKeys>> {
        if !self.sealed {
            return Ok(None);
        }
        SealKeys::derive(&self.secret.extract_key(&self.transcript), Side::Server).map(Some)
    }

    /// Checks the client's proof frame (header + MAC).
    pub fn verify(&self, proof: &[u8; HEADER_LEN + MAC_LEN]) -> std::result::Result<(), Failure> {
        let h = Header::decode(&proof[..HEADER_LEN]).map_err(|_| Failure::Protocol)?;
        if h.op != Op::AuthProof || h.length != MAC_LEN as u64 {
            return Err(Failure::Protocol);
        }
        if self
            .secret
            .verify(CLIENT_LABEL, &self.transcript, &proof[HEADER_LEN..])
        {
            Ok(())
        } else {
            Err(Failure::BadProof)
        }
    }
}

/// Answers a decoded Hello. `secret` is this server's; `server_id` goes in the challenge.
/// Seals nothing (`on_hello_sealing` with a server that refuses sealing and a client that
/// does not ask for it).
pub fn on_hello(
    secret: Option<&Secret>,
    hello: &[u8; HEADER_LEN],
    server_id: u64,
    nonce: [u8; 16],
) -> std::result::Result<HelloOutcome, Failure> {
    on_hello_sealing(secret, hello, server_id, nonce, Stance::Refuse)
}

/// [`on_hello`] by a server with `stance` on sealing connections: the challenge says
/// whether this one is sealed; a client that refuses what the server requires is refused
/// ([`Failure::Plaintext`]).
pub(crate) fn on_hello_sealing(
    secret: Option<&Secret>,
    hello: &[u8; HEADER_LEN],
    server_id: u64,
    nonce: [u8; 16],
    stance: Stance,
) -> std::result::Result<HelloOutcome, Failure> {
    let h = Header::decode(hello).map_err(|_| Failure::Protocol)?;
    if h.op != Op::Hello {
        return Err(Failure::Protocol);
    }
    let announced = h.flags & HELLO_AUTH != 0;
    let Some(secret) = secret else {
        // A client with a secret must not be told "fine" by a server without one: it
        // refuses the plain HelloAck on its side.
        return Ok(HelloOutcome::Open);
    };
    if !announced {
        return Err(Failure::NoSecret);
    }
    // Every tcp connection is sealed by the same rule (control and notification ones carry
    // descriptors, tokens and payloads); the shm socket never leaves the host and passes
    // descriptors, not bytes, and is told nothing of it.
    let sealed = if sealable(h.buffer_id) {
        sealing::server_verdict(h.flags, stance).ok_or(Failure::Plaintext)?
    } else {
        false
    };
    let mut c = Header::new(Op::AuthChallenge);
    if sealed {
        c.flags = sealing::CHALLENGE_SEALED;
    }
    c.request_id = server_id;
    c.token = nonce;
    c.length = MAC_LEN as u64;
    let head = c.encode();
    let transcript = transcript(hello, &head);
    let mut frame = [0u8; HEADER_LEN + MAC_LEN];
    frame[..HEADER_LEN].copy_from_slice(&head);
    frame[HEADER_LEN..].copy_from_slice(&secret.tag(SERVER_LABEL, &transcript));
    Ok(HelloOutcome::Challenge(Box::new(ServerHandshake {
        secret: secret.clone(),
        transcript,
        frame,
        sealed,
    })))
}

/// Whether a connection of `kind` (a Hello's kind field) is sealed when both ends agree:
/// every tcp kind.
fn sealable(kind: u64) -> bool {
    use crate::wire::ConnKind;
    matches!(
        ConnKind::from_raw(kind),
        Some(ConnKind::Control | ConnKind::Data | ConnKind::Notify)
    )
}

fn transcript(hello: &[u8; HEADER_LEN], challenge: &[u8; HEADER_LEN]) -> [u8; 2 * HEADER_LEN] {
    let mut t = [0u8; 2 * HEADER_LEN];
    t[..HEADER_LEN].copy_from_slice(hello);
    t[HEADER_LEN..].copy_from_slice(challenge);
    t
}

fn proof_frame(op: Op, mac: &[u8; MAC_LEN]) -> [u8; HEADER_LEN + MAC_LEN] {
    let mut h = Header::new(op);
    h.length = MAC_LEN as u64;
    let mut frame = [0u8; HEADER_LEN + MAC_LEN];
    frame[..HEADER_LEN].copy_from_slice(&h.encode());
    frame[HEADER_LEN..].copy_from_slice(mac);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> Secret {
        Secret::new(vec![b; 32]).expect("secret")
    }

    fn split(frame: &[u8; HEADER_LEN + MAC_LEN]) -> ([u8; HEADER_LEN], &[u8]) {
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&frame[..HEADER_LEN]);
        (head, &frame[HEADER_LEN..])
    }

    fn challenge_of(outcome: HelloOutcome) -> ServerHandshake {
        match outcome {
            HelloOutcome::Challenge(s) => *s,
            HelloOutcome::Open => panic!("expected a challenge"),
        }
    }

    #[test]
    fn same_secret_completes_both_ways() {
        let c = ClientHandshake::new(Some(secret(7)), 1, 10, [1; 16]);
        let s = challenge_of(on_hello(Some(&secret(7)), c.hello(), 20, [2; 16]).expect("hello"));
        let (head, mac) = split(s.challenge());
        let proof = c.answer(&head, mac).expect("server proved");
        assert_eq!(s.verify(&proof), Ok(()));
    }

    #[test]
    fn wrong_secret_fails_on_both_sides() {
        let c = ClientHandshake::new(Some(secret(7)), 1, 10, [1; 16]);
        let s = challenge_of(on_hello(Some(&secret(8)), c.hello(), 20, [2; 16]).expect("hello"));
        let (head, mac) = split(s.challenge());
        assert_eq!(c.answer(&head, mac), Err(Failure::BadProof));
        // A client that skipped the check still cannot prove the server's secret.
        let honest = ClientHandshake::new(Some(secret(8)), 1, 10, [1; 16]);
        let s2 =
            challenge_of(on_hello(Some(&secret(7)), honest.hello(), 20, [2; 16]).expect("hello"));
        let (h2, _) = split(s2.challenge());
        let forged = proof_frame(
            Op::AuthProof,
            &secret(8).tag(CLIENT_LABEL, &transcript(honest.hello(), &h2)),
        );
        assert_eq!(s2.verify(&forged), Err(Failure::BadProof));
    }

    #[test]
    fn a_hello_without_secret_is_refused_by_a_server_with_one() {
        let c = ClientHandshake::new(None, 1, 10, [1; 16]);
        assert!(matches!(
            on_hello(Some(&secret(7)), c.hello(), 20, [2; 16]),
            Err(Failure::NoSecret)
        ));
        assert!(matches!(
            on_hello(None, c.hello(), 20, [2; 16]),
            Ok(HelloOutcome::Open)
        ));
    }

    #[test]
    fn a_recorded_proof_does_not_replay_on_a_fresh_challenge() {
        let k = secret(7);
        let c = ClientHandshake::new(Some(k.clone()), 1, 10, [1; 16]);
        let s1 = challenge_of(on_hello(Some(&k), c.hello(), 20, [2; 16]).expect("hello"));
        let (head, mac) = split(s1.challenge());
        let recorded = c.answer(&head, mac).expect("proof");
        // Same Hello replayed; the server picks a new nonce.
        let s2 = challenge_of(on_hello(Some(&k), c.hello(), 20, [3; 16]).expect("hello"));
        assert_eq!(s2.verify(&recorded), Err(Failure::BadProof));
    }

    #[test]
    fn the_servers_own_mac_reflected_back_is_refused() {
        let k = secret(7);
        let c = ClientHandshake::new(Some(k.clone()), 1, 10, [1; 16]);
        let s = challenge_of(on_hello(Some(&k), c.hello(), 20, [2; 16]).expect("hello"));
        let (_, mac) = split(s.challenge());
        let mut tag = [0u8; MAC_LEN];
        tag.copy_from_slice(mac);
        let reflected = proof_frame(Op::AuthProof, &tag);
        assert_eq!(s.verify(&reflected), Err(Failure::BadProof));
        // Nor is a challenge frame sent back as the proof.
        assert_eq!(s.verify(s.challenge()), Err(Failure::Protocol));
    }

    #[test]
    fn a_tampered_challenge_is_refused_by_the_client() {
        let k = secret(7);
        let c = ClientHandshake::new(Some(k.clone()), 1, 10, [1; 16]);
        let s = challenge_of(on_hello(Some(&k), c.hello(), 20, [2; 16]).expect("hello"));
        let (mut head, mac) = split(s.challenge());
        head[8] ^= 1; // another server engine id
        assert_eq!(c.answer(&head, mac), Err(Failure::BadProof));
    }

    /// A sealing handshake between a client and a server with these stances: both ends'
    /// keys, or the failure.
    fn sealed_handshake(
        client: Stance,
        server: Stance,
        nonces: ([u8; 16], [u8; 16]),
    ) -> std::result::Result<(Option<SealKeys>, Option<SealKeys>), String> {
        sealed_handshake_of(crate::wire::ConnKind::Data, client, server, nonces)
    }

    fn sealed_handshake_of(
        kind: crate::wire::ConnKind,
        client: Stance,
        server: Stance,
        nonces: ([u8; 16], [u8; 16]),
    ) -> std::result::Result<(Option<SealKeys>, Option<SealKeys>), String> {
        let k = secret(7);
        let c = ClientHandshake::new(Some(k.clone()), kind as u64, 10, nonces.0).sealing(client);
        let s = on_hello_sealing(Some(&k), c.hello(), 20, nonces.1, server)
            .map_err(|f| f.label().to_string())?;
        let s = challenge_of(s);
        let (head, mac) = split(s.challenge());
        let proof = c.answer(&head, mac).map_err(|f| f.label().to_string())?;
        s.verify(&proof).map_err(|f| f.label().to_string())?;
        let client_keys = c.keys(&head, client)?;
        Ok((client_keys, s.keys().map_err(|e| e.to_string())?))
    }

    #[test]
    fn a_sealed_handshake_gives_both_ends_matching_keys() {
        let (c, s) = sealed_handshake(Stance::Require, Stance::Accept, ([1; 16], [2; 16]))
            .expect("handshake");
        let (mut c, mut s) = (c.expect("client keys"), s.expect("server keys"));
        let mut rec = Vec::new();
        c.sealer.seal_into(&[b"frame"], &mut rec).expect("seal");
        let prefix: [u8; 4] = rec[..4].try_into().expect("prefix");
        let mut body = rec[4..].to_vec();
        assert_eq!(
            s.opener.open_in_place(prefix, &mut body).expect("opens"),
            b"frame"
        );
        // Neither end seals what neither asks for.
        let (c, s) = sealed_handshake(Stance::Accept, Stance::Accept, ([1; 16], [2; 16]))
            .expect("handshake");
        assert!(c.is_none() && s.is_none());
    }

    #[test]
    fn control_and_notification_connections_are_sealed_as_data_ones_are() {
        use crate::wire::ConnKind;
        for kind in [ConnKind::Control, ConnKind::Notify, ConnKind::Data] {
            let (c, s) =
                sealed_handshake_of(kind, Stance::Require, Stance::Accept, ([1; 16], [2; 16]))
                    .expect("handshake");
            assert!(c.is_some() && s.is_some(), "{kind:?} sealed");
            let refused =
                sealed_handshake_of(kind, Stance::Refuse, Stance::Require, ([1; 16], [2; 16]));
            assert_eq!(refused.expect_err("refused"), "plaintext", "{kind:?}");
        }
        // The shm socket is never sealed: a server that requires sealing takes it plain.
        let (c, s) = sealed_handshake_of(
            ConnKind::Shm,
            Stance::Accept,
            Stance::Require,
            ([1; 16], [2; 16]),
        )
        .expect("handshake");
        assert!(c.is_none() && s.is_none());
        // Each connection's handshake gives keys of its own: another pair of nonces seals
        // the same bytes apart.
        let seal = |nonces| {
            let (c, _) =
                sealed_handshake_of(ConnKind::Control, Stance::Require, Stance::Accept, nonces)
                    .expect("handshake");
            let mut rec = Vec::new();
            c.expect("keys")
                .sealer
                .seal_into(&[b"same frame"], &mut rec)
                .expect("seal");
            rec
        };
        assert_ne!(seal(([1; 16], [2; 16])), seal(([3; 16], [2; 16])));
    }

    #[test]
    fn a_server_that_requires_sealing_refuses_a_plaintext_client() {
        let refused = sealed_handshake(Stance::Refuse, Stance::Require, ([1; 16], [2; 16]));
        assert_eq!(refused.expect_err("refused"), "plaintext");
    }

    #[test]
    fn a_stripped_seal_flag_fails_the_handshake() {
        // A relay clears the client's request to seal: the server's MAC covers the Hello as
        // the client sent it no more, so the client refuses the challenge.
        let k = secret(7);
        let data = crate::wire::ConnKind::Data as u64;
        let c = ClientHandshake::new(Some(k.clone()), data, 10, [1; 16]).sealing(Stance::Require);
        let mut stripped = *c.hello();
        let mut h = Header::decode(&stripped).expect("hello");
        h.flags &= !(sealing::HELLO_SEAL_REQUIRED | sealing::HELLO_SEAL_ACCEPTED);
        stripped = h.encode();
        let s = challenge_of(
            on_hello_sealing(Some(&k), &stripped, 20, [2; 16], Stance::Accept).expect("hello"),
        );
        let (head, mac) = split(s.challenge());
        assert_eq!(c.answer(&head, mac), Err(Failure::BadProof));
    }

    #[test]
    fn short_secrets_and_garbage_are_refused() {
        assert!(Secret::new(vec![1; 31]).is_err());
        assert_eq!(format!("{:?}", secret(7)), "Secret(32 bytes)");
        assert!(matches!(
            on_hello(Some(&secret(7)), &[0u8; HEADER_LEN], 1, [0; 16]),
            Err(Failure::Protocol)
        ));
        assert_ne!(nonce().expect("nonce"), nonce().expect("nonce"));
    }
}
