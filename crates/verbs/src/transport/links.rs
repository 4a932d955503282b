//! The links to peers: connecting endpoints (the initiator's side of the handshake),
//! resetting and reconnecting them, attaching a peer, failing a link, and accepting a
//! peer's endpoint (the target's side).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ferry_core::control::transport_request;
use ferry_core::segment::Peer;
use ferry_core::{Error, Result, TransportKind};

use super::endpoint::Endpoint;
use super::handshake::{self, ConnectRequest, EndpointInfo};
use super::parse_gid;
use super::peer_link::PeerLink;
use super::published::PeerInfo;
use super::{PassiveQp, Shared};
use crate::provider::VerbsError;

impl Shared {
    /// Moves the endpoint's QP to ERR, fails every slice on it with `error()`, forgets it
    /// and reconnects it in the background.
    pub(super) fn reset_endpoint(
        self: &Arc<Self>,
        link: &Arc<PeerLink>,
        ep: &Arc<Endpoint>,
        why: &str,
        error: impl Fn() -> Error,
    ) {
        let _ = handshake::to_error(ep.qp.as_ref());
        let failed = ep.break_all(why);
        let removed = link.remove(ep);
        if removed {
            tracing::info!(
                peer = link.peer.name(),
                endpoint = ep.slot,
                reason = why,
                "rdma endpoint reset"
            );
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        for (task, attempt) in failed {
            task.attempt_failed(attempt, error());
        }
        if removed && !link.peer.is_lost() {
            self.reconnect(link.clone(), ep.slot);
        }
    }

    /// Reconnects endpoint `slot` with backoff until it works, the peer is lost or
    /// forgotten, or the engine closes.
    pub(super) fn reconnect(self: &Arc<Self>, link: Arc<PeerLink>, slot: u32) {
        let shared = self.clone();
        self.handle.spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                if link.forgotten.load(Ordering::Acquire) || link.peer.is_lost() {
                    return;
                }
                match shared.connect_endpoint(&link, slot).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(peer = link.peer.name(), slot, error = %e, "rdma reconnect failed");
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
    }

    /// Creates a queue pair, does the handshake and brings it to RTS, unless endpoint
    /// `slot` is up already or being connected.
    ///
    /// Several paths ask for the same slot (the reconnect after a reset, and an attach when
    /// that reconnect found a new incarnation of the peer); a second handshake for a slot
    /// that is up would replace an endpoint that may carry slices.
    pub(super) async fn connect_endpoint(
        self: &Arc<Self>,
        link: &Arc<PeerLink>,
        slot: u32,
    ) -> Result<()> {
        {
            let mut c = link.connecting.lock().unwrap_or_else(|p| p.into_inner());
            let Some(flag) = c.get_mut(slot as usize) else {
                return Ok(());
            };
            if *flag || link.slot_is_up(slot) {
                return Ok(());
            }
            *flag = true;
        }
        let result = self.connect_endpoint_inner(link, slot).await;
        if let Some(flag) = link
            .connecting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(slot as usize)
        {
            *flag = false;
        }
        result
    }

    async fn connect_endpoint_inner(
        self: &Arc<Self>,
        link: &Arc<PeerLink>,
        slot: u32,
    ) -> Result<()> {
        let verbs = |e: VerbsError| Error::TransportUnavailable(format!("rdma: {e}"));
        let remote_devices = link
            .info
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|i| i.devices.clone())
            .unwrap_or_default();
        if remote_devices.is_empty() {
            return Err(Error::TransportUnavailable(
                "rdma: the peer publishes no device".into(),
            ));
        }
        let local_dev = slot as usize % self.devices.len();
        let remote_dev = slot as usize % remote_devices.len();
        let dev = &self.devices[local_dev];
        let (qp, cq, local) = self
            .new_queue_pair(dev, self.config.max_outstanding)
            .map_err(verbs)?;
        let b = self.bringup(dev);
        let request = ConnectRequest {
            engine_id: self.engine_id,
            slot,
            device: remote_dev,
            endpoint: local.clone(),
        };
        let body = serde_json::to_vec(&request)
            .map_err(|e| Error::Protocol(format!("encode handshake: {e}")))?;
        // The control address, not the segment name: the two differ in cluster mode
        // (a logical name from etcd), and the address moves when the peer restarts.
        let (reply, answered) = transport_request(
            &link.peer.addr(),
            self.engine_id,
            TransportKind::Rdma,
            &body,
            self.config.connect_timeout,
        )
        .await?;
        // Another incarnation answered (the peer restarted, and this reconnect saw it
        // first): a queue pair to it would carry requests planned, rkeys and all, for the
        // one gone. The engine moves the segment to the new incarnation, whose attach
        // sets the endpoints up again.
        if answered != link.engine_id.load(Ordering::Acquire) {
            (self.answered)(&link.peer, answered);
            return Err(Error::TransportUnavailable(format!(
                "rdma: {} answered as another incarnation ({answered:016x})",
                link.peer.name()
            )));
        }
        let remote: EndpointInfo = serde_json::from_slice(&reply)
            .map_err(|e| Error::Protocol(format!("bad rdma handshake reply: {e}")))?;
        let remote_gid = parse_gid(&remote.gid)
            .ok_or_else(|| Error::Protocol(format!("bad gid {:?} in handshake", remote.gid)))?;
        handshake::connect(qp.as_ref(), b, &local, &remote, remote_gid).map_err(verbs)?;
        if self.stopping.load(Ordering::Acquire) || link.forgotten.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let ep = Arc::new(Endpoint::new(
            slot,
            local_dev,
            remote_dev,
            qp,
            cq,
            self.config.max_outstanding,
        ));
        let replaced = link.install(ep);
        *link.down.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake_poller();
        // A broken endpoint of the slot, normally; one still up only if a connect raced
        // past the check above. Its slices would wait on a queue pair nobody polls any
        // more: they fail now and are retried.
        break_endpoints(&replaced, "replaced by a new connection", || {
            Error::Io(format!(
                "rdma: endpoint {slot} to {} was replaced",
                link.peer.name()
            ))
        });
        tracing::debug!(
            peer = link.peer.name(),
            slot,
            qpn = local.qpn,
            remote_qpn = remote.qpn,
            "rdma endpoint up"
        );
        Ok(())
    }

    pub(super) async fn attach(self: Arc<Self>, peer: Arc<Peer>) -> Result<()> {
        let desc = peer.descriptor();
        let info = PeerInfo::published(&desc).ok_or_else(|| {
            Error::TransportUnavailable(format!("rdma: {} publishes no rdma device", peer.name()))
        })?;
        if info.provider != self.provider.name() {
            return Err(Error::TransportUnavailable(format!(
                "rdma: {} uses the {} provider, this engine {}",
                peer.name(),
                info.provider,
                self.provider.name()
            )));
        }
        let link = {
            let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
            peers
                .entry(peer.handle())
                .or_insert_with(|| {
                    Arc::new(PeerLink {
                        peer: peer.clone(),
                        engine_id: AtomicU64::new(desc.engine_id),
                        info: RwLock::new(None),
                        endpoints: RwLock::default(),
                        buffers: RwLock::default(),
                        connecting: Mutex::new(vec![false; self.config.qps_per_peer]),
                        next: AtomicU64::new(0),
                        down: Mutex::new(None),
                        forgotten: AtomicBool::new(false),
                    })
                })
                .clone()
        };
        *link.info.write().unwrap_or_else(|p| p.into_inner()) = Some(info);
        link.buffers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if link.engine_id.swap(desc.engine_id, Ordering::AcqRel) != desc.engine_id {
            // The peer restarted: the old queue pairs talk to a process that is gone.
            self.fail_link(&link, "peer restarted", || {
                Error::Io("rdma: the peer restarted".into())
            });
        }
        let have: Vec<u32> = link.live().iter().map(|e| e.slot).collect();
        let mut first_error = None;
        for slot in 0..self.config.qps_per_peer as u32 {
            if have.contains(&slot) {
                continue;
            }
            if let Err(e) = self.connect_endpoint(&link, slot).await {
                *link.down.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                first_error.get_or_insert(e);
            }
        }
        match (first_error, !link.has_live()) {
            (Some(e), true) => Err(e),
            _ => Ok(()),
        }
    }

    /// Fails every slice towards `link`'s peer and drops its endpoints.
    pub(super) fn fail_link(&self, link: &PeerLink, why: &str, error: impl Fn() -> Error) {
        let eps = std::mem::take(&mut *link.endpoints.write().unwrap_or_else(|p| p.into_inner()));
        *link.down.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
        if !eps.is_empty() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        break_endpoints(&eps, why, error);
    }

    /// Target side of the handshake.
    pub(super) fn accept(&self, request: &[u8]) -> Result<Vec<u8>> {
        let bad = |m: String| Error::Protocol(format!("rdma handshake: {m}"));
        let verbs = |e: VerbsError| bad(e.to_string());
        let req: ConnectRequest =
            serde_json::from_slice(request).map_err(|e| bad(format!("malformed: {e}")))?;
        let dev = self
            .devices
            .get(req.device)
            .ok_or_else(|| bad(format!("no device {}", req.device)))?;
        let remote_gid = parse_gid(&req.endpoint.gid)
            .ok_or_else(|| bad(format!("bad gid {:?}", req.endpoint.gid)))?;
        if self
            .passive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_full()
        {
            return Err(bad("too many connections".into()));
        }
        // The target side posts nothing: one send slot is all it needs.
        let (qp, cq, local) = self.new_queue_pair(dev, 1).map_err(verbs)?;
        let b = self.bringup(dev);
        handshake::connect(qp.as_ref(), b, &local, &req.endpoint, remote_gid).map_err(verbs)?;
        self.passive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req.engine_id, req.slot, PassiveQp { _qp: qp, _cq: cq });
        serde_json::to_vec(&local).map_err(|e| bad(format!("encode: {e}")))
    }
}

/// Moves each of `eps` (already out of their link) to ERR, breaks it and fails every slice
/// it held with `error()`, after all of them are broken.
fn break_endpoints(eps: &[Arc<Endpoint>], why: &str, error: impl Fn() -> Error) {
    let mut failed = Vec::new();
    for ep in eps {
        let _ = handshake::to_error(ep.qp.as_ref());
        failed.extend(ep.break_all(why));
    }
    for (task, attempt) in failed {
        task.attempt_failed(attempt, error());
    }
}
