//! The state towards one opened peer: its endpoints, what it publishes, the registrations
//! of its buffers already read, which endpoints are being connected, and why none is up.
//! Bookkeeping only: connecting, resetting and failing a link are in `links`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use ferry_core::segment::{Peer, SegmentDescriptor};

use super::endpoint::Endpoint;
use super::published::{PeerInfo, RemoteMr};

/// The state towards one opened peer.
pub(super) struct PeerLink {
    pub(super) peer: Arc<Peer>,
    /// The peer engine the endpoints were set up with.
    pub(super) engine_id: AtomicU64,
    pub(super) info: RwLock<Option<PeerInfo>>,
    pub(super) endpoints: RwLock<Vec<Arc<Endpoint>>>,
    pub(super) buffers: RwLock<HashMap<u64, (u64, RemoteMr)>>,
    pub(super) connecting: Mutex<Vec<bool>>,
    pub(super) next: AtomicU64,
    pub(super) down: Mutex<Option<String>>,
    pub(super) forgotten: AtomicBool,
}

impl PeerLink {
    pub(super) fn live(&self) -> Vec<Arc<Endpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|e| !e.is_broken())
            .cloned()
            .collect()
    }

    /// Whether any endpoint is up (asked for every request: no allocation).
    pub(super) fn has_live(&self) -> bool {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|e| !e.is_broken())
    }

    /// Why no endpoint is up ("connecting" while the first handshake runs).
    pub(super) fn down_reason(&self) -> String {
        self.down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "connecting".into())
    }

    /// Whether endpoint `slot` is up.
    pub(super) fn slot_is_up(&self, slot: u32) -> bool {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|e| e.slot == slot && !e.is_broken())
    }

    /// Puts `ep` in its slot; returns the endpoints it replaces there, for the caller to
    /// break: dropped silently, their posted slices would never end.
    pub(super) fn install(&self, ep: Arc<Endpoint>) -> Vec<Arc<Endpoint>> {
        let mut eps = self.endpoints.write().unwrap_or_else(|p| p.into_inner());
        let (replaced, kept) = std::mem::take(&mut *eps)
            .into_iter()
            .partition(|e| e.slot == ep.slot);
        *eps = kept;
        eps.push(ep);
        replaced
    }

    pub(super) fn remove(&self, ep: &Arc<Endpoint>) -> bool {
        let mut eps = self.endpoints.write().unwrap_or_else(|p| p.into_inner());
        let before = eps.len();
        eps.retain(|e| !Arc::ptr_eq(e, ep));
        before != eps.len()
    }

    /// The peer's registration of `buffer` as the request's descriptor states it.
    pub(super) fn remote_mr(&self, desc: &SegmentDescriptor, buffer: u64) -> Option<RemoteMr> {
        if let Some((engine, mr)) = self
            .buffers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&buffer)
        {
            if *engine == desc.engine_id {
                return Some(mr.clone());
            }
        }
        let mr = RemoteMr::published(desc, buffer)?;
        self.buffers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(buffer, (desc.engine_id, mr.clone()));
        Some(mr)
    }
}
