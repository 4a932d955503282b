//! The engine's peers: opening a segment (descriptor, link, transports set up), the path
//! each transport has to it, closing it, and carrying out its loss and recovery.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::control::{open_control, run_link, LinkConfig, LinkEvents};
use crate::engine::SegmentInfo;
use crate::error::{Error, Result};
use crate::events::EngineEvent;
use crate::inner::Inner;
use crate::kind::TransportKind;
use crate::liveness::LossReason;
use crate::metadata::Registry;
use crate::plan::Path;
use crate::segment::{Peer, SegmentDescriptor};

impl Inner {
    /// Opens (or refreshes) a remote segment by name.
    pub(crate) async fn open_segment(self: &Arc<Self>, name: &str) -> Result<SegmentInfo> {
        self.check_open()?;
        let (addr, revision) = match &self.metadata {
            Some(m) => self.resolve(m, name).await?,
            None if name.is_empty() || !name.contains(':') => {
                return Err(Error::InvalidArgument(format!(
                    "segment name must be host:port, got {name:?}"
                )))
            }
            None => (name.to_string(), None),
        };
        let timeout = self.config.tcp.connect_timeout;
        // The connection the descriptor comes on is the new link's first.
        let (desc, first) = open_control(&addr, self.engine_id, timeout).await?;
        self.check_open()?;
        let (peer, fresh) = self.segments.insert_with(name, |handle| {
            let peer = Peer::new(
                handle,
                name.to_string(),
                desc.clone(),
                self.shutdown.child_token(),
            )
            .with_series(self.stats.peers.series(name));
            peer.set_addr(&addr);
            peer
        });
        if fresh {
            let cfg = LinkConfig {
                local_engine_id: self.engine_id,
                peer_timeout: self.config.peer_timeout,
            };
            let events: Arc<dyn LinkEvents> = Arc::new(Events(Arc::downgrade(self)));
            if let (Some(m), Some(rev)) = (&self.metadata, revision) {
                let _guard = self.handle.enter();
                m.watch(peer.clone(), events.clone(), rev, self.engine_id);
            }
            self.handle
                .spawn(run_link(peer.clone(), cfg, events, Some(first)));
        } else {
            // Open again: the name may now answer with a new incarnation.
            self.descriptor_seen(&peer, desc);
        }
        self.attach_transports(&peer).await;
        Ok(SegmentInfo::of(&peer))
    }

    /// The control address of segment `name` with etcd metadata, and the revision to watch
    /// its record from (`None` when the segment is already open and watched).
    async fn resolve(&self, m: &Registry, name: &str) -> Result<(String, Option<i64>)> {
        if let Some(peer) = self.segments.by_name(name) {
            return Ok((peer.addr(), None));
        }
        let (record, revision) = m.resolve(name).await?;
        Ok((record.addr, Some(revision)))
    }

    /// Closes a segment: its link stops and its in-flight work fails as a closed segment
    /// (`SegmentClosed`), which is no loss of the peer.
    pub(crate) fn close_segment(&self, handle: u64) -> Result<()> {
        self.check_open()?;
        let peer = self.segments.remove(handle)?;
        // First: whatever fails from here on (a copy, a held failure) sees it closed.
        peer.mark_closed();
        peer.link_cancel.cancel();
        let error = peer.closed_error();
        for (_, t) in &self.transports {
            t.forget_peer(&peer, error.clone());
        }
        Ok(())
    }

    /// The path `kind` has to `peer` from here.
    pub(crate) fn path(&self, kind: TransportKind, peer: &Peer) -> Path<'_> {
        let Some(t) = self.transport(kind) else {
            // Worded once, at start (this runs for every request).
            return Path::NotEnabled(
                self.not_enabled
                    .iter()
                    .find_map(|(k, why)| (*k == kind).then(|| Cow::Borrowed(&**why)))
                    .unwrap_or_else(|| format!("{kind} is not enabled on this engine").into()),
            );
        };
        match t.reachable(peer) {
            Ok(()) => Path::Usable,
            Err(why) => match t.setup_limit(peer) {
                Some(limit) => Path::Exhausted(limit.into()),
                None => Path::Unreachable(why.into()),
            },
        }
    }

    /// Declares `peer` lost: the event first, then every transport fails its in-flight
    /// work towards it at once.
    pub(crate) fn declare_lost(&self, peer: &Arc<Peer>, reason: LossReason) {
        if !peer.mark_lost(&reason) {
            return;
        }
        self.stats.peers_lost.fetch_add(1, Ordering::Relaxed);
        // The event goes first, so that listeners learn of the loss before the failures.
        self.emit(EngineEvent::PeerLost {
            segment: peer.name().to_string(),
            reason,
        });
        peer.loss_announced();
        for (_, t) in &self.transports {
            t.fail_peer(peer, peer.lost_error());
        }
    }

    /// `peer` answers (again): it is no longer lost, its transports are set up again
    /// (idempotent: a second notice finds them set up), and a recovery is reported once.
    pub(crate) fn recover(self: &Arc<Self>, peer: &Arc<Peer>) {
        let was_lost = peer.mark_alive();
        let (engine, p) = (self.clone(), peer.clone());
        self.handle
            .spawn(async move { engine.attach_transports(&p).await });
        if was_lost {
            self.stats.peers_recovered.fetch_add(1, Ordering::Relaxed);
            self.emit(EngineEvent::PeerRecovered {
                segment: peer.name().to_string(),
            });
        }
    }

    /// Sets up every transport towards `peer` (shm maps its buffers, rdma connects queue
    /// pairs); a failure only leaves that transport unable to reach the peer.
    pub(crate) async fn attach_transports(&self, peer: &Arc<Peer>) {
        let pending: Vec<_> = self
            .transports
            .iter()
            .filter_map(|(k, t)| Some((*k, t.attach(peer)?)))
            .collect();
        for (kind, fut) in pending {
            if let Err(e) = fut.await {
                tracing::info!(peer = peer.name(), transport = kind.name(), error = %e, "transport cannot reach this peer");
            }
        }
    }
}

/// Routes link events to the engine without keeping it alive.
struct Events(Weak<Inner>);

impl LinkEvents for Events {
    fn peer_lost(&self, peer: &Arc<Peer>, reason: LossReason) {
        if let Some(inner) = self.0.upgrade() {
            inner.declare_lost(peer, reason);
        }
    }

    fn peer_back(&self, peer: &Arc<Peer>) {
        match self.0.upgrade() {
            Some(inner) => inner.recover(peer),
            None => {
                peer.mark_alive();
            }
        }
    }

    fn descriptor_seen(&self, peer: &Arc<Peer>, desc: SegmentDescriptor) {
        match self.0.upgrade() {
            Some(inner) => {
                inner.descriptor_seen(peer, desc);
            }
            None => peer.set_descriptor(desc),
        }
    }
}
