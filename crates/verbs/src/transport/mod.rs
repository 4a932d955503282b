//! The RDMA transport: RC queue pairs per peer set up through the control plane, one-sided
//! WRITE and READ sliced into work requests spread over the queue pairs, completion queues
//! polled by one thread with adaptive backoff, endpoint reset on errors and deadlines, and
//! failover through the engine.
//!
//! Life of a slice: `submit` posts it (or queues it behind `max_outstanding`) with the
//! slot index as work request id; the poller takes its completion, reports the slice to the
//! task, and posts from the backlog. A failed completion, a slice past `slice_timeout` or a
//! failed post moves the queue pair to ERR, fails every slice on that endpoint at once
//! (the engine fails them over), and reconnects the endpoint in the background with
//! backoff. A peer declared lost by the control plane fails its slices at once.

mod config;
mod endpoint;
mod gid;
mod handshake;
mod links;
mod poller;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ferry_core::control::transport_request;
use ferry_core::memory::{Access, Region, RegionId};
use ferry_core::segment::{Peer, SegmentDescriptor};
use ferry_core::transport::{
    Attempt, BoxFuture, ControlPeers, Transport, TransportContext, TransportFactory,
};
use ferry_core::{Error, Opcode, Result, TransportKind};
use serde::{Deserialize, Serialize};

pub use config::{ProviderChoice, RdmaConfig};
pub use gid::{choose_gid_index, gid_hex, parse_gid, GidEntry};

use endpoint::{Endpoint, PushError, Work};
use handshake::{Bringup, ConnectRequest, EndpointInfo};

use crate::provider::{
    access, port_state, CompletionQueue, Context, Gid, MemoryRegion, ProtectionDomain, Provider,
    QpCaps, QueuePair, VerbsError, WrOpcode,
};

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

/// An opened device with its protection domain.
struct Device {
    name: String,
    ctx: Arc<dyn Context>,
    pd: Arc<dyn ProtectionDomain>,
    gid: Gid,
    gid_index: u32,
    lid: u16,
    mtu: u32,
}

/// A local region registered on every device.
pub(crate) struct LocalMr {
    region: Arc<Region>,
    /// One registration per device, in device order.
    mrs: Vec<Arc<dyn MemoryRegion>>,
}

/// What a peer publishes (`transport_info["rdma"]` of its descriptor).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PeerInfo {
    provider: String,
    devices: Vec<PeerDevice>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PeerDevice {
    name: String,
    gid: String,
    lid: u16,
    mtu: u32,
}

/// What a buffer publishes (`transport_info["rdma"]` of a buffer).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RemoteMr {
    addr: u64,
    /// One rkey per device of the peer, in its device order.
    rkeys: Vec<u32>,
}

/// A queue pair created for a peer's handshake (the target side of a connection).
struct PassiveQp {
    _qp: Arc<dyn QueuePair>,
    _cq: Arc<dyn CompletionQueue>,
    /// Since when the initiator engine has held no control connection to this engine.
    orphaned_since: Option<Instant>,
}

/// A queue pair in INIT, its completion queue, and what the peer needs to connect to it.
type NewQueuePair = (Arc<dyn QueuePair>, Arc<dyn CompletionQueue>, EndpointInfo);

/// Most passive queue pairs kept (a bound against peers that keep reconnecting).
const MAX_PASSIVE: usize = 4096;

/// The state towards one opened peer.
struct PeerLink {
    peer: Arc<Peer>,
    /// The peer engine the endpoints were set up with.
    engine_id: AtomicU64,
    info: RwLock<Option<PeerInfo>>,
    endpoints: RwLock<Vec<Arc<Endpoint>>>,
    buffers: RwLock<HashMap<u64, (u64, RemoteMr)>>,
    connecting: Mutex<Vec<bool>>,
    next: AtomicU64,
    down: Mutex<Option<String>>,
    forgotten: AtomicBool,
}

impl PeerLink {
    fn live(&self) -> Vec<Arc<Endpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|e| !e.is_broken())
            .cloned()
            .collect()
    }

    /// Whether any endpoint is up (asked for every request: no allocation).
    fn has_live(&self) -> bool {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|e| !e.is_broken())
    }

    /// Why no endpoint is up ("connecting" while the first handshake runs).
    fn down_reason(&self) -> String {
        self.down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "connecting".into())
    }

    fn remove(&self, ep: &Arc<Endpoint>) -> bool {
        let mut eps = self.endpoints.write().unwrap_or_else(|p| p.into_inner());
        let before = eps.len();
        eps.retain(|e| !Arc::ptr_eq(e, ep));
        before != eps.len()
    }

    /// The peer's registration of `buffer` as the request's descriptor states it.
    fn remote_mr(&self, desc: &SegmentDescriptor, buffer: u64) -> Option<RemoteMr> {
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
        let value = desc.buffer(buffer)?.transport_info.get("rdma")?;
        let mr: RemoteMr = serde_json::from_value(value.clone()).ok()?;
        self.buffers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(buffer, (desc.engine_id, mr.clone()));
        Some(mr)
    }
}

struct Shared {
    config: RdmaConfig,
    provider: Arc<dyn Provider>,
    engine_id: u64,
    handle: tokio::runtime::Handle,
    shutdown: tokio_util::sync::CancellationToken,
    devices: Vec<Device>,
    regions: RwLock<HashMap<RegionId, Arc<LocalMr>>>,
    peers: RwLock<HashMap<u64, Arc<PeerLink>>>,
    passive: Mutex<HashMap<(u64, u32), PassiveQp>>,
    /// Bumped whenever endpoints come or go, so the poller refreshes its list.
    generation: AtomicU64,
    control_peers: Arc<ControlPeers>,
    poller: OnceLock<std::thread::Thread>,
    stopping: AtomicBool,
}

/// The RDMA transport.
pub struct RdmaTransport {
    shared: Arc<Shared>,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn open_provider(config: &RdmaConfig) -> std::result::Result<Arc<dyn Provider>, String> {
    if let Some(p) = &config.provider_instance {
        return Ok(p.clone());
    }
    let env = std::env::var("FERRY_RDMA_PROVIDER").ok();
    match config.provider.resolve(env.as_deref())? {
        #[cfg(not(target_os = "linux"))]
        ProviderChoice::Emulated => Err("the emulated verbs device is only built on Linux".into()),
        #[cfg(target_os = "linux")]
        ProviderChoice::Emulated => {
            let spec = config
                .emulated_faults
                .clone()
                .or_else(|| std::env::var("FERRY_RDMA_EMULATED_FAULTS").ok())
                .unwrap_or_default();
            let faults = crate::emulated::EmulatedFaults::parse(&spec)
                .map_err(|e| format!("bad emulated fault spec {spec:?}: {e}"))?;
            tracing::info!(
                faults = %spec,
                "rdma: using the EMULATED verbs device (software, for tests; not a NIC)"
            );
            Ok(Arc::new(crate::emulated::EmulatedProvider::new(faults)))
        }
        #[cfg(target_os = "linux")]
        ProviderChoice::Ibverbs | ProviderChoice::Auto => crate::ibverbs::IbverbsProvider::load()
            .map(|p| Arc::new(p) as Arc<dyn Provider>)
            .map_err(|e| e.to_string()),
        #[cfg(not(target_os = "linux"))]
        ProviderChoice::Ibverbs | ProviderChoice::Auto => {
            Err("libibverbs is only supported on Linux".into())
        }
    }
}

fn open_device(
    provider: &dyn Provider,
    name: &str,
    config: &RdmaConfig,
) -> std::result::Result<Device, VerbsError> {
    let ctx = provider.open(name)?;
    let port = ctx.query_port(config.port)?;
    if port.state != port_state::ACTIVE {
        return Err(VerbsError::Unavailable(format!(
            "{name} port {} is not active (state {})",
            config.port, port.state
        )));
    }
    let gid_index = match config.gid_index {
        Some(i) => i,
        None => {
            let entries: Vec<GidEntry> = (0..port.gid_table_len.min(64))
                .filter_map(|index| {
                    let gid = ctx.query_gid(config.port, index).ok()?;
                    Some(GidEntry {
                        index,
                        gid,
                        kind: gid::sysfs_gid_kind(name, config.port, index),
                    })
                })
                .collect();
            choose_gid_index(&entries, port.link_layer).ok_or_else(|| {
                VerbsError::Unavailable(format!("{name} port {} has no usable GID", config.port))
            })?
        }
    };
    let gid = ctx.query_gid(config.port, gid_index)?;
    let pd = ctx.alloc_pd()?;
    Ok(Device {
        name: name.to_string(),
        ctx,
        pd,
        gid,
        gid_index,
        lid: port.lid,
        mtu: port.active_mtu,
    })
}

impl RdmaTransport {
    /// Opens the provider and the devices; the error says why RDMA cannot be used here.
    pub fn open(
        config: RdmaConfig,
        context: TransportContext,
    ) -> std::result::Result<Self, String> {
        config.validate()?;
        let provider = open_provider(&config)?;
        let listed = provider.devices().map_err(|e| e.to_string())?;
        let mut devices = Vec::new();
        let mut skipped = Vec::new();
        for d in &listed {
            if !config.devices.is_empty() && !config.devices.contains(&d.name) {
                continue;
            }
            match open_device(provider.as_ref(), &d.name, &config) {
                Ok(dev) => devices.push(dev),
                Err(e) => skipped.push(format!("{}: {e}", d.name)),
            }
        }
        if devices.is_empty() {
            let names: Vec<&str> = listed.iter().map(|d| d.name.as_str()).collect();
            return Err(if listed.is_empty() {
                "no RDMA device".to_string()
            } else if skipped.is_empty() {
                format!(
                    "no RDMA device matches the allowlist {:?} (present: {names:?})",
                    config.devices
                )
            } else {
                format!("no usable RDMA device: {}", skipped.join("; "))
            });
        }
        for d in &devices {
            tracing::info!(
                provider = provider.name(),
                device = %d.name,
                gid_index = d.gid_index,
                gid = %gid_hex(&d.gid),
                "rdma device in use"
            );
        }
        let shared = Arc::new(Shared {
            config,
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
        let grace = self.config.passive_grace;
        let mut passive = self.passive.lock().unwrap_or_else(|p| p.into_inner());
        let before = passive.len();
        passive.retain(|(engine, _), p| {
            if self.control_peers.is_connected(*engine) {
                p.orphaned_since = None;
                return true;
            }
            let since = *p.orphaned_since.get_or_insert(now);
            now.duration_since(since) < grace
        });
        if passive.len() != before {
            tracing::debug!(
                released = before - passive.len(),
                "rdma: released queue pairs of departed peers"
            );
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

    fn bringup(&self, dev: &Device) -> Bringup {
        Bringup {
            port: self.config.port,
            gid_index: dev.gid_index.min(255) as u8,
            ack_timeout: self.config.ack_timeout,
            retry_cnt: self.config.retry_cnt,
        }
    }

    /// A queue pair (with its own CQ) on `dev`, moved to INIT, and what the peer needs to
    /// connect to it.
    fn new_queue_pair(
        &self,
        dev: &Device,
        send_slots: u32,
    ) -> std::result::Result<NewQueuePair, VerbsError> {
        let cq = dev.ctx.create_cq(send_slots * 2 + 16)?;
        let qp = dev.pd.create_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: send_slots,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
            },
        )?;
        handshake::to_init(qp.as_ref(), self.bringup(dev))?;
        let info = self.endpoint_info(dev, qp.as_ref());
        Ok((qp, cq, info))
    }

    fn endpoint_info(&self, dev: &Device, qp: &dyn QueuePair) -> EndpointInfo {
        EndpointInfo {
            qpn: qp.qpn(),
            psn: handshake::random_psn(),
            gid: gid_hex(&dev.gid),
            lid: dev.lid,
            mtu: dev.mtu,
        }
    }

    fn submit_one(self: &Arc<Self>, a: &Attempt) -> Result<()> {
        let req = a.task.request();
        let unavailable = |why: String| Error::TransportUnavailable(format!("rdma: {why}"));
        let link = self
            .link(req.peer.handle())
            .ok_or_else(|| unavailable(format!("no endpoint to {}", req.peer.name())))?;
        let eps = link.live();
        if eps.is_empty() {
            return Err(unavailable(format!(
                "no connected endpoint to {}: {}",
                req.peer.name(),
                link.down_reason()
            )));
        }
        let local = self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&req.local.id())
            .cloned()
            .ok_or_else(|| unavailable(format!("region {} is not registered", req.local.id())))?;
        let remote = link
            .remote_mr(&req.descriptor, req.remote_buffer)
            .ok_or_else(|| {
                unavailable(format!(
                    "buffer {} of {} has no rdma registration",
                    req.remote_buffer,
                    req.peer.name()
                ))
            })?;
        let slice = self.config.slice_size as u64;
        let slices_u32 = u32::try_from(req.slice_count(slice))
            .map_err(|_| Error::InvalidArgument("request has too many slices".into()))?;
        let opcode = match req.opcode {
            Opcode::Write => WrOpcode::RdmaWrite,
            Opcode::Read => WrOpcode::RdmaRead,
        };
        let local_base = local.region.as_ptr() as u64;
        let start = link.next.fetch_add(1, Ordering::Relaxed) as usize;
        let mut per_ep: Vec<Vec<Work>> = (0..eps.len()).map(|_| Vec::new()).collect();
        for (i, piece) in req.slices(slice).enumerate() {
            let e = (start + i) % eps.len();
            let ep = &eps[e];
            let (Some(mr), Some(rkey)) =
                (local.mrs.get(ep.local_dev), remote.rkeys.get(ep.remote_dev))
            else {
                return Err(unavailable("device index out of range".into()));
            };
            per_ep[e].push(Work {
                task: a.task.clone(),
                attempt: a.attempt,
                opcode,
                local_addr: local_base + piece.local_offset,
                lkey: mr.lkey(),
                // A slice is at most `slice_size`, a u32.
                len: piece.length as u32,
                remote_addr: remote.addr.wrapping_add(piece.remote_offset),
                rkey: *rkey,
                local: local.clone(),
            });
        }
        a.task.expect_slices(a.attempt, slices_u32);
        let mut pushed_any = false;
        for (ep, works) in eps.iter().zip(per_ep) {
            if works.is_empty() {
                continue;
            }
            match ep.push(works) {
                Ok(()) => pushed_any = true,
                Err(err) => {
                    let (why, reset) = match err {
                        PushError::Broken(why) => (why, false),
                        PushError::Post { error, posted_any } => {
                            pushed_any |= posted_any;
                            (format!("post_send failed: {error}"), true)
                        }
                    };
                    if reset {
                        self.reset_endpoint(&link, ep, &why, || {
                            Error::Io(format!("rdma endpoint reset: {why}"))
                        });
                    }
                    if !pushed_any {
                        return Err(unavailable(why));
                    }
                    a.task
                        .attempt_failed(a.attempt, Error::Io(format!("rdma: {why}")));
                    break;
                }
            }
        }
        self.wake_poller();
        Ok(())
    }
}

impl Transport for RdmaTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
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
        self.shared.accept(request)
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}
