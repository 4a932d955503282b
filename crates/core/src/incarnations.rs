//! A peer's incarnations: each engine start draws an engine id, which the handshake and the
//! descriptor carry. A segment handle follows its name from one incarnation to the next:
//! whoever fetches the peer's descriptor (the link on reconnect, an open, the etcd watch, a
//! request naming a buffer the handle does not know yet) hands it here, and a new engine
//! id ends the old incarnation — its loss is `restarted`, everything planned against it
//! fails — before the new descriptor takes its place. Requests name a buffer by its id in
//! the peer, which is the order in which the peer allocated or registered it, so a peer
//! that allocates the same buffers in the same order after a restart serves them under the
//! same ids; the transports check that each request reaches the incarnation it was planned
//! against, so no byte planned for one lands in another.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::control::fetch_descriptor;
use crate::error::Result;
use crate::inner::Inner;
use crate::liveness::LossReason;
use crate::segment::{Peer, SegmentDescriptor};

/// What a fetched descriptor says about the peer, against the one known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The same incarnation, with the same buffers.
    Same,
    /// The same incarnation; its buffers changed (allocated or released since).
    Updated,
    /// Another incarnation: the peer restarted.
    Restarted,
}

/// Compares a fetched descriptor with the one known.
pub(crate) fn compare(known: &SegmentDescriptor, fresh: &SegmentDescriptor) -> Seen {
    if known.engine_id != fresh.engine_id {
        Seen::Restarted
    } else if known != fresh {
        Seen::Updated
    } else {
        Seen::Same
    }
}

impl Inner {
    /// `fresh` was just fetched from `peer`'s address, which proves that incarnation
    /// alive. A new incarnation ends the old one (lost, `restarted`: its in-flight work
    /// fails), takes its place, tells the link to leave a connection to the old one, and is
    /// set up (transports attached, the peer recovered). Returns what it saw.
    pub(crate) fn descriptor_seen(
        self: &Arc<Self>,
        peer: &Arc<Peer>,
        fresh: SegmentDescriptor,
    ) -> Seen {
        let seen = compare(&peer.descriptor(), &fresh);
        match seen {
            Seen::Same => {}
            Seen::Updated => peer.set_descriptor(fresh),
            Seen::Restarted => {
                let engine_id = fresh.engine_id;
                tracing::info!(peer = peer.name(), new = %format!("{engine_id:016x}"), "a new incarnation of the peer");
                // A peer already lost (it crashed, then came back) keeps that loss.
                self.declare_lost(peer, LossReason::Restarted { engine_id });
                peer.set_descriptor(fresh);
                peer.relink.notify_one();
                self.recover(peer);
            }
        }
        seen
    }

    /// Fetches `peer`'s descriptor now and sets up what it changed (a new incarnation, or
    /// buffers allocated since), transports included.
    pub(crate) async fn refresh(self: &Arc<Self>, peer: &Arc<Peer>) -> Result<()> {
        let timeout = self.config.tcp.connect_timeout;
        let fresh = fetch_descriptor(&peer.addr(), self.engine_id, timeout).await?;
        if self.descriptor_seen(peer, fresh) != Seen::Same {
            self.attach_transports(peer).await;
        }
        Ok(())
    }

    /// A transport's connection to `peer` was answered by engine `engine_id`. When that is
    /// not the incarnation known (the peer restarted, and a data connection reconnected
    /// before the link or the etcd watch noticed), the descriptor is fetched in the
    /// background and goes through [`Inner::descriptor_seen`]: the old incarnation is lost
    /// (`restarted`) once, whoever else notices, and the next request goes to the new one.
    /// If the fetch fails the old incarnation is still gone — another engine answered at
    /// its address, past the handshake — so it is lost all the same, and the link finds the
    /// new one when it reconnects.
    pub(crate) fn incarnation_answered(self: &Arc<Self>, peer: &Arc<Peer>, engine_id: u64) {
        if engine_id == peer.engine_id() || peer.is_closed() || self.is_closed() {
            return;
        }
        if peer.fetching_new.swap(true, Ordering::AcqRel) {
            return;
        }
        let (inner, peer) = (self.clone(), peer.clone());
        self.handle.spawn(async move {
            if let Err(e) = inner.refresh(&peer).await {
                tracing::info!(peer = peer.name(), error = %e, "a new incarnation answered, its descriptor did not come");
                if peer.engine_id() != engine_id && !peer.is_closed() {
                    inner.declare_lost(&peer, LossReason::Restarted { engine_id });
                }
            }
            peer.fetching_new.store(false, Ordering::Release);
        });
    }

    /// A request named a buffer that segment `name`'s descriptor does not list: fetches
    /// the descriptor again (the peer may have allocated it since, or restarted and
    /// allocated it again), waiting at most the connect timeout. Returns whether it was
    /// fetched, i.e. whether checking the request again may now find the buffer. Not for a
    /// lost or closed peer; and not on a runtime's thread, which must not block: there the
    /// fetch runs in the background, for the next request.
    pub(crate) fn refresh_on_miss(self: &Arc<Self>, name: &str) -> bool {
        let Some(peer) = self.segments.by_name(name) else {
            return false;
        };
        if peer.is_lost() || peer.is_closed() || self.is_closed() {
            return false;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let inner = self.clone();
        self.handle.spawn(async move {
            let fetched = inner.refresh(&peer).await;
            if let Err(e) = &fetched {
                tracing::debug!(peer = peer.name(), error = %e, "descriptor fetch on a miss failed");
            }
            let _ = tx.send(fetched.is_ok());
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            return false;
        }
        let bound = self.config.tcp.connect_timeout + MISS_ATTACH_GRACE;
        rx.recv_timeout(bound).unwrap_or(false)
    }
}

/// Time a fetch on a miss may take beyond the connect timeout: what setting up the new
/// buffer takes (shm maps it).
const MISS_ATTACH_GRACE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::tests::sample_descriptor;
    use crate::segment::BufferDescriptor;

    #[test]
    fn a_descriptor_is_the_same_updated_or_of_another_incarnation() {
        let known = sample_descriptor();
        assert_eq!(compare(&known, &known.clone()), Seen::Same);
        let mut more = known.clone();
        more.buffers.push(BufferDescriptor {
            id: 0,
            length: 4096,
            access: crate::memory::Access::ReadWrite,
            transports: Vec::new(),
            transport_info: Default::default(),
        });
        assert_eq!(compare(&known, &more), Seen::Updated);
        let mut restarted = more.clone();
        restarted.engine_id += 1;
        assert_eq!(compare(&known, &restarted), Seen::Restarted);
        assert_eq!(
            compare(&more, &restarted),
            Seen::Restarted,
            "the same buffers in a new incarnation are new buffers"
        );
    }
}
