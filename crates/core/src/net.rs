//! Small async helpers over the wire codec: connecting with a hello, reading and writing
//! whole control frames.

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::admission::Admission;
use crate::auth::{self, ClientHandshake, Failure, HelloOutcome, Secret};
use crate::error::{Error, Result};
use crate::seal::SealKeys;
use crate::sealing::Stance;
use crate::wire::{ConnKind, Header, Op, RejectCode, HEADER_LEN};

/// Writes `head` then `body` with vectored writes: a header and its payload leave in one
/// system call (and one TCP segment train) instead of two.
pub(crate) async fn write_all_pair<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut head: &[u8],
    mut body: &[u8],
) -> std::io::Result<()> {
    while !head.is_empty() || !body.is_empty() {
        let n = if head.is_empty() {
            w.write(body).await?
        } else {
            let bufs = [std::io::IoSlice::new(head), std::io::IoSlice::new(body)];
            w.write_vectored(&bufs).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    Ok(())
}

/// Reads one header; `Ok(None)` on a clean EOF before any byte.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Header>> {
    let Some(buf) = read_header_bytes(r).await? else {
        return Ok(None);
    };
    Header::decode(&buf)
        .map(Some)
        .map_err(|e| Error::Protocol(e.to_string()))
}

/// Reads one header's bytes, not yet decoded (the tcp transport's reply decoder takes
/// them); `Ok(None)` on a clean EOF before any byte, a protocol error on an EOF within.
pub(crate) async fn read_header_bytes<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<[u8; HEADER_LEN]>> {
    let mut buf = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r
            .read(&mut buf[got..])
            .await
            .map_err(|e| Error::io("read", &e))?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(Error::Protocol(format!(
                "truncated frame: connection closed after {got} of {HEADER_LEN} header bytes"
            )));
        }
        got += n;
    }
    Ok(Some(buf))
}

/// Reads one header; once its first byte arrived, the rest must follow within `deadline`
/// (a peer that trickles a frame is dropped). An idle connection may wait for ever.
pub(crate) async fn read_header_within<R: AsyncRead + Unpin>(
    r: &mut R,
    deadline: Duration,
) -> Result<Option<Header>> {
    let mut buf = [0u8; HEADER_LEN];
    let got = r.read(&mut buf).await.map_err(|e| Error::io("read", &e))?;
    if got == 0 {
        return Ok(None);
    }
    tokio::time::timeout(deadline, r.read_exact(&mut buf[got..]))
        .await
        .map_err(|_| Error::Protocol("frame header not complete within frameTimeoutMs".into()))?
        .map_err(|e| cut_short("truncated frame header", &e))?;
    Header::decode(&buf)
        .map(Some)
        .map_err(|e| Error::Protocol(e.to_string()))
}

/// [`read_frame`] with [`read_header_within`]'s deadline on the header and the payload.
pub(crate) async fn read_frame_within<R: AsyncRead + Unpin>(
    r: &mut R,
    deadline: Duration,
) -> Result<Option<(Header, Vec<u8>)>> {
    let Some(header) = read_header_within(r, deadline).await? else {
        return Ok(None);
    };
    let payload = tokio::time::timeout(deadline, read_payload(r, &header))
        .await
        .map_err(|_| {
            Error::Protocol("frame payload not complete within frameTimeoutMs".into())
        })??;
    Ok(Some((header, payload)))
}

/// A zeroed buffer for a frame's `len`-byte payload. Bounded by the frame's op
/// (`Op::payload_cap`, checked as the header was decoded), and still allocated fallibly: a
/// process short of memory refuses the frame with the limit's words instead of aborting.
fn frame_buffer(len: usize) -> Result<Vec<u8>> {
    let mut payload = Vec::new();
    payload.try_reserve_exact(len).map_err(|_| {
        Error::ResourceLimit(format!(
            "{} in this process",
            crate::resource::describe_allocation(len, "a peer's frame")
        ))
    })?;
    payload.resize(len, 0);
    Ok(payload)
}

async fn read_payload<R: AsyncRead + Unpin>(r: &mut R, header: &Header) -> Result<Vec<u8>> {
    let len = usize::try_from(header.payload_len())
        .map_err(|_| Error::Protocol("payload length overflows usize".into()))?;
    let mut payload = frame_buffer(len)?;
    r.read_exact(&mut payload)
        .await
        .map_err(|e| cut_short("truncated payload", &e))?;
    Ok(payload)
}

/// Reads a header and its (small) payload into memory.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(Header, Vec<u8>)>> {
    let Some(header) = read_header(r).await? else {
        return Ok(None);
    };
    Ok(Some((header, read_payload(r, &header).await?)))
}

/// Writes a header and payload, in one write (on a sealed stream: one record).
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &Header,
    payload: &[u8],
) -> Result<()> {
    write_all_pair(w, &header.encode(), payload)
        .await
        .map_err(|e| Error::io("write", &e))?;
    w.flush().await.map_err(|e| Error::io("flush", &e))
}

/// A frame that a read error cut short: a sealed stream's tampering keeps its own type
/// (`ERR_FERRY_TAMPERED`), anything else is a protocol error.
fn cut_short(what: &str, e: &std::io::Error) -> Error {
    match crate::error::TamperedIo::within(e) {
        Some(why) => Error::Tampered(why),
        None => Error::Protocol(format!("{what}: {e}")),
    }
}

/// Connections a listener keeps waiting for `accept` (the kernel caps it at
/// `net.core.somaxconn`). std listens with 128: when more peers than that open this engine
/// at once (every engine of a cluster opening every other), the kernel drops the
/// handshakes past it, and each dropped one is retried only after a second or three,
/// stalling those opens for as long or past their connect timeout.
pub(crate) const LISTEN_BACKLOG: i32 = 4096;

/// Deepens a listening socket's accept queue to [`LISTEN_BACKLOG`] (`listen` again on a
/// listening socket only changes its backlog).
pub(crate) fn deepen_backlog(listener: &impl std::os::fd::AsRawFd) -> Result<()> {
    // SAFETY: `listen` on a descriptor that `listener` owns and keeps open for the call;
    // it touches no memory of ours.
    let rc = unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) };
    if rc != 0 {
        return Err(Error::io("listen", &std::io::Error::last_os_error()));
    }
    Ok(())
}

fn tune(stream: &TcpStream, _kind: ConnKind) {
    // Latency matters on every connection; socket buffers are left to the kernel's
    // autotuning, which measured as fast as fixed 4 MiB buffers on loopback.
    let _ = stream.set_nodelay(true);
}

/// Tunes an accepted connection once its kind is known.
pub(crate) fn tune_accepted(stream: &TcpStream, kind: ConnKind) {
    tune(stream, kind)
}

/// Connects, runs the handshake (`auth`), and returns the stream, the peer's engine id,
/// and the connection's keys when it is sealed: when this engine's `encrypt` setting asks
/// it of the peer's address, or the peer requires it. Every tcp connection is sealed by
/// that one rule, with keys of its own.
pub(crate) async fn connect(
    addr: &str,
    kind: ConnKind,
    local_engine_id: u64,
    timeout: Duration,
) -> Result<(TcpStream, u64, Option<SealKeys>)> {
    let (stream, reached, keys) = connect_reaching(addr, kind, local_engine_id, timeout).await?;
    Ok((stream, reached.engine_id, keys))
}

/// A data connection (`connect`).
pub(crate) async fn connect_data(
    addr: &str,
    local_engine_id: u64,
    timeout: Duration,
) -> Result<(TcpStream, u64, Option<SealKeys>)> {
    connect(addr, ConnKind::Data, local_engine_id, timeout).await
}

pub(crate) fn is_loopback_addr(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback())
}

/// Who a handshake reached: its engine id, and what its `HelloAck` says it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reached {
    pub(crate) engine_id: u64,
    /// `HelloAck.flags`: `ACK_*` bits; 0 from a build that knows none.
    pub(crate) features: u16,
}

impl Reached {
    /// Whether a control connection to it carries notifications (`ACK_LINK_NOTIFY`).
    pub(crate) fn carries_notify(&self) -> bool {
        self.features & ACK_LINK_NOTIFY != 0
    }
}

/// `HelloAck.flags` bit: this engine serves notifications on control connections, so a
/// peer's link carries them instead of a connection of their own.
pub(crate) const ACK_LINK_NOTIFY: u16 = 1;

/// `connect`, also telling what the peer's `HelloAck` said it serves.
pub(crate) async fn connect_reaching(
    addr: &str,
    kind: ConnKind,
    local_engine_id: u64,
    timeout: Duration,
) -> Result<(TcpStream, Reached, Option<SealKeys>)> {
    let stance = crate::auth::dialing_stance(local_engine_id, is_loopback_addr(addr));
    connect_sealing(addr, kind, local_engine_id, timeout, stance).await
}

/// `connect_reaching` by a client with `stance` on sealing the connection.
async fn connect_sealing(
    addr: &str,
    kind: ConnKind,
    local_engine_id: u64,
    timeout: Duration,
    stance: Stance,
) -> Result<(TcpStream, Reached, Option<SealKeys>)> {
    let fail = |reason: String| Error::Connect {
        peer: addr.to_string(),
        reason,
    };
    let attempt = async {
        let mut cuts = 0;
        loop {
            let mut stream = TcpStream::connect(addr).await.map_err(|e| {
                match crate::resource::limit_of(&e) {
                    Some(limit) => Error::ResourceLimit(format!(
                        "{limit} in this process, connecting to {addr}"
                    )),
                    None => fail(e.to_string()),
                }
            })?;
            tune(&stream, kind);
            match client_handshake_reaching(&mut stream, kind, local_engine_id, stance).await {
                Ok((reached, keys)) => return Ok((stream, reached, keys)),
                // Cut before any verdict: a target whose handshake budget is full pushes
                // out its oldest handshake (`handshakes`). A new connection is the newest
                // there, so a flood must push it out again: a few more tries, in the time
                // left.
                Err(failure) if failure.is_cut() && cuts < CUT_RETRIES => cuts += 1,
                Err(failure) => return Err(failure.into_error(addr)),
            }
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| fail(format!("no answer within {} ms", timeout.as_millis())))?
}

/// Why a client's handshake failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HandshakeFailure {
    /// The peer refused the connection because a limit was reached there (in its words:
    /// which limit, and its value).
    Limit(String),
    /// Anything else, worded.
    Other(String),
}

impl From<String> for HandshakeFailure {
    fn from(why: String) -> Self {
        Self::Other(why)
    }
}

impl From<&str> for HandshakeFailure {
    fn from(why: &str) -> Self {
        Self::Other(why.to_string())
    }
}

impl HandshakeFailure {
    /// Whether the server closed the handshake before any verdict: a target whose
    /// handshake budget is full pushes out its oldest handshake (`handshakes`). A new
    /// connection is the newest there, so a flood must push it out again: a client tries
    /// a few more ([`CUT_RETRIES`]), in the time it has.
    pub(crate) fn is_cut(&self) -> bool {
        matches!(self, Self::Other(reason) if reason.starts_with(HANDSHAKE_CUT))
    }

    /// The error of a failed handshake with `peer`: a limit the peer reached is a
    /// `ResourceLimit`, anything else a `Connect`.
    pub(crate) fn into_error(self, peer: &str) -> Error {
        match self {
            Self::Limit(why) => {
                Error::ResourceLimit(format!("{peer} refused the connection: {why}"))
            }
            Self::Other(reason) => Error::Connect {
                peer: peer.to_string(),
                reason,
            },
        }
    }
}

/// The client's side of the handshake on any stream (tcp or the shm socket): Hello, then,
/// with a secret, the server's challenge checked and our proof sent; then HelloAck. Returns
/// the peer's engine id, or why it failed.
pub(crate) async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    kind: ConnKind,
    local_engine_id: u64,
) -> std::result::Result<u64, HandshakeFailure> {
    let (reached, _) =
        client_handshake_reaching(stream, kind, local_engine_id, Stance::Refuse).await?;
    Ok(reached.engine_id)
}

/// `client_handshake`, also returning what the `HelloAck` said the peer serves, and the
/// connection's keys when it is sealed (by a client with `stance`).
async fn client_handshake_reaching<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    kind: ConnKind,
    local_engine_id: u64,
    stance: Stance,
) -> std::result::Result<(Reached, Option<SealKeys>), HandshakeFailure> {
    let secret = auth::dialing_secret(local_engine_id);
    let nonce = auth::nonce().map_err(|e| e.to_string())?;
    let hs = ClientHandshake::new(secret, kind as u64, local_engine_id, nonce).sealing(stance);
    let mut keys = None;
    let io = |e: std::io::Error| format!("handshake: {e}");
    stream.write_all(hs.hello()).await.map_err(io)?;
    let mut head = [0u8; HEADER_LEN];
    read_handshake(stream, &mut head).await?;
    let mut h = decode_reply(&head, stream).await?;
    if h.op == Op::AuthChallenge {
        if !hs.expects_challenge() {
            return Err("the peer requires the cluster secret: set authSecret or \
                 FERRY_AUTH_SECRET_FILE"
                .into());
        }
        let mut mac = [0u8; auth::MAC_LEN];
        read_handshake(stream, &mut mac).await?;
        let proof = hs.answer(&head, &mac).map_err(|f| match f {
            Failure::BadProof => {
                "authentication failed: the peer does not hold our cluster secret".to_string()
            }
            other => format!("authentication failed: {}", other.label()),
        })?;
        keys = hs.keys(&head, stance)?;
        stream.write_all(&proof).await.map_err(io)?;
        read_handshake(stream, &mut head).await?;
        h = decode_reply(&head, stream).await?;
    } else if hs.expects_challenge() {
        return Err("the peer does not authenticate (it has no authSecret); refusing it".into());
    } else if stance == Stance::Require {
        return Err(
            "this engine requires encrypted connections (encrypt), which needs \
             a cluster secret"
                .into(),
        );
    }
    if h.op != Op::HelloAck {
        return Err(format!("expected HelloAck, got {:?}", h.op).into());
    }
    let reached = Reached {
        engine_id: h.request_id,
        features: h.flags,
    };
    Ok((reached, keys))
}

/// How a handshake the server closed without a verdict begins its error.
const HANDSHAKE_CUT: &str = "closed during the handshake";
/// New connections a client ([`connect`], the shm attach) tries after a handshake was cut.
pub(crate) const CUT_RETRIES: u32 = 3;

async fn read_handshake<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
) -> std::result::Result<(), String> {
    stream
        .read_exact(buf)
        .await
        .map(|_| ())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => HANDSHAKE_CUT.to_string(),
            // Closed with our Hello still unread there.
            std::io::ErrorKind::ConnectionReset => format!("{HANDSHAKE_CUT}: {e}"),
            _ => format!("handshake: {e}"),
        })
}

/// Decodes a handshake reply; an `Error` frame becomes its text (a limit the peer
/// reached, by its reject code, `HandshakeFailure::Limit`).
async fn decode_reply<S: AsyncRead + Unpin>(
    head: &[u8; HEADER_LEN],
    stream: &mut S,
) -> std::result::Result<Header, HandshakeFailure> {
    let h = Header::decode(head).map_err(|e| format!("handshake: {e}"))?;
    if h.op == Op::Error {
        let mut text = vec![0u8; h.payload_len().min(crate::wire::MAX_ERROR_PAYLOAD) as usize];
        read_handshake(stream, &mut text).await?;
        let text = String::from_utf8_lossy(&text);
        return Err(match RejectCode::from_raw(h.flags) {
            RejectCode::ResourceLimit => HandshakeFailure::Limit(text.into_owned()),
            _ => format!("refused: {text}").into(),
        });
    }
    Ok(h)
}

/// The server's side of the handshake: reads exactly a Hello, and with a secret exactly a
/// proof — nothing larger is read before the peer proved the secret. Returns the Hello once
/// the peer is verified, and the caller decides whether to let it in ([`acknowledge`]) or
/// refuse it ([`refuse`]); on failure sends nothing itself and returns why.
pub(crate) async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: Option<&Secret>,
    engine_id: u64,
) -> std::result::Result<Header, Refused> {
    server_handshake_sealing(stream, secret, engine_id, Stance::Refuse)
        .await
        .map(|(hello, _)| hello)
}

/// `server_handshake` by a server with `stance` on sealing the connection: also the
/// connection's keys when it is sealed.
pub(crate) async fn server_handshake_sealing<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: Option<&Secret>,
    engine_id: u64,
    stance: Stance,
) -> std::result::Result<(Header, Option<SealKeys>), Refused> {
    let cut = |e: std::io::Error| {
        Refused::silent(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Failure::Aborted
        } else {
            Failure::Protocol
        })
    };
    let mut hello = [0u8; HEADER_LEN];
    stream.read_exact(&mut hello).await.map_err(cut)?;
    let nonce = auth::nonce().map_err(|_| Refused::silent(Failure::Protocol))?;
    let outcome = auth::on_hello_sealing(secret, &hello, engine_id, nonce, stance);
    let mut keys = None;
    let checked = match outcome {
        Ok(HelloOutcome::Open) => Ok(()),
        Ok(HelloOutcome::Challenge(hs)) => {
            stream
                .write_all(hs.challenge())
                .await
                .map_err(|_| Refused::silent(Failure::Protocol))?;
            let mut proof = [0u8; HEADER_LEN + auth::MAC_LEN];
            stream.read_exact(&mut proof).await.map_err(cut)?;
            hs.verify(&proof).and_then(|()| {
                keys = hs.keys().map_err(|_| Failure::Protocol)?;
                Ok(())
            })
        }
        Err(f) => Err(f),
    };
    // The peer sent all it had to and waits for the verdict: it is told (`Refused::tell`).
    checked.map_err(|why| Refused { why, tell: true })?;
    let hello = Header::decode(&hello).map_err(|_| Refused::silent(Failure::Protocol))?;
    Ok((hello, keys))
}

/// Lets a verified peer in: HelloAck with this engine's id.
pub(crate) async fn acknowledge<S: AsyncWrite + Unpin>(
    stream: &mut S,
    engine_id: u64,
) -> Result<()> {
    acknowledge_serving(stream, engine_id, 0).await
}

/// `acknowledge`, saying what this engine serves on the connection (`ACK_*` bits).
pub(crate) async fn acknowledge_serving<S: AsyncWrite + Unpin>(
    stream: &mut S,
    engine_id: u64,
    features: u16,
) -> Result<()> {
    let mut ack = Header::new(Op::HelloAck);
    ack.request_id = engine_id;
    ack.flags = features;
    stream
        .write_all(&ack.encode())
        .await
        .map_err(|e| Error::io("write HelloAck", &e))
}

/// Tells a peer waiting for the handshake's verdict that it was refused, and why. Best
/// effort: the connection is dropped next whatever happens.
pub(crate) async fn refuse<S: AsyncWrite + Unpin>(stream: &mut S, code: RejectCode, reason: &[u8]) {
    let mut e = Header::new(Op::Error);
    e.flags = code as u16;
    e.length = reason.len() as u64;
    let _ = write_all_pair(stream, &e.encode(), reason).await;
}

/// A handshake the serving side failed: why, and whether the peer waits to be told.
///
/// The refusal is not written by the handshake itself: [`Refused::settle`] counts the
/// failure first and then tells the peer, so that a peer which has read its refusal finds
/// it counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) why: Failure,
    tell: bool,
}

impl Refused {
    /// A failure the peer is not told of (it went away, or broke the protocol).
    pub(crate) fn silent(why: Failure) -> Self {
        Self { why, tell: false }
    }

    /// Counts the failure in `admission` (from `addr`), then tells the peer, within
    /// `deadline`: one that has read its refusal finds it in the metrics.
    pub(crate) async fn settle<S: AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        admission: &Admission,
        addr: Option<IpAddr>,
        deadline: Duration,
    ) {
        admission.auth_failed(self.why, addr);
        let _ = tokio::time::timeout(deadline, self.tell(stream)).await;
    }

    /// Tells the peer why it was refused, when it waits for the answer.
    async fn tell<S: AsyncWrite + Unpin>(&self, stream: &mut S) {
        if !self.tell {
            return;
        }
        let text: &[u8] = match self.why {
            Failure::NoSecret => b"this engine requires the cluster secret (authSecret)",
            Failure::Plaintext => {
                b"this engine requires encrypted connections (encrypt): set encrypt to \
                  'auto' or true"
            }
            _ => b"authentication failed",
        };
        refuse(stream, RejectCode::Auth, text).await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_frame_buffer_that_cannot_be_allocated_is_a_resource_limit_not_an_abort() {
        // More than any allocator gives: the fallible path, as under RLIMIT_AS.
        let len = usize::MAX / 4;
        let err = frame_buffer(len).expect_err("no such buffer");
        assert_eq!(err.code(), "ERR_FERRY_RESOURCE_LIMIT", "{err}");
        assert!(
            err.to_string().contains(&format!(
                "memory: a buffer of {len} bytes for a peer's frame"
            )),
            "{err}"
        );
        assert_eq!(frame_buffer(16).expect("small"), vec![0u8; 16]);
    }

    /// How many of `n` connects to `listener` (never accepted) complete within 300 ms each.
    fn queued(listener: &TcpListener, n: usize) -> usize {
        let addr = listener.local_addr().expect("addr");
        let mut held = Vec::new();
        for _ in 0..n {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        held.len()
    }

    #[test]
    fn a_deepened_listener_queues_a_storm_of_connects() {
        // std's 128: the kernel drops what comes past it.
        let shallow = TcpListener::bind("127.0.0.1:0").expect("bind");
        assert!(queued(&shallow, 300) < 300);
        let deep = TcpListener::bind("127.0.0.1:0").expect("bind");
        deepen_backlog(&deep).expect("listen");
        assert_eq!(queued(&deep, 300), 300);
    }
}
