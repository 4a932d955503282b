//! The client side of the control plane: fetching a peer's segment descriptor, and the
//! per-peer link that keeps heartbeats going, declares the peer lost when it falls silent
//! or its connection breaks, and reconnects with backoff (refetching the descriptor when
//! the peer's engine id changed, i.e. it restarted).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::net::{connect, read_frame, write_frame};
use crate::segment::{Peer, SegmentDescriptor};
use crate::wire::{ConnKind, Header, Op};

/// First reconnect delay after a lost link.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest reconnect delay.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Asks an open control connection for the descriptor.
async fn request_descriptor(stream: &mut TcpStream) -> Result<SegmentDescriptor> {
    let mut req = Header::new(Op::GetDescriptor);
    req.request_id = 1;
    write_frame(stream, &req, &[]).await?;
    loop {
        match read_frame(stream).await? {
            Some((h, body)) if h.op == Op::Descriptor => {
                return serde_json::from_slice(&body)
                    .map_err(|e| Error::Protocol(format!("bad descriptor: {e}")));
            }
            Some((h, _)) if h.op == Op::Pong => continue,
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
    let (mut stream, _) = connect(addr, ConnKind::Control, local_engine_id, timeout).await?;
    let desc = tokio::time::timeout(timeout, request_descriptor(&mut stream))
        .await
        .map_err(|_| Error::Connect {
            peer: addr.to_string(),
            reason: "descriptor fetch timed out".into(),
        })??;
    let _ = stream.shutdown().await;
    Ok(desc)
}

/// Sends one transport control request (`TransportReq`, e.g. an RDMA endpoint handshake) to
/// the engine at `addr` and returns its answer.
pub async fn transport_request(
    addr: &str,
    local_engine_id: u64,
    kind: crate::transport::TransportKind,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let exchange = async {
        let (mut stream, _) = connect(addr, ConnKind::Control, local_engine_id, timeout).await?;
        let mut req = Header::new(Op::TransportReq);
        req.request_id = 1;
        req.buffer_id = kind as u64;
        req.length = payload.len() as u64;
        write_frame(&mut stream, &req, payload).await?;
        loop {
            match read_frame(&mut stream).await? {
                Some((h, body)) if h.op == Op::TransportResp => {
                    let _ = stream.shutdown().await;
                    return Ok(body);
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
    fn peer_lost(&self, peer: &Arc<Peer>, reason: String);
    /// The peer answered again after being lost.
    fn peer_back(&self, peer: &Arc<Peer>);
}

/// Settings of a link.
#[derive(Clone, Copy)]
pub(crate) struct LinkConfig {
    pub local_engine_id: u64,
    pub peer_timeout: Duration,
}

/// Keeps the control link to `peer` alive until `peer.link_cancel` fires.
pub(crate) async fn run_link(peer: Arc<Peer>, cfg: LinkConfig, events: Arc<dyn LinkEvents>) {
    let cancel = peer.link_cancel.clone();
    let mut backoff = BACKOFF_START;
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            r = link_once(&peer, cfg, &events, &mut backoff) => r,
        };
        if cancel.is_cancelled() {
            return;
        }
        if !peer.is_lost() {
            tracing::warn!(peer = peer.name(), reason = %outcome, "peer lost");
            events.peer_lost(&peer, outcome);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One connection's life; returns why it ended.
async fn link_once(
    peer: &Arc<Peer>,
    cfg: LinkConfig,
    events: &Arc<dyn LinkEvents>,
    backoff: &mut Duration,
) -> String {
    let addr = peer.addr();
    let (mut stream, remote_id) = match connect(
        &addr,
        ConnKind::Control,
        cfg.local_engine_id,
        cfg.peer_timeout,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    if remote_id != peer.descriptor().engine_id {
        match tokio::time::timeout(cfg.peer_timeout, request_descriptor(&mut stream)).await {
            Ok(Ok(desc)) => {
                tracing::info!(peer = peer.name(), "peer restarted: descriptor refreshed");
                peer.set_descriptor(desc);
            }
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return "descriptor refresh timed out".into(),
        }
    }
    if peer.is_lost() {
        tracing::info!(peer = peer.name(), "peer reachable again");
        events.peer_back(peer);
    }
    *backoff = BACKOFF_START;
    heartbeat(&mut stream, cfg.peer_timeout).await
}

/// Sends pings and waits for answers; returns when the peer is silent for `timeout` or the
/// connection breaks.
async fn heartbeat(stream: &mut TcpStream, timeout: Duration) -> String {
    let interval = (timeout / 4).max(Duration::from_millis(20));
    let (mut rd, mut wr) = stream.split();
    let pinger = async {
        let mut seq = 0u64;
        loop {
            seq += 1;
            let mut ping = Header::new(Op::Ping);
            ping.request_id = seq;
            if let Err(e) = write_frame(&mut wr, &ping, &[]).await {
                return format!("heartbeat write failed: {e}");
            }
            tokio::time::sleep(interval).await;
        }
    };
    // Each frame heard restarts the silence deadline. A timeout drops a half-read frame,
    // which is fine: the connection is abandoned right after.
    let watcher = async {
        loop {
            match tokio::time::timeout_at(Instant::now() + timeout, read_frame(&mut rd)).await {
                Err(_) => return format!("no heartbeat answer for {} ms", timeout.as_millis()),
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return "control connection closed by peer".into(),
                Ok(Err(e)) => return format!("control connection failed: {e}"),
            }
        }
    };
    tokio::select! {
        r = pinger => r,
        r = watcher => r,
    }
}
