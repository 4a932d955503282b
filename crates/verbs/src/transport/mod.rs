//! The RDMA transport: RC queue pairs per peer set up through the control plane, one-sided
//! WRITE and READ sliced into work requests spread over the queue pairs, completion queues
//! polled by one thread with adaptive backoff, endpoint reset on errors and deadlines, and
//! failover through the engine.
//!
//! Life of a slice: `submit` posts it (or queues it behind `max_outstanding`) with the
//! slot index as work request id; the poller takes its completion, reports the slice to the
//! task, and posts from the backlog. The first slice of an attempt's share for an endpoint
//! tells the task as it is posted, so the attempt deadline runs from there, not while the
//! slices wait in the backlog. A failed completion, a slice past `slice_timeout` (or past
//! the attempt deadline, if that is shorter: what bounds the backlog's wait) or a failed
//! post moves the queue pair to ERR, fails every slice on that endpoint at once
//! (the engine fails them over), and reconnects the endpoint in the background with
//! backoff. A peer declared lost by the control plane fails its slices at once.
//!
//! Decisions and bookkeeping make no verbs call and are tested alone: `published` (what
//! descriptors carry), `passive` (the target side's queue pairs, capped, and released once
//! their initiator engine has gone), `gid`, `config`, and the choices at the bottom of
//! `device` and `submit`; `peer_link` holds the state towards one peer. The shells make the
//! verbs calls: `device` (opening devices, making queue pairs), `submit` and `endpoint`
//! (posting; `endpoint` also keeps the table of posted slices), `poller` (completions and
//! deadlines), `links` and `handshake` (connection setup, reset, reconnect), and `verify`
//! (a verified attempt's end-to-end check, a control message after its completions).

mod config;
mod device;
mod endpoint;
mod gid;
mod handshake;
mod links;
mod passive;
mod peer_link;
mod poller;
mod published;
mod submit;
mod verify;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use ferry_core::memory::{Access, Region, RegionId};
use ferry_core::segment::Peer;
use ferry_core::transport::{
    AnsweredHook, Attempt, BoxFuture, ControlPeers, Transport, TransportContext, TransportFactory,
};
use ferry_core::{Error, Result, TransportKind};

pub use config::{ProviderChoice, RdmaConfig};
pub use gid::{choose_gid_index, gid_hex, parse_gid, GidEntry};

use device::Device;
use passive::Passive;
use peer_link::PeerLink;
use published::{PeerDevice, PeerInfo, RemoteMr};

use crate::provider::{access, CompletionQueue, MemoryRegion, Provider, QueuePair};

/// Builds the RDMA transport for an engine.
#[derive(Debug, Clone, Default)]
pub struct RdmaFactory {
    /// Settings.
    pub config: RdmaConfig,
}

impl TransportFactory for RdmaFactory {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>> {
        RdmaTransport::open(self.config.clone(), context)
            .map(|t| Arc::new(t) as Arc<dyn Transport>)
            .map_err(Error::TransportUnavailable)
    }
}

/// A local region registered on every device.
pub(crate) struct LocalMr {
    region: Arc<Region>,
    /// One registration per device, in device order.
    mrs: Vec<Arc<dyn MemoryRegion>>,
}

/// A queue pair created for a peer's handshake (the target side of a connection).
struct PassiveQp {
    _qp: Arc<dyn QueuePair>,
    _cq: Arc<dyn CompletionQueue>,
}

struct Shared {
    config: RdmaConfig,
    /// The engine's attempt deadline (`TransportContext::attempt_timeout`).
    attempt_timeout: Option<std::time::Duration>,
    provider: Arc<dyn Provider>,
    engine_id: u64,
    handle: tokio::runtime::Handle,
    shutdown: tokio_util::sync::CancellationToken,
    devices: Vec<Device>,
    regions: RwLock<HashMap<RegionId, Arc<LocalMr>>>,
    peers: RwLock<HashMap<u64, Arc<PeerLink>>>,
    passive: Mutex<Passive<PassiveQp>>,
    /// Bumped whenever endpoints come or go, so the poller refreshes its list.
    generation: AtomicU64,
    control_peers: Arc<ControlPeers>,
    /// Hears which incarnation of a peer an endpoint handshake reached.
    answered: AnsweredHook,
    poller: OnceLock<std::thread::Thread>,
    stopping: AtomicBool,
}

/// The RDMA transport.
pub struct RdmaTransport {
    shared: Arc<Shared>,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl RdmaTransport {
    /// Opens the provider and the devices; the error says why RDMA cannot be used here.
    pub fn open(
        config: RdmaConfig,
        context: TransportContext,
    ) -> std::result::Result<Self, String> {
        config.validate()?;
        let provider = device::open_provider(&config)?;
        let devices = device::open_devices(provider.as_ref(), &config)?;
        let shared = Arc::new(Shared {
            config,
            attempt_timeout: context.attempt_timeout,
            provider,
            engine_id: context.engine_id,
            handle: context.handle,
            shutdown: context.shutdown,
            devices,
            regions: RwLock::default(),
            peers: RwLock::default(),
            passive: Mutex::default(),
            generation: AtomicU64::new(0),
            control_peers: context.control_peers,
            answered: context.answered,
            poller: OnceLock::new(),
            stopping: AtomicBool::new(false),
        });
        let poller_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-rdma-cq".into())
            .spawn(move || poller::run(poller_shared))
            .map_err(|e| format!("cannot start the completion thread: {e}"))?;
        let _ = shared.poller.set(thread.thread().clone());
        Ok(Self {
            shared,
            poller: Mutex::new(Some(thread)),
        })
    }

    /// Queue pairs held for peers' connections (the target side), for tests.
    #[doc(hidden)]
    pub fn passive_endpoints(&self) -> usize {
        self.shared
            .passive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Name of the provider in use (`ibverbs` or `emulated`).
    pub fn provider_name(&self) -> &'static str {
        self.shared.provider.name()
    }
}

impl Shared {
    /// Releases the target side of connections whose initiator engine has held no control
    /// connection here for `passive_grace` (it closed the segment or died).
    fn release_orphans(&self, now: Instant) {
        let released = self
            .passive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release_orphans(now, self.config.passive_grace, |engine| {
                self.control_peers.is_connected(engine)
            });
        if released > 0 {
            tracing::debug!(released, "rdma: released queue pairs of departed peers");
        }
    }

    fn wake_poller(&self) {
        if let Some(t) = self.poller.get() {
            t.unpark();
        }
    }

    fn link(&self, peer: u64) -> Option<Arc<PeerLink>> {
        self.peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .cloned()
    }
}

impl Transport for RdmaTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    /// The first slice of each endpoint's share reports its attempt moving as it is
    /// posted; the backlog behind a stuck endpoint is bounded by the poller's slice
    /// deadline, which never exceeds the attempt deadline (`poller::stuck_after`).
    fn reports_starts(&self) -> bool {
        true
    }

    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>> {
        if self.shared.stopping.load(Ordering::Acquire) {
            return attempts.iter().map(|_| Err(Error::Closed)).collect();
        }
        attempts.iter().map(|a| self.shared.submit_one(a)).collect()
    }

    fn fail_peer(&self, peer: &Peer, error: Error) {
        if let Some(link) = self.shared.link(peer.handle()) {
            let why = error.to_string();
            self.shared.fail_link(&link, &why, || error.clone());
        }
    }

    fn forget_peer(&self, peer: &Peer, error: Error) {
        let link = self
            .shared
            .peers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer.handle());
        if let Some(link) = link {
            link.forgotten.store(true, Ordering::Release);
            let why = error.to_string();
            self.shared.fail_link(&link, &why, || error.clone());
        }
    }

    fn shutdown(&self) {
        if self.shared.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        let links: Vec<Arc<PeerLink>> = self
            .shared
            .peers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, l)| l)
            .collect();
        for link in links {
            link.forgotten.store(true, Ordering::Release);
            self.shared
                .fail_link(&link, "engine closed", || Error::Closed);
        }
        self.shared.wake_poller();
        let thread = self.poller.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        self.shared
            .passive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.shared
            .regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn reachable(&self, peer: &Peer) -> std::result::Result<(), String> {
        let Some(link) = self.shared.link(peer.handle()) else {
            return Err("no rdma endpoint to this peer (it publishes no rdma device, or the handshake failed)".into());
        };
        if !link.has_live() {
            return Err(format!(
                "no connected rdma endpoint: {}",
                link.down_reason()
            ));
        }
        Ok(())
    }

    fn attach(&self, peer: &Arc<Peer>) -> Option<BoxFuture<Result<()>>> {
        if self.shared.stopping.load(Ordering::Acquire) {
            return None;
        }
        Some(Box::pin(self.shared.clone().attach(peer.clone())))
    }

    fn region_added(&self, region: &Arc<Region>) -> Result<()> {
        let mut flags = access::LOCAL_WRITE | access::REMOTE_READ;
        if region.access() == Access::ReadWrite {
            flags |= access::REMOTE_WRITE;
        }
        let mut mrs = Vec::with_capacity(self.shared.devices.len());
        for dev in &self.shared.devices {
            // SAFETY: the registration lives in a `LocalMr` that holds an `Arc` of the
            // region, so the memory stays mapped until the MR (and every slice using it,
            // which holds the `LocalMr`) is gone.
            let mr =
                unsafe { dev.pd.reg_mr(region.as_ptr(), region.len(), flags) }.map_err(|e| {
                    Error::TransportUnavailable(format!("rdma: reg_mr on {}: {e}", dev.name))
                })?;
            mrs.push(mr);
        }
        self.shared
            .regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                region.id(),
                Arc::new(LocalMr {
                    region: region.clone(),
                    mrs,
                }),
            );
        Ok(())
    }

    fn region_released(&self, id: RegionId) {
        self.shared
            .regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    fn serves(&self, region: &Region) -> bool {
        self.shared
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&region.id())
    }

    fn describe(&self) -> Option<serde_json::Value> {
        let info = PeerInfo {
            provider: self.shared.provider.name().to_string(),
            devices: self
                .shared
                .devices
                .iter()
                .map(|d| PeerDevice {
                    name: d.name.clone(),
                    gid: gid_hex(&d.gid),
                    lid: d.lid,
                    mtu: d.mtu,
                })
                .collect(),
        };
        serde_json::to_value(info).ok()
    }

    fn describe_buffer(&self, region: &Region) -> Option<serde_json::Value> {
        let regions = self
            .shared
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let local = regions.get(&region.id())?;
        serde_json::to_value(RemoteMr {
            addr: local.region.as_ptr() as u64,
            rkeys: local.mrs.iter().map(|m| m.rkey()).collect(),
        })
        .ok()
    }

    fn control(&self, request: &[u8]) -> Result<Vec<u8>> {
        if self.shared.stopping.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        match verify::parse_check(request) {
            Some(check) => self.shared.answer_check(&check),
            None => self.shared.accept(request),
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}
