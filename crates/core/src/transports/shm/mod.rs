//! The shared-memory transport, for peers on the same host (same machine id and boot id).
//!
//! Engine-owned regions are memfds sealed against resizing. A same-host initiator connects
//! to the target's abstract unix socket, proves the segment token, and receives each
//! buffer's memfd over SCM_RIGHTS; it maps every buffer once and copies straight into or out
//! of the mapping: one copy, no target CPU. How a copy is made (on the submitting thread,
//! shared with a small pool of copy threads, or handed to them) is decided by one pure
//! policy, `copy_plan`, from the machine and the request; this module only carries it out.
//!
//! A dead process's memory stays mapped, so a copy into it would "succeed" silently. The
//! transport therefore watches the target: a pidfd (exit) and the unix connection (EOF)
//! report its death at once, after which every copy fails; each copy also checks the pidfd
//! after it finishes (the one syscall of a copy: the checks before it read a flag), so no
//! attempt completes into a dead target.
//!
//! Modules: `copy_plan` (the copy policy, pure), `cpu_cache`, `copy_speed` and
//! `memory_speed` (the machine it reads), `serve` (the target's side), `attach` (the initiator's: connecting, receiving
//! fds, mapping), `peer` (an attached peer and its death), `copy` (one copy, checked),
//! `shared_copy` (a copy cut into jobs), `copy_threads` (the threads and their queue),
//! `large_copiers` (which threads copy large blocks now).

mod attach;
mod copy;
mod copy_plan;
mod copy_speed;
mod copy_threads;
mod cpu_cache;
mod large_copiers;
mod memory_speed;
mod peer;
mod placement;
mod serve;
mod shared_copy;
mod verified;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::deadlines::Deadlines;
use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::linux::RemoteMapping;
use crate::request::RequestView;
use crate::segment::{Peer, SegmentDescriptor};
use crate::task::{Observer, Task};
use crate::transport::{Attempt, BoxFuture, Transport, TransportContext, TransportFactory};
use attach::{connect_and_map, socket_of, Attached};
use copy::{copy_spans, Copy};
use copy_plan::{Caller, CopyPolicy, CopyRequest, Machine, Plan};
use copy_threads::CopyThreads;
use large_copiers::LargeCopiers;
use peer::{watch, DeathHook, Mappings, ShmPeer};
use placement::{placement, Placement};
use serve::{bind, serve, Gate};
use shared_copy::Shared;

/// The shared-memory transport.
pub struct ShmTransport {
    /// This transport, for the futures of `attach`.
    me: std::sync::Weak<ShmTransport>,
    machine_id: String,
    local_engine_id: u64,
    /// Served to same-host peers (their memfds), behind the handshake and `token`.
    gate: Arc<Gate>,
    /// The abstract socket's name once `install` bound it.
    socket: std::sync::OnceLock<String>,
    /// Read on every request, without a lock or a reference taken (two threads submitting
    /// must write no cache line in common): one load finds the peer and its mappings.
    /// Replaced whole on the rare attach, map and forget.
    peers: ArcSwap<FxHashMap<u64, Mapped>>,
    /// How copies are made on this machine, with the memory's bandwidth estimated.
    policy: CopyPolicy,
    /// The machine `policy` was made for.
    machine: Machine,
    /// The policy with the memory's speed as measured, once `memory_speed` has it.
    measured_policy: std::sync::OnceLock<CopyPolicy>,
    copy_threads: CopyThreads,
    rt: Handle,
    shutdown: CancellationToken,
    /// Which threads copied large blocks lately: copy threads help only while a core is
    /// free for them.
    large_copiers: LargeCopiers,
    /// Set by `shutdown`: what a submit checks (`CancellationToken::is_cancelled` takes a
    /// mutex, which threads submitting side by side queue on).
    closed: AtomicBool,
    on_death: DeathHook,
    /// Why an attach ran out of a resource (out of memory or address space for a peer's
    /// mappings), by peer handle, until an attach succeeds or the peer is forgotten: a
    /// request that requires shm then fails with the limit's words. Read only once shm
    /// is found unable to serve.
    setup_limits: std::sync::Mutex<FxHashMap<u64, String>>,
    /// The engine's attempt deadlines: a copy queued for the copy threads is timed from
    /// when one of them takes it, not from its submission (`None`: no deadline).
    deadlines: Option<Arc<Deadlines<Task>>>,
}

/// A peer as the transport's table holds it: the peer, and its buffers mapped (by buffer
/// id). A peer taken out of the table lets go of its mappings with it: copies in flight
/// hold their own.
#[derive(Clone)]
struct Mapped {
    peer: Arc<ShmPeer>,
    maps: Arc<Mappings>,
}

impl ShmTransport {
    /// A transport for the engine of `context`.
    fn new(context: TransportContext) -> Result<Arc<Self>> {
        let machine = this_machine();
        let policy = CopyPolicy::new(&machine);
        tracing::debug!(
            cores = machine.cores,
            l2 = machine.l2,
            copy_rate_bytes_per_ns = machine.copy_rate,
            memory = ?machine.memory,
            copy_threads = policy.copy_threads(),
            share_min = policy.plain_share_min(),
            "shm: plain copies above share_min bytes are shared with the copy threads"
        );
        let copy_threads = CopyThreads::start(policy.copy_threads())?;
        // Off this thread: until it lands, large copies take the estimate.
        memory_speed::start_probe(policy.copy_threads() + 1, cpu_cache::l3_bytes());
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            machine_id: context.machine_id,
            local_engine_id: context.engine_id,
            gate: Arc::new(Gate {
                engine_id: context.engine_id,
                regions: context.regions,
                token: context.token,
                secret: context.secret,
                admission: context.admission,
                any_uid: context.shm_any_uid,
                timeout: context.frame_timeout,
                farewell: context.farewell,
            }),
            socket: std::sync::OnceLock::new(),
            peers: ArcSwap::default(),
            closed: AtomicBool::new(false),
            policy,
            machine,
            measured_policy: std::sync::OnceLock::new(),
            copy_threads,
            large_copiers: LargeCopiers::new(),
            rt: context.handle,
            shutdown: context.shutdown,
            on_death: context.lost,
            deadlines: context.deadlines,
            setup_limits: std::sync::Mutex::default(),
        }))
    }

    fn peer(&self, handle: u64) -> Option<Arc<ShmPeer>> {
        self.peers.load().get(&handle).map(|m| m.peer.clone())
    }

    /// Takes the peer under `handle` out of the table; returns it.
    fn remove_peer(&self, handle: u64) -> Option<Arc<ShmPeer>> {
        let mut old = None;
        self.peers.rcu(|peers| {
            let mut peers = FxHashMap::clone(peers);
            old = peers.remove(&handle);
            peers
        });
        old.map(|m| m.peer)
    }

    /// Adds the mappings of buffers `peer` (under `handle`) allocated since it was
    /// attached, while the table still holds that peer.
    fn add_maps(&self, handle: u64, peer: &Arc<ShmPeer>, more: &Mappings) {
        self.peers.rcu(|peers| {
            let mut peers = FxHashMap::clone(peers);
            if let Some(m) = peers
                .get_mut(&handle)
                .filter(|m| Arc::ptr_eq(&m.peer, peer))
            {
                m.maps = with_more(&m.maps, more);
            }
            peers
        });
    }

    /// Connects to a same-host peer and maps its buffers; on refresh, maps the buffers of
    /// the same incarnation not mapped yet, or attaches a new incarnation afresh. Peers on
    /// another host, or without shm, are left alone.
    async fn attach_peer(&self, peer: &Arc<Peer>) -> Result<()> {
        let desc = peer.descriptor();
        let Some(socket) = socket_of(&desc) else {
            return Ok(());
        };
        if desc.machine_id != self.machine_id || desc.engine_id == self.local_engine_id {
            return Ok(());
        }
        let token = desc.token_bytes()?;
        let current = self
            .peers
            .load()
            .get(&peer.handle())
            .filter(|m| m.peer.engine_id == desc.engine_id && m.peer.known_alive())
            .cloned();
        if let Some(current) = current {
            let mapped = &current.maps;
            let missing: Vec<_> = desc
                .buffers
                .iter()
                .filter(|b| b.transports.contains(&TransportKind::Shm))
                .filter(|b| !mapped.contains_key(&b.id))
                .cloned()
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            let only_missing = SegmentDescriptor {
                buffers: missing,
                ..SegmentDescriptor::clone(&desc)
            };
            // A connection of its own for them, let go once they are mapped: the first
            // connection still watches the target's life.
            let more = connect_and_map(&socket, self.local_engine_id, &token, &only_missing);
            self.add_maps(peer.handle(), &current.peer, &more.await?.maps);
            return Ok(());
        }
        let attached = connect_and_map(&socket, self.local_engine_id, &token, &desc).await?;
        let Attached {
            stream,
            pidfd,
            maps,
            life,
        } = attached;
        let shm_peer = Arc::new(ShmPeer::new(
            peer.clone(),
            desc.engine_id,
            pidfd,
            life,
            self.shutdown.child_token(),
        ));
        let mapped = Mapped {
            peer: shm_peer.clone(),
            maps: Arc::new(maps),
        };
        match self.place(peer, mapped) {
            (Placement::Install, old) => {
                if let Some(old) = old {
                    old.let_go();
                }
                self.rt
                    .spawn(watch(shm_peer, stream, self.on_death.clone()));
            }
            // Its mappings are in the table (merged) or of no use; the peer held watches.
            (Placement::Merge | Placement::Stale, _) => shm_peer.let_go(),
        }
        Ok(())
    }

    /// Puts what an attach towards `peer` mapped in the table as [`placement`] says,
    /// whichever attach towards it ends last; returns the placement and the peer it
    /// replaced.
    fn place(&self, peer: &Peer, mapped: Mapped) -> (Placement, Option<Arc<ShmPeer>>) {
        let handle = peer.handle();
        let mut outcome = (Placement::Stale, None);
        self.peers.rcu(|peers| {
            let mut peers = FxHashMap::clone(peers);
            let held = peers
                .get(&handle)
                .map(|m| (m.peer.engine_id, m.peer.known_alive()));
            let placed = placement(held, mapped.peer.engine_id, peer.engine_id());
            outcome = (placed, None);
            match placed {
                Placement::Install => {
                    outcome.1 = peers.insert(handle, mapped.clone()).map(|m| m.peer);
                }
                Placement::Merge => {
                    if let Some(m) = peers.get_mut(&handle) {
                        m.maps = with_more(&m.maps, &mapped.maps);
                    }
                }
                Placement::Stale => {}
            }
            peers
        });
        outcome
    }

    /// Records how an attach towards `peer` ended: a resource limit is kept (for
    /// `setup_limit`) until an attach succeeds; any other outcome clears it.
    fn note_attach(&self, peer: &Peer, outcome: &Result<()>) {
        let mut limits = self.setup_limits.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Err(Error::ResourceLimit(limit)) => {
                tracing::warn!(peer = peer.name(), %limit, "shm cannot map this peer's memory");
                limits.insert(peer.handle(), limit.clone());
            }
            _ => {
                limits.remove(&peer.handle());
            }
        }
    }

    /// The resource limit an attach towards `peer` met, while it holds.
    fn limit_towards(&self, peer: &Peer) -> Option<String> {
        self.setup_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer.handle())
            .cloned()
    }

    /// Runs `f` on the peer and the mapping that `req` is copied with, once the transport
    /// is open, the target not known dead, its buffer mapped and every span inside the
    /// mapping; why not otherwise. Borrowed from the tables: no reference taken.
    fn with_target<R>(
        &self,
        req: &RequestView<'_>,
        f: impl FnOnce(&Arc<ShmPeer>, &Arc<RemoteMapping>) -> R,
    ) -> Result<R> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if req.peer.is_closed() {
            return Err(req.peer.closed_error());
        }
        let peers = self.peers.load();
        let Mapped { peer, maps } = peers.get(&req.peer.handle()).ok_or_else(|| {
            Error::TransportUnavailable(format!("no shared memory with {}", req.peer.name()))
        })?;
        if peer.engine_id != req.descriptor.engine_id {
            // Planned against the incarnation known now: its memory is not mapped yet
            // (another transport serves it meanwhile). Else planned against a gone one.
            if req.descriptor.engine_id == req.peer.engine_id() {
                return Err(Error::TransportUnavailable(format!(
                    "shared memory with the new incarnation of {} is not set up yet",
                    req.peer.name()
                )));
            }
            return Err(req.peer.restarted_error());
        }
        if !peer.known_alive() {
            return Err(req.peer.lost_error_or("target process exited"));
        }
        let mapping = maps.get(&req.remote_buffer).ok_or_else(|| {
            let why = format!(
                "buffer {} of {} is not mapped",
                req.remote_buffer,
                req.peer.name()
            );
            // Mapping it ran out of memory: the limit is the news.
            match self.limit_towards(req.peer) {
                Some(limit) => Error::ResourceLimit(format!("{why}: {limit}")),
                None => Error::TransportUnavailable(why),
            }
        })?;
        if let Some(s) = req
            .spans
            .iter()
            .find(|s| mapping.range_ptr(s.remote_offset, s.length).is_none())
        {
            return Err(Error::OutOfRange(format!(
                "[{}+{}) outside the {}-byte mapping of buffer {}",
                s.remote_offset,
                s.length,
                mapping.len(),
                req.remote_buffer
            )));
        }
        Ok(f(peer, mapping))
    }

    /// The policy for a split copy: the one with the memory's speed measured once
    /// `memory_speed` has it (the speed only bounds the copiers of a split copy).
    fn split_policy(&self) -> &CopyPolicy {
        if let Some(measured) = self.measured_policy.get() {
            return measured;
        }
        match memory_speed::measured() {
            Some(memory) => self.measured_policy.get_or_init(|| {
                CopyPolicy::new(&Machine {
                    memory: Some(memory),
                    ..self.machine
                })
            }),
            None => &self.policy,
        }
    }

    /// Copies attempt `a` as the copy plan says: on this thread, or split with the copy
    /// threads.
    fn submit_attempt(&self, a: &Attempt) -> Result<()> {
        let req = &a.task.request().view();
        let caller = match a.task.observer() {
            Observer::Poll => Caller::Polled,
            Observer::Progress => Caller::Promise,
        };
        self.with_target(req, |peer, mapping| {
            if req.verify {
                a.task.expect_slices(a.attempt, 1);
                match verified::copy_verified(peer, mapping, req.local, req.opcode, req.spans) {
                    Ok(bytes) => a.task.slice_done(a.attempt, bytes),
                    Err(e) => a.task.attempt_failed(a.attempt, e),
                }
                return Ok(());
            }
            // `_copying` is held until this thread's part of the copy ends: other threads
            // count this one as copying meanwhile.
            let (split, _copying) =
                match self.policy.plan(&copy_request(req, a.more_follow, caller)) {
                    Plan::Inline => (None, None),
                    Plan::Split(split) => {
                        // Every split copy counts as a large one, whether or not it stays inline.
                        let (others, copying) = self.large_copiers.others_copying();
                        let awake = self.copy_threads.awake();
                        let shared = !self.split_policy().inline_after_all(&split, others, awake);
                        (shared.then_some((split, others, awake)), Some(copying))
                    }
                };
            let Some((split, others, awake)) = split else {
                a.task.expect_slices(a.attempt, 1);
                Copy {
                    task: &a.task,
                    attempt: a.attempt,
                    peer,
                    mapping,
                    opcode: req.opcode,
                    region: req.local,
                    spans: req.spans,
                }
                .run();
                return Ok(());
            };
            let shared = Shared::new(
                a.task.clone(),
                a.attempt,
                peer.clone(),
                mapping.clone(),
                split.job,
            )?;
            // What this thread does not copy itself waits behind other copies: its clock
            // starts when a copy thread takes it (`Shared::copy_back`), so a long list
            // never times out behind its own head. The copy threads wait on no peer, so
            // that wait is bounded by the copies ahead. A copy this thread may finish
            // alone waits on nothing, and is timed from submission as any other.
            if let Some(deadlines) = self
                .deadlines
                .as_ref()
                .filter(|_| req.length > split.own_bytes)
            {
                a.task.time_from_start(a.attempt, deadlines);
            }
            let helpers = self
                .split_policy()
                .helpers(&split, shared.jobs(), others, awake);
            self.copy_threads.share(shared, split.own_bytes, helpers)
        })?
    }
}

/// `maps` with the mappings of `more` it lacks (one already held is kept).
fn with_more(maps: &Mappings, more: &Mappings) -> Arc<Mappings> {
    let mut maps = Mappings::clone(maps);
    for (id, mapping) in more {
        maps.entry(*id).or_insert_with(|| mapping.clone());
    }
    Arc::new(maps)
}

/// What the copy plan reads of `req`.
fn copy_request(req: &RequestView<'_>, more_follow: bool, caller: Caller) -> CopyRequest {
    CopyRequest {
        length: req.length,
        gathered: req.gathered,
        more_follow,
        caller,
    }
}

/// What the copy plan reads of this machine: its cores, a core's L2, how fast one core
/// copies (measured once per process), and the memory's speed where `memory_speed`
/// measured it already (else the plan estimates it until it does).
fn this_machine() -> Machine {
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        l2: cpu_cache::l2_bytes(),
        copy_rate: copy_speed::cached_copy_rate(),
        memory: memory_speed::measured(),
    }
}

/// How many copy threads an shm transport runs on this machine (what operators see in a
/// run's header): the copy plan's count, from the cores.
pub fn copy_thread_count() -> usize {
    CopyPolicy::new(&this_machine()).copy_threads()
}

/// Builds the shared-memory transport.
#[derive(Debug, Clone, Copy)]
pub struct ShmFactory;

impl TransportFactory for ShmFactory {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>> {
        Ok(ShmTransport::new(context)?)
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    /// Binds the abstract socket that serves this engine's memfds to same-host peers.
    fn install(&self) -> Result<()> {
        let _guard = self.rt.enter();
        let (listener, name) = bind(self.local_engine_id)?;
        self.rt
            .spawn(serve(listener, self.gate.clone(), self.shutdown.clone()));
        let _ = self.socket.set(name);
        Ok(())
    }

    fn spread(&self) -> crate::transport::TransportSpread {
        crate::transport::TransportSpread {
            copy_threads: Some(self.policy.copy_threads()),
            ..Default::default()
        }
    }

    fn describe(&self) -> Option<serde_json::Value> {
        let socket = self.socket.get()?;
        Some(serde_json::json!({ "socket": socket }))
    }

    /// Connects to a same-host peer and maps its buffers (again, on refresh).
    fn attach(&self, peer: &Arc<Peer>) -> Option<BoxFuture<Result<()>>> {
        let me = self.me.upgrade()?;
        let peer = peer.clone();
        Some(Box::pin(async move {
            let attached = me.attach_peer(&peer).await;
            me.note_attach(&peer, &attached);
            attached
        }))
    }

    fn reachable(&self, peer: &Peer) -> std::result::Result<(), String> {
        // Asked for every request: looked at under the lock, no reference taken.
        let alive = self
            .peers
            .load()
            .get(&peer.handle())
            .map(|m| m.peer.known_alive());
        match alive {
            Some(true) => Ok(()),
            Some(false) => Err("the target process exited".into()),
            None => {
                let desc = peer.descriptor();
                if desc.machine_id != self.machine_id {
                    Err(format!(
                        "{} is on another host (machine/boot id {:?}, here {:?})",
                        peer.name(),
                        desc.machine_id,
                        self.machine_id
                    ))
                } else if socket_of(&desc).is_none() {
                    Err(format!("{} does not offer shared memory", peer.name()))
                } else {
                    Err(format!("shared memory with {} is not set up", peer.name()))
                }
            }
        }
    }

    fn serves(&self, region: &crate::memory::Region) -> bool {
        // Only engine-owned (memfd) regions can be shared; user Buffers are served over
        // the network transports.
        region.mapping().is_some()
    }

    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>> {
        attempts.iter().map(|a| self.submit_attempt(a)).collect()
    }

    fn submit_one(&self, attempt: &Attempt) -> Result<()> {
        self.submit_attempt(attempt)
    }

    /// A copy that an attempt would make on the submitting thread alone (neither shared
    /// nor handed off), made now. Whatever would stop an attempt before its copy (no
    /// mapping, a target known dead, a range outside the mapping) is left to the attempt
    /// to report: `None`, nothing copied.
    fn complete_now(&self, request: &RequestView<'_>, more_follow: bool) -> Option<Result<()>> {
        // Only a polled submission asks (`Transport::complete_now`). A verified one is
        // left to its attempt (`verified`).
        if request.verify {
            return None;
        }
        let plan = self
            .policy
            .plan(&copy_request(request, more_follow, Caller::Polled));
        // Held until the copy ends: other threads count this one as copying meanwhile.
        let _copying = match plan {
            Plan::Inline => None,
            Plan::Split(split) => {
                // A split copy that other copiers make inline after all is made here too, as
                // the attempt would make it (and counted a large copy alike): through a task
                // it would cost the task's bookkeeping beside the same memcpy.
                let (others, copying) = self.large_copiers.others_copying();
                let awake = self.copy_threads.awake();
                if !self.split_policy().inline_after_all(&split, others, awake) {
                    return None;
                }
                Some(copying)
            }
        };
        let copy = |peer: &Arc<ShmPeer>, mapping: &Arc<RemoteMapping>| {
            copy_spans(peer, mapping, request.local, request.opcode, request.spans)
        };
        self.with_target(request, copy)
            .ok()
            .map(|copied| copied.map(drop))
    }

    fn setup_limit(&self, peer: &Peer) -> Option<String> {
        self.limit_towards(peer)
    }

    fn fail_peer(&self, peer: &Peer, _error: Error) {
        // Copies are synchronous or queued; queued ones re-check liveness before copying.
        if let Some(p) = self.peer(peer.handle()) {
            p.mark_dead();
        }
    }

    fn forget_peer(&self, peer: &Peer, error: Error) {
        self.fail_peer(peer, error);
        self.setup_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer.handle());
        if let Some(p) = self.remove_peer(peer.handle()) {
            // Unmap now: only copies already in flight keep their mapping until they end.
            p.let_go();
        }
    }

    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.shutdown.cancel();
        let peers = self.peers.swap(Arc::default());
        for m in peers.values() {
            m.peer.mark_dead();
            m.peer.let_go();
        }
        self.copy_threads.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::Poll;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use crate::control::fetch_descriptor;
    use crate::kind::TransportKind;
    use crate::request::{RequestView, Span};
    use crate::segment::Peer;
    use crate::{Engine, EngineConfig, Opcode, TransportHint};

    fn shm_engine(listen: &str) -> Engine {
        Engine::new(EngineConfig {
            listen: listen.into(),
            transports: vec![TransportKind::Shm],
            ..EngineConfig::default()
        })
        .expect("engine")
    }

    /// A recovery's attach that read the descriptor before a buffer was allocated, ending
    /// after the refresh's attach that mapped it, must not leave that buffer unmapped.
    #[test]
    fn an_attach_that_ends_last_with_an_older_descriptor_keeps_the_newer_buffers() {
        ferry_testkit::within(Duration::from_secs(30), "attaches out of order", || {
            let target = shm_engine("127.0.0.1:0");
            let initiator = shm_engine("127.0.0.1:0");
            let inner = initiator.inner();
            let shm = inner.transports[0].1.clone();
            let addr = target.local_addr().to_string();
            let timeout = Duration::from_secs(10);
            let fetch = || fetch_descriptor(&addr, inner.engine_id, timeout);
            let before = inner.handle.block_on(fetch()).expect("descriptor");
            assert!(before.buffers.is_empty());
            let peer = Arc::new(Peer::new(
                u64::MAX,
                addr.clone(),
                before,
                CancellationToken::new(),
            ));
            let local = initiator.allocate(4096).expect("local");
            let buffer = inner.handle.block_on(async {
                let mut older = shm.attach(&peer).expect("shm attaches");
                // Its first step reads the descriptor (no buffer yet), then waits on the
                // target's answer.
                let first = std::future::poll_fn(|cx| Poll::Ready(older.as_mut().poll(cx))).await;
                assert!(first.is_pending(), "the attach waits on the target");
                let buffer = target.allocate(4096).expect("buffer");
                peer.set_descriptor(fetch().await.expect("descriptor"));
                let newer = shm.attach(&peer).expect("shm attaches");
                newer.await.expect("the newer attach");
                older.await.expect("the older attach");
                buffer
            });
            let spans = [Span {
                local_offset: 0,
                remote_offset: 0,
                length: 4096,
            }];
            let descriptor = peer.descriptor();
            let write = RequestView {
                opcode: Opcode::Write,
                local: &local,
                peer: &peer,
                descriptor: &descriptor,
                remote_buffer: buffer.id(),
                length: 4096,
                hint: TransportHint::Require(TransportKind::Shm),
                verify: false,
                spans: &spans,
                gathered: false,
            };
            assert!(
                matches!(shm.complete_now(&write, false), Some(Ok(()))),
                "the buffer allocated last is mapped"
            );
            initiator.close();
            target.close();
        });
    }
}
