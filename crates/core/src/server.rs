//! The engine's listener: one TCP address for control and data. Each connection starts
//! with a Hello naming its kind. Control connections fetch the segment descriptor and
//! exchange heartbeats; data connections carry READ/WRITE slices into registered memory.
//!
//! The target checks the token, the buffer, the bounds and the permission of every request
//! before it touches memory. A malformed, truncated or oversized frame drops that
//! connection with a logged reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, Handshake, Slot};
use crate::auth::{Failure, Secret};
use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::memory::{check_range, Access, Region, RegionTable, Window};
use crate::net::{
    acknowledge_serving, read_frame_within, read_header_within, refuse, server_handshake_sealing,
    tune_accepted, write_all_pair, Refused, ACK_LINK_NOTIFY,
};
use crate::notify::serve::{serve_notify, OnLink, Receiving};
use crate::resource::Overflow;
use crate::seal::SealKeys;
use crate::sealed_stream::{
    tell_tampered, ConnRead, ConnWrite, SealedConn, SealedRead, SealedWrite,
};
use crate::sealing::Stance;
use crate::segment::{token_hex, BufferDescriptor, SegmentDescriptor};
use crate::transport::{ControlPeers, Transport};
use crate::wire::{
    token_eq, ConnKind, Header, Op, RejectCode, Token, CHECKSUM_LEN, FLAG_CHECKSUM, HEADER_LEN,
};

/// Read/write buffer of a served data connection.
const IO_BUFFER: usize = 64 << 10;

/// What the server needs to know about the local segment.
pub(crate) struct LocalSegment {
    pub engine_id: u64,
    pub name: String,
    pub machine_id: String,
    pub token: Token,
    pub regions: Arc<RegionTable>,
    /// Installed transports, in the order peers should prefer them.
    pub transports: Vec<(TransportKind, Arc<dyn Transport>)>,
    /// Peer engines with a control connection open.
    pub control_peers: Arc<ControlPeers>,
    /// The cluster secret every connection must prove.
    pub secret: Option<Secret>,
    /// Whether data connections are sealed (`sealing`); needs `secret`.
    pub encrypt: crate::sealing::Encrypt,
    /// Connection caps and refusal counters.
    pub admission: Arc<Admission>,
    /// Deadline of the handshake and of each started frame.
    pub frame_timeout: Duration,
    /// Notifications received, waiting for the application (`notify`).
    pub notify_inbox: Arc<crate::notify::inbox::Inbox>,
    /// Largest notification payload accepted.
    pub notify_max_bytes: usize,
    /// The goodbye said on every control connection as the engine closes.
    pub farewell: Arc<crate::farewell::Farewell>,
    /// Keeps this engine's dialing secret registered while the server lives.
    pub _credentials: crate::auth::Registered,
}

impl LocalSegment {
    /// Where notifications received here go, and their limits.
    fn receiving(&self) -> Receiving<'_> {
        Receiving {
            inbox: &self.notify_inbox,
            max_bytes: self.notify_max_bytes,
            frame_timeout: self.frame_timeout,
        }
    }

    /// The descriptor peers fetch.
    pub(crate) fn descriptor(&self) -> SegmentDescriptor {
        SegmentDescriptor {
            engine_id: self.engine_id,
            name: self.name.clone(),
            machine_id: self.machine_id.clone(),
            pid: std::process::id(),
            tcp_addr: self.name.clone(),
            token: token_hex(&self.token),
            buffers: self
                .regions
                .snapshot()
                .iter()
                .map(|r| {
                    let serving = self.transports.iter().filter(|(_, t)| t.serves(r));
                    BufferDescriptor {
                        id: r.id(),
                        length: r.len() as u64,
                        access: r.access(),
                        transports: serving.clone().map(|(k, _)| *k).collect(),
                        transport_info: serving
                            .filter_map(|(k, t)| {
                                Some((k.name().to_string(), t.describe_buffer(r)?))
                            })
                            .collect(),
                    }
                })
                .collect(),
            transport_info: self
                .transports
                .iter()
                .filter_map(|(k, t)| Some((k.name().to_string(), t.describe()?)))
                .collect(),
        }
    }

    /// Answers a `TransportReq` frame.
    fn transport_control(&self, header: &Header, payload: &[u8]) -> (Header, Vec<u8>) {
        let handler = TransportKind::from_raw(header.buffer_id.min(255) as u8)
            .and_then(|kind| self.transports.iter().find(|(k, _)| *k == kind));
        let answer = match handler {
            Some((_, t)) => t.control(payload),
            None => Err(Error::Protocol(format!(
                "no transport {} here",
                header.buffer_id
            ))),
        };
        let (mut reply, body) = match answer {
            Ok(body) => (Header::new(Op::TransportResp), body),
            Err(e) => {
                let mut h = Header::new(Op::Error);
                h.flags = RejectCode::BadRequest as u16;
                (h, error_text(&e.to_string()).to_vec())
            }
        };
        reply.request_id = header.request_id;
        reply.length = body.len() as u64;
        (reply, body)
    }
}

/// Accepts connections until `cancel` fires. The spare descriptor for running out
/// (`Overflow`) is taken now, as the engine starts, not when the loop first runs.
pub(crate) fn accept_loop(
    listener: TcpListener,
    local: Arc<LocalSegment>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send {
    accept_until(listener, local, cancel, Overflow::new())
}

async fn accept_until(
    listener: TcpListener,
    local: Arc<LocalSegment>,
    cancel: CancellationToken,
    mut overflow: Overflow,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, from)) => {
                // Never refused here: it waits in the handshake budget, where it may push
                // out (and end) the oldest handshake of its address, and counts against the
                // caps once it proved the secret.
                let handshake = local.admission.start_handshake(Some(from.ip()));
                let local = local.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move {
                    let evicted = handshake.evicted();
                    // Biased: once close has begun, no frame is answered — above all no
                    // Pong, which would vouch to a peer holding failures that this engine
                    // is alive (an unbiased select may poll `serve` first and answer).
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => {}
                        _ = evicted.cancelled() => {}
                        r = serve(stream, from, local, handshake) => {
                            if let Err(e) = r {
                                tracing::debug!(%from, error = %e, "connection dropped");
                            }
                        }
                    }
                });
            }
            // Out of descriptors, a waiting connection is told so at once (the spare's
            // descriptor lets it out of the backlog); otherwise back off, not spin.
            Err(e) => {
                if !overflow.refuse_waiting(&e, &listener) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Runs the handshake within `frameTimeoutMs`, then lets the peer in: its Hello and its
/// place among authenticated connections, and its keys when sealed; or why it was refused
/// (counted and told).
async fn let_in(
    stream: &mut TcpStream,
    from: SocketAddr,
    local: &LocalSegment,
    handshake: Handshake,
) -> Result<(Header, Slot, Option<SealKeys>)> {
    let (admission, ip) = (&local.admission, Some(from.ip()));
    let stance = match local.secret {
        Some(_) => local.encrypt.stance(from.ip().is_loopback()),
        None => Stance::Refuse,
    };
    let verified = server_handshake_sealing(stream, local.secret.as_ref(), local.engine_id, stance);
    let outcome = tokio::time::timeout(local.frame_timeout, verified)
        .await
        .unwrap_or(Err(Refused::silent(Failure::Timeout)));
    let (hello, keys) = match outcome {
        Ok(verified) => verified,
        Err(refused) => {
            refused
                .settle(stream, admission, ip, local.frame_timeout)
                .await;
            return Err(Error::Protocol(format!(
                "handshake failed: {}",
                refused.why.label()
            )));
        }
    };
    let slot = match handshake.admit() {
        Ok(slot) => slot,
        Err(refusal) => {
            let why = local.admission.describe(refusal);
            let told = refuse(stream, refusal.reject_code(), why.as_bytes());
            let _ = tokio::time::timeout(local.frame_timeout, told).await;
            return Err(Error::Protocol(format!("refused: {}", refusal.reason())));
        }
    };
    // Control connections carry the peer's notifications (`ACK_LINK_NOTIFY`).
    let features = match ConnKind::from_raw(hello.buffer_id) {
        Some(ConnKind::Control) => ACK_LINK_NOTIFY,
        _ => 0,
    };
    let acked = acknowledge_serving(stream, local.engine_id, features);
    tokio::time::timeout(local.frame_timeout, acked)
        .await
        .map_err(|_| Error::Protocol("HelloAck not sent within frameTimeoutMs".into()))??;
    Ok((hello, slot, keys))
}

async fn serve(
    mut stream: TcpStream,
    from: SocketAddr,
    local: Arc<LocalSegment>,
    handshake: Handshake,
) -> Result<()> {
    let (hello, _slot, keys) = let_in(&mut stream, from, &local, handshake).await?;
    // On the heap, made only now: a connection in its handshake holds a small future (its
    // read buffers are a header and a proof), whatever serving it later takes.
    Box::pin(serve_admitted(stream, hello, local, keys)).await
}

/// Serves an admitted connection of the kind its Hello named (sealed with `keys` when its
/// handshake sealed it).
async fn serve_admitted(
    stream: TcpStream,
    hello: Header,
    local: Arc<LocalSegment>,
    keys: Option<SealKeys>,
) -> Result<()> {
    let kind = ConnKind::from_raw(hello.buffer_id)
        .ok_or_else(|| Error::Protocol(format!("unknown connection kind {}", hello.buffer_id)))?;
    tune_accepted(&stream, kind);
    let result = match kind {
        ConnKind::Control => {
            let _counted = local.control_peers.enter(hello.request_id);
            let _owed = local.farewell.owe();
            serve_control(SealedConn::new(stream, keys), &local, hello.request_id).await
        }
        ConnKind::Data => serve_data(stream, &local, keys).await,
        ConnKind::Notify => {
            let conn = SealedConn::new(stream, keys);
            serve_notify(conn, local.receiving(), hello.request_id).await
        }
        ConnKind::Shm => Err(Error::Protocol(
            "shm connections go to the shm socket".into(),
        )),
    };
    if let Err(e) = &result {
        if matches!(e, Error::Protocol(_)) {
            tracing::warn!(error = %e, ?kind, "dropping connection from misbehaving peer");
        }
    }
    result
}

/// Answers a peer's control frames until it leaves, or says goodbye as this engine closes.
/// The link of engine `sender` also carries its notifications (`notify::serve::OnLink`).
/// A sealed connection whose record failed its authentication ends, the peer told.
async fn serve_control(conn: SealedConn, local: &LocalSegment, sender: u64) -> Result<()> {
    let mut r = BufReader::new(conn.r);
    let mut w = conn.w;
    let served = serve_control_frames(&mut r, &mut w, local, sender).await;
    if r.get_ref().tampered() {
        return Err(tell_tampered(&mut w, local.frame_timeout, "control").await);
    }
    served
}

/// The answers to a burst of frames leave in one write (on a sealed connection, one
/// record).
async fn serve_control_frames(
    r: &mut BufReader<ConnRead>,
    w: &mut ConnWrite,
    local: &LocalSegment,
    sender: u64,
) -> Result<()> {
    let mut notes = OnLink::new(local.receiving(), sender);
    let mut answers: Vec<u8> = Vec::new();
    loop {
        // A frame half read when the goodbye begins is dropped with the connection.
        let frame = tokio::select! {
            biased;
            _ = local.farewell.begun() => {
                append_frame(&mut answers, &Header::new(Op::Goodbye), &[]);
                let bye = async {
                    w.write_all(&answers).await?;
                    w.flush().await
                };
                let _ = tokio::time::timeout(local.frame_timeout, bye).await;
                return Ok(());
            }
            frame = read_frame_within(r, local.frame_timeout) => frame?,
        };
        let Some((header, payload)) = frame else {
            return Ok(());
        };
        match header.op {
            Op::TransportReq => {
                // Handshakes may call into a device (e.g. create queue pairs): keep them
                // off the I/O threads' async path.
                let (reply, body) =
                    tokio::task::block_in_place(|| local.transport_control(&header, &payload));
                append_frame(&mut answers, &reply, &body);
            }
            Op::Ping => {
                let mut pong = Header::new(Op::Pong);
                pong.request_id = header.request_id;
                append_frame(&mut answers, &pong, &[]);
            }
            Op::NotifyOpen | Op::Notify => {
                let (reply, body) = notes.frame(&header, payload)?;
                append_frame(&mut answers, &reply, &body);
            }
            Op::GetDescriptor => {
                let body = serde_json::to_vec(&local.descriptor())
                    .map_err(|e| Error::Protocol(format!("encode descriptor: {e}")))?;
                let mut reply = Header::new(Op::Descriptor);
                reply.request_id = header.request_id;
                reply.length = body.len() as u64;
                append_frame(&mut answers, &reply, &body);
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {other:?} on a control connection"
                )))
            }
        }
        if r.buffer().len() + r.get_ref().opened_len() < HEADER_LEN {
            // Flushed: a sealed stream keeps what the socket did not take of its record
            // until the next write or flush, and a pong must not wait for the next ping.
            let sent = async {
                w.write_all(&answers).await?;
                w.flush().await
            };
            sent.await
                .map_err(|e| Error::io("write a control answer", &e))?;
            answers.clear();
        }
    }
}

fn append_frame(out: &mut Vec<u8>, header: &Header, body: &[u8]) {
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
}

/// Checks a data request against the local segment; returns the region to touch.
fn admit(
    local: &LocalSegment,
    h: &Header,
) -> std::result::Result<Arc<Region>, (RejectCode, String)> {
    if !token_eq(&h.token, &local.token) {
        return Err((RejectCode::BadToken, "access token mismatch".into()));
    }
    let region = local.regions.get(h.buffer_id).map_err(|_| {
        (
            RejectCode::UnknownBuffer,
            format!("no buffer {}", h.buffer_id),
        )
    })?;
    check_range(h.offset, h.length, region.len() as u64)
        .map_err(|e| (RejectCode::OutOfRange, e.to_string()))?;
    if h.op == Op::WriteReq && region.access() == Access::ReadOnly {
        return Err((
            RejectCode::Permission,
            format!("buffer {} is read-only", h.buffer_id),
        ));
    }
    Ok(region)
}

/// Serves a data connection. A sealed one (`keys`) hands the reader only verified
/// records, and every frame arrives as one record: a WRITE's payload reaches registered
/// memory only once all of it proved authentic (`sealed_stream`).
async fn serve_data(stream: TcpStream, local: &LocalSegment, keys: Option<SealKeys>) -> Result<()> {
    let (rd, wr) = stream.into_split();
    let (sealer, opener) = keys.map(SealKeys::split).unzip();
    // Buffered under the records too: a sealed record's length prefix and body are read
    // from the buffer, not a system call each (a READ request is a small record).
    let rd = BufReader::with_capacity(IO_BUFFER, rd);
    let mut r = BufReader::with_capacity(IO_BUFFER, SealedRead::new(rd, opener));
    let mut w = BufWriter::with_capacity(IO_BUFFER, SealedWrite::new(wr, sealer));
    let served = serve_data_frames(&mut r, &mut w, local).await;
    if r.get_ref().tampered() {
        // The initiator is told, sealed (this direction is intact), before the drop: its
        // requests on this connection fail as tampered, not as a vanished peer.
        return Err(tell_tampered(&mut w, local.frame_timeout, "data").await);
    }
    served
}

type DataReader = BufReader<SealedRead<BufReader<tokio::net::tcp::OwnedReadHalf>>>;
type DataWriter = BufWriter<SealedWrite<tokio::net::tcp::OwnedWriteHalf>>;

async fn serve_data_frames(
    r: &mut DataReader,
    w: &mut DataWriter,
    local: &LocalSegment,
) -> Result<()> {
    let io = |ctx: &'static str| move |e: std::io::Error| Error::io(ctx, &e);
    let within = |what: &'static str| {
        move |_| Error::Protocol(format!("{what} not complete within frameTimeoutMs"))
    };
    // Where a verified WRITE's payload waits for its check (`read_verified`), grown to the
    // largest such payload the connection got.
    let mut staging = Vec::new();
    loop {
        let Some(h) = read_header_within(r, local.frame_timeout).await? else {
            return Ok(());
        };
        let mut reply = Header::new(Op::Error);
        reply.request_id = h.request_id;
        match h.op {
            Op::WriteReq => match admit(local, &h) {
                Ok(region) => {
                    let mut dst = Window::new(&region, h.offset, h.length)
                        .map_err(|e| Error::Protocol(e.to_string()))?;
                    let landed = if h.checksummed() {
                        let read = read_verified(r, &mut staging, dst.as_mut_slice());
                        tokio::time::timeout(local.frame_timeout, read)
                            .await
                            .map_err(within("WRITE payload"))??
                    } else {
                        tokio::time::timeout(local.frame_timeout, r.read_exact(dst.as_mut_slice()))
                            .await
                            .map_err(within("WRITE payload"))?
                            .map_err(|e| {
                                Error::Protocol(format!("truncated WRITE payload: {e}"))
                            })?;
                        Ok(())
                    };
                    match landed {
                        Ok(()) => {
                            reply.op = Op::WriteAck;
                            reply.length = 0;
                            if h.checksummed() {
                                reply.flags = FLAG_CHECKSUM;
                            }
                            w.write_all(&reply.encode())
                                .await
                                .map_err(io("write ack"))?;
                        }
                        Err(e) => reject(w, reply, RejectCode::Integrity, &e.to_string()).await?,
                    }
                }
                Err((code, reason)) => {
                    tokio::time::timeout(local.frame_timeout, drain(r, h.payload_len()))
                        .await
                        .map_err(within("refused WRITE payload"))??;
                    reject(w, reply, code, &reason).await?;
                }
            },
            Op::ReadReq => match admit(local, &h) {
                Ok(region) => {
                    let src = Window::new(&region, h.offset, h.length)
                        .map_err(|e| Error::Protocol(e.to_string()))?;
                    reply.op = Op::ReadResp;
                    reply.length = h.length;
                    if h.checksummed() {
                        // A slice's CRC32C is tens of microseconds: no need to leave the
                        // runtime's thread for it.
                        reply.set_token_checksum(crate::integrity::checksum(src.as_slice()));
                    }
                    write_all_pair(w, &reply.encode(), src.as_slice())
                        .await
                        .map_err(io("write READ reply"))?;
                }
                Err((code, reason)) => reject(w, reply, code, &reason).await?,
            },
            Op::Ping => {
                reply.op = Op::Pong;
                w.write_all(&reply.encode())
                    .await
                    .map_err(io("write pong"))?;
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {other:?} on a data connection"
                )))
            }
        }
        // Flush when no further complete request is already buffered: replies to a burst
        // of small requests leave in one write.
        if !request_buffered(r) {
            w.flush().await.map_err(io("flush"))?;
        }
    }
}

/// Whether the next request's header already waits on this side, so that this reply may
/// wait in the writer for the ones after it: plaintext handed out and not consumed (on a
/// plaintext connection: read from the socket), opened and not handed out yet, or, sealed,
/// a whole record received and not yet opened (a burst's requests arrive together but are
/// opened one record at a time). A record partly received needs the network: its sender
/// may be waiting for these replies.
fn request_buffered<T: tokio::io::AsyncRead + Unpin>(
    r: &BufReader<SealedRead<BufReader<T>>>,
) -> bool {
    let sealed = r.get_ref();
    r.buffer().len() + sealed.opened_len() >= HEADER_LEN || sealed.whole_record_buffered(HEADER_LEN)
}

/// Reads a verified WRITE's checksum word and payload, and copies the payload into `dst`
/// only if it matches: into `staging` first, so that nothing of a corrupted payload lands
/// in registered memory. `Err` (outer): the connection failed; `Ok(Err)`: the payload did
/// not match its checksum (the frame was read whole, the stream is still in step).
async fn read_verified<R: AsyncReadExt + Unpin>(
    r: &mut R,
    staging: &mut Vec<u8>,
    dst: &mut [u8],
) -> Result<Result<()>> {
    let mut word = [0u8; CHECKSUM_LEN];
    let truncated = |e: std::io::Error| Error::Protocol(format!("truncated WRITE payload: {e}"));
    r.read_exact(&mut word).await.map_err(truncated)?;
    if staging.len() < dst.len() {
        // Bounded by the op's cap (`MAX_DATA_PAYLOAD`), which the header's decoding checked.
        staging
            .try_reserve_exact(dst.len() - staging.len())
            .map_err(|_| {
                Error::ResourceLimit(crate::resource::describe_allocation(
                    dst.len(),
                    "a verified WRITE's staging buffer",
                ))
            })?;
        staging.resize(dst.len(), 0);
    }
    let staged = &mut staging[..dst.len()];
    // Checksummed as it arrives, piece by piece (`read_checksummed`).
    let running = crate::checksummed_read::read_checksummed(r, staged)
        .await
        .map_err(truncated)?;
    let checked = running
        .check("WRITE payload", u32::from_le_bytes(word))
        .map(|()| dst.copy_from_slice(staged));
    Ok(checked)
}

async fn drain<R: AsyncReadExt + Unpin>(r: &mut R, mut len: u64) -> Result<()> {
    let mut scratch = [0u8; 8192];
    while len > 0 {
        let n = (len as usize).min(scratch.len());
        r.read_exact(&mut scratch[..n])
            .await
            .map_err(|e| Error::Protocol(format!("truncated payload: {e}")))?;
        len -= n as u64;
    }
    Ok(())
}

/// The payload of an `Error` frame: the reason's bytes, capped (the reader decodes lossily,
/// so a cut inside a character costs nothing).
fn error_text(reason: &str) -> &[u8] {
    &reason.as_bytes()[..reason.len().min(1024)]
}

async fn reject<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    mut reply: Header,
    code: RejectCode,
    reason: &str,
) -> Result<()> {
    tracing::debug!(?code, reason, "rejecting request");
    let text = error_text(reason);
    reply.op = Op::Error;
    reply.flags = code as u16;
    reply.length = text.len() as u64;
    w.write_all(&reply.encode())
        .await
        .map_err(|e| Error::io("write error", &e))?;
    w.write_all(text)
        .await
        .map_err(|e| Error::io("write error", &e))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, BufReader};

    use super::*;

    fn keys() -> (SealKeys, SealKeys) {
        crate::seal::tests::pair(b"flush")
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    }

    /// A data connection's reader as `serve_data` builds it, over `wire`.
    fn reader(wire: &[u8], opener: Option<crate::seal::Opener>) -> DataReaderOver<&[u8]> {
        let rd = BufReader::with_capacity(IO_BUFFER, wire);
        BufReader::with_capacity(IO_BUFFER, SealedRead::new(rd, opener))
    }

    type DataReaderOver<T> = BufReader<SealedRead<BufReader<T>>>;

    /// Reads one request frame's header (a READ request is its header alone).
    async fn take_header<T: tokio::io::AsyncRead + Unpin>(r: &mut DataReaderOver<T>) {
        let mut head = [0u8; HEADER_LEN];
        r.read_exact(&mut head).await.expect("a header");
        assert_eq!(Header::decode(&head).expect("decode").op, Op::ReadReq);
    }

    /// A burst of sealed READ requests (each frame its own record, as the pool's writer
    /// seals them, written together) then part of one more: each request but the last
    /// whole one sees another waiting (its reply is held for the burst's one write); the
    /// last sees only a record partly received, which needs the network (flushed).
    #[test]
    fn a_sealed_burst_is_answered_in_one_write_and_a_partial_record_flushes() {
        rt().block_on(async {
            let (mut c, s) = keys();
            let frame = Header::new(Op::ReadReq).encode();
            let mut wire = Vec::new();
            for _ in 0..3 {
                c.sealer.seal_into(&[&frame], &mut wire).expect("seal");
            }
            let mut partial = Vec::new();
            c.sealer.seal_into(&[&frame], &mut partial).expect("seal");
            wire.extend_from_slice(&partial[..partial.len() / 2]);
            let mut r = reader(&wire, Some(s.opener));
            for (i, more) in [true, true, false].into_iter().enumerate() {
                take_header(&mut r).await;
                assert_eq!(request_buffered(&r), more, "after request {i}");
            }
        });
    }

    /// A whole record too short to hold a request's header does not count as one: its
    /// header would need the network too.
    #[test]
    fn a_whole_record_shorter_than_a_header_is_no_request() {
        rt().block_on(async {
            let (mut c, s) = keys();
            let mut wire = Vec::new();
            c.sealer
                .seal_into(&[&Header::new(Op::ReadReq).encode()], &mut wire)
                .expect("seal");
            c.sealer.seal_into(&[&[0u8; 8]], &mut wire).expect("seal");
            let mut r = reader(&wire, Some(s.opener));
            take_header(&mut r).await;
            assert!(!request_buffered(&r));
        });
    }

    /// The same burst in plaintext: the reader's buffer holds the rest of it.
    #[test]
    fn a_plaintext_burst_is_answered_in_one_write() {
        rt().block_on(async {
            let frame = Header::new(Op::ReadReq).encode();
            let mut wire = Vec::new();
            for _ in 0..3 {
                wire.extend_from_slice(&frame);
            }
            wire.extend_from_slice(&frame[..HEADER_LEN / 2]);
            let mut r = reader(&wire, None);
            for (i, more) in [true, true, false].into_iter().enumerate() {
                take_header(&mut r).await;
                assert_eq!(request_buffered(&r), more, "after request {i}");
            }
        });
    }
}
