//! The client side of the control plane: fetching a peer's segment descriptor, and the
//! I/O of the per-peer link whose decisions (heartbeats, silence, backoff, loss and
//! recovery) are the state machine of `liveness.rs`. A reconnect refetches the descriptor
//! when the peer's engine id changed, i.e. it restarted, and reports the new incarnation
//! (`LinkEvents::descriptor_seen`); a link whose connection belongs to an incarnation that
//! is no longer the peer's leaves it for the new one (`Peer::relink`).

use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};
use crate::link_port::{Answers, Queued};
use crate::liveness::{Action, Link, LinkState, LossReason};
use crate::net::{connect, connect_reaching, read_frame, write_frame, Reached};
use crate::sealed_stream::{tampered_by_notice, ConnRead, SealedConn};
use crate::segment::{Peer, SegmentDescriptor};
use crate::wire::{ConnKind, Header, Op};

/// Reads the next frame of a control connection: a tamper notice from the peer (the
/// connection is sealed and a record from this end failed there) is the error it stands
/// for.
async fn read_control_frame<R>(r: &mut R, sealed: bool) -> Result<Option<(Header, Vec<u8>)>>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let frame = read_frame(r).await?;
    if let Some(tampered) = frame
        .as_ref()
        .and_then(|(h, _)| tampered_by_notice(h, sealed))
    {
        return Err(tampered);
    }
    Ok(frame)
}

/// Asks an open control connection for the descriptor.
async fn request_descriptor(conn: &mut SealedConn) -> Result<SegmentDescriptor> {
    let mut req = Header::new(Op::GetDescriptor);
    req.request_id = 1;
    write_frame(&mut conn.w, &req, &[]).await?;
    let sealed = conn.r.is_sealed();
    loop {
        match read_control_frame(&mut conn.r, sealed).await? {
            Some((h, body)) if h.op == Op::Descriptor => {
                return serde_json::from_slice(&body)
                    .map_err(|e| Error::Protocol(format!("bad descriptor: {e}")));
            }
            Some((h, _)) if h.op == Op::Pong => continue,
            Some((h, _)) if h.op == Op::Goodbye => {
                return Err(Error::Protocol("the peer is closing".into()))
            }
            Some((h, _)) => {
                return Err(Error::Protocol(format!(
                    "expected Descriptor, got {:?}",
                    h.op
                )))
            }
            None => return Err(Error::Protocol("closed before sending descriptor".into())),
        }
    }
}

/// Connects to `addr` and fetches its descriptor.
pub(crate) async fn fetch_descriptor(
    addr: &str,
    local_engine_id: u64,
    timeout: Duration,
) -> Result<SegmentDescriptor> {
    let (desc, (mut conn, _)) = open_control(addr, local_engine_id, timeout).await?;
    let _ = conn.w.shutdown().await;
    Ok(desc)
}

/// Connects to `addr` and fetches its descriptor, keeping the control connection open: an
/// opened segment's link starts on it (`run_link`'s `first`), so that opening a segment
/// costs one connection and one handshake, not two.
pub(crate) async fn open_control(
    addr: &str,
    local_engine_id: u64,
    timeout: Duration,
) -> Result<(SegmentDescriptor, (SealedConn, Reached))> {
    let (stream, reached, keys) =
        connect_reaching(addr, ConnKind::Control, local_engine_id, timeout).await?;
    let mut conn = SealedConn::new(stream, keys);
    let remote_id = reached.engine_id;
    let desc = tokio::time::timeout(timeout, request_descriptor(&mut conn))
        .await
        .map_err(|_| Error::Connect {
            peer: addr.to_string(),
            reason: "descriptor fetch timed out".into(),
        })??;
    if desc.engine_id != remote_id {
        return Err(Error::Protocol(format!(
            "{addr}'s descriptor names engine {:016x}, its handshake {remote_id:016x}",
            desc.engine_id
        )));
    }
    Ok((desc, (conn, reached)))
}

/// Sends one transport control request (`TransportReq`, e.g. an RDMA endpoint handshake) to
/// the engine at `addr` and returns its answer, with the engine id its handshake answered:
/// the incarnation that made the answer, which may not be the one the caller knows.
pub async fn transport_request(
    addr: &str,
    local_engine_id: u64,
    kind: crate::kind::TransportKind,
    payload: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, u64)> {
    let exchange = async {
        let (stream, answered, keys) =
            connect(addr, ConnKind::Control, local_engine_id, timeout).await?;
        let mut conn = SealedConn::new(stream, keys);
        let mut req = Header::new(Op::TransportReq);
        req.request_id = 1;
        req.buffer_id = kind as u64;
        req.length = payload.len() as u64;
        write_frame(&mut conn.w, &req, payload).await?;
        let sealed = conn.r.is_sealed();
        loop {
            match read_control_frame(&mut conn.r, sealed).await? {
                Some((h, body)) if h.op == Op::TransportResp => {
                    let _ = conn.w.shutdown().await;
                    return Ok((body, answered));
                }
                Some((h, body)) if h.op == Op::Error => {
                    return Err(Error::Protocol(format!(
                        "{} refused the {} request: {}",
                        addr,
                        kind.name(),
                        String::from_utf8_lossy(&body)
                    )));
                }
                Some((h, _)) if h.op == Op::Pong => continue,
                Some((h, _)) => {
                    return Err(Error::Protocol(format!(
                        "expected TransportResp, got {:?}",
                        h.op
                    )))
                }
                None => return Err(Error::Protocol("closed before answering".into())),
            }
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Connect {
            peer: addr.to_string(),
            reason: format!("{} control request timed out", kind.name()),
        })?
}

/// What the link reports to the engine.
pub(crate) trait LinkEvents: Send + Sync + 'static {
    /// The peer fell silent or its connection broke.
    fn peer_lost(&self, peer: &Arc<Peer>, reason: LossReason);
    /// The peer answered again after being lost.
    fn peer_back(&self, peer: &Arc<Peer>);
    /// The peer's descriptor, just fetched from it: maybe of a new incarnation (the old
    /// one is then lost, restarted) or with buffers it allocated since.
    fn descriptor_seen(&self, peer: &Arc<Peer>, desc: SegmentDescriptor);
}

/// Settings of a link.
#[derive(Clone, Copy)]
pub(crate) struct LinkConfig {
    pub local_engine_id: u64,
    pub peer_timeout: Duration,
}

/// Keeps the control link to `peer` alive until `peer.link_cancel` fires: drives its
/// [`Link`] state machine with the socket's frames and the clock. `first` is a control
/// connection already made (the one the descriptor came on) and who its handshake reached,
/// taken before any connect.
pub(crate) async fn run_link(
    peer: Arc<Peer>,
    cfg: LinkConfig,
    events: Arc<dyn LinkEvents>,
    mut first: Option<(SealedConn, Reached)>,
) {
    let cancel = peer.link_cancel.clone();
    let seed = cfg.local_engine_id ^ peer.handle().rotate_left(17);
    let mut link = Link::new(cfg.peer_timeout, seed);
    let report = |action: Option<Action>| {
        if let Some(Action::Lost(reason)) = action {
            tracing::warn!(peer = peer.name(), %reason, "peer lost");
            events.peer_lost(&peer, reason);
            // Notifications waiting for the link learn of the loss.
            peer.link_port.wake();
        }
    };
    // Whatever ends the link, failures it held end with their own errors.
    let _vouch = VouchOnDrop(&peer);
    loop {
        match link.state() {
            LinkState::Connecting => {
                let connected = match first.take() {
                    Some(first) => Ok(first),
                    None => tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return,
                        r = connect_fresh(&peer, cfg, &*events) => r,
                    },
                };
                let (stream, reached) = match connected {
                    Ok(connected) => connected,
                    Err(reason) => {
                        report(link.broken(reason, Instant::now(), peer.is_lost()));
                        continue;
                    }
                };
                if link.connected(Instant::now(), peer.is_lost()) {
                    tracing::info!(peer = peer.name(), "peer reachable again");
                    events.peer_back(&peer);
                }
                let ended = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    r = heartbeat(stream, reached, &mut link, &peer) => r,
                };
                report(ended);
            }
            LinkState::Waiting { until } => {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(until.into()) => {}
                    // A new incarnation was seen elsewhere (etcd, a data connection): it
                    // is up, so do not wait out the backoff.
                    _ = peer.relink.notified() => link.peer_back(Instant::now()),
                }
                link.poll(Instant::now(), peer.is_lost());
            }
            // `heartbeat` returns only once the link has left this state.
            LinkState::Up { .. } => {
                let reason = LossReason::Broken("the link stopped".into());
                report(link.broken(reason, Instant::now(), peer.is_lost()));
            }
        }
    }
}

/// Connects to the peer and, when its engine id changed (it restarted), fetches the new
/// incarnation's descriptor and reports it. Returns the connection and the engine id of
/// the incarnation it reached.
async fn connect_fresh(
    peer: &Arc<Peer>,
    cfg: LinkConfig,
    events: &dyn LinkEvents,
) -> std::result::Result<(SealedConn, Reached), LossReason> {
    let addr = peer.addr();
    let unreachable = |e: Error| LossReason::Unreachable(e.to_string());
    let (stream, reached, keys) = connect_reaching(
        &addr,
        ConnKind::Control,
        cfg.local_engine_id,
        cfg.peer_timeout,
    )
    .await
    .map_err(unreachable)?;
    let mut conn = SealedConn::new(stream, keys);
    let remote_id = reached.engine_id;
    if remote_id != peer.engine_id() {
        let desc = tokio::time::timeout(cfg.peer_timeout, request_descriptor(&mut conn))
            .await
            .map_err(|_| LossReason::Unreachable("descriptor refresh timed out".into()))?
            .map_err(unreachable)?;
        if desc.engine_id != remote_id {
            return Err(LossReason::Unreachable(format!(
                "the peer's descriptor names engine {:016x}, its handshake {remote_id:016x}",
                desc.engine_id
            )));
        }
        tracing::info!(peer = peer.name(), "peer restarted: descriptor refreshed");
        events.descriptor_seen(peer, desc);
    }
    Ok((conn, reached))
}

/// Runs an up link to the incarnation `reached` of the peer: pings when due, notes every
/// frame heard, carries the peer's notifications (`link_port`), and returns the action that ended it (a loss to report, or `None` when the
/// peer was already declared lost, or when the peer's incarnation is no longer the one this
/// connection reached).
async fn heartbeat(
    conn: SealedConn,
    reached: Reached,
    link: &mut Link,
    peer: &Peer,
) -> Option<Action> {
    let remote_id = reached.engine_id;
    let SealedConn { r: rd, w: wr } = conn;
    let sealed = rd.is_sealed();
    // Buffered: a burst of notification answers is read in a few calls, not two a frame.
    let mut rd: tokio::io::BufReader<ConnRead> = tokio::io::BufReader::new(rd);
    let carrier = peer
        .link_port
        .carry(wr, remote_id, reached.carries_notify());
    let answers = carrier.answers();
    // Frames are read by their own task, so that a ping or a deadline never interrupts a
    // half-read frame; it ends with the connection, or when this function returns.
    // Each frame heard is reported with the ping it answers (0 for other frames).
    let (tx, mut heard) = tokio::sync::mpsc::channel::<std::result::Result<u64, LossReason>>(16);
    let reader = tokio::spawn(async move {
        loop {
            let got = match read_control_frame(&mut rd, sealed).await {
                Ok(Some((h, _))) if h.op == Op::Pong => Ok(h.request_id),
                Ok(Some((h, _))) if h.op == Op::Goodbye => Err(LossReason::Closed),
                Ok(Some(frame)) if Answers::routes(frame.0.op) => {
                    answers.deliver(frame);
                    Ok(0)
                }
                Ok(Some(_)) => Ok(0),
                Ok(None) => Err(LossReason::Broken(
                    "control connection closed without a goodbye".into(),
                )),
                Err(e) => {
                    if matches!(e, Error::Tampered(_)) {
                        // A broken link, as a cut one is (the peer is reported lost until a
                        // reconnect, with new keys, reaches it again).
                        tracing::warn!(error = %e, "dropping a sealed link connection");
                    }
                    Err(LossReason::Broken(e.to_string()))
                }
            };
            let end = got.is_err();
            if tx.send(got).await.is_err() || end {
                return;
            }
        }
    });
    let _abort = AbortOnDrop(reader);
    let mut seq = 0u64;
    // Failures held until the peer's fate is known are released by the answer to a ping
    // sent after they were held (the first ping numbered `vouching.0` or later), or by a
    // sign of life counted heard after they were held (at `vouching.1` or later).
    let mut vouching: Option<(u64, Instant)> = None;
    loop {
        let now = Instant::now();
        // Replies other connections got from this incarnation since the last sample.
        let sign = link.signs_of_life(now, peer.take_heard_elsewhere());
        if let (Some(at), Some((_, since))) = (sign, vouching) {
            if at >= since {
                vouching = None;
                peer.vouch_alive();
            }
        }
        match link.poll(now, peer.is_lost()) {
            Some(Action::Ping) => {
                seq += 1;
                let mut ping = Header::new(Op::Ping);
                ping.request_id = seq;
                // Queued, never waited for: a peer that stops reading falls silent, and the
                // link's deadlines say what follows.
                if carrier.ping(ping) == Queued::Broken {
                    let reason = LossReason::Broken("heartbeat write failed".into());
                    return link.broken(reason, Instant::now(), peer.is_lost());
                }
                continue;
            }
            Some(action) => return Some(action),
            None if !matches!(link.state(), LinkState::Up { .. }) => return None,
            None => {}
        }
        let deadline = link.next_deadline()?;
        // Frames already read win over a deadline that passed meanwhile: an answer that
        // came in time is never lost to the order in which the select looks.
        tokio::select! {
            biased;
            got = heard.recv() => match got {
                Some(Ok(answered)) => {
                    let checking = link.checking();
                    link.heard(Instant::now());
                    if checking && !link.checking() {
                        tracing::info!(peer = peer.name(), "the peer answered directly: its etcd record's removal is no loss");
                    }
                    if vouching.is_some_and(|(first, _)| answered >= first) {
                        vouching = None;
                        peer.vouch_alive();
                    }
                }
                Some(Err(reason)) => return link.broken(reason, Instant::now(), peer.is_lost()),
                None => {
                    let reason = LossReason::Broken("the frame reader stopped".into());
                    return link.broken(reason, Instant::now(), peer.is_lost());
                }
            },
            _ = tokio::time::sleep_until(deadline.into()) => {}
            _ = peer.probe.notified() => {
                if peer.holds() {
                    vouching.get_or_insert((seq + 1, Instant::now()));
                    link.probe(Instant::now());
                }
            }
            _ = peer.check.notified() => {
                if link.check(Instant::now(), LossReason::RecordRemoved) {
                    tracing::info!(peer = peer.name(), "etcd record removed: checking the peer directly");
                }
            }
            _ = peer.relink.notified() => {
                let now_known = peer.engine_id();
                if now_known != remote_id {
                    // Whoever saw the new incarnation reported it: no loss to report here.
                    let reason = LossReason::Restarted { engine_id: now_known };
                    return link.broken(reason, Instant::now(), true);
                }
            }
        }
    }
}

/// Releases a peer's held failures when the link ends.
struct VouchOnDrop<'a>(&'a Peer);

impl Drop for VouchOnDrop<'_> {
    fn drop(&mut self) {
        self.0.vouch_alive();
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
