//! The engine: ties memory, segments, batches, transports and the control plane together.
//!
//! `Engine` is a cheap handle over a shell that holds the engine's identity and counters
//! and, while it is open, an `Arc<Inner>` with everything else: the runtime, listeners,
//! connections, transports and the region table. The state machine is Open → Closing →
//! Closed. `close()` stops new work, cancels what is in flight (waking every waiter), stops
//! the I/O threads, and then lets go of `Inner`, so sockets, memfds, mappings and threads are
//! released when `close()` returns — not when the last handle is dropped. Handles that
//! outlive it are inert: every call returns `Closed`, and the counters stay readable. Close
//! is idempotent, and safe to race with status reads from any number of threads: they get a
//! terminal status or `Closed`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use crate::batch::BatchTable;
use crate::control::{fetch_descriptor, run_link, LinkConfig, LinkEvents};
use crate::error::{Error, Result};
use crate::failover::{decide, Deadlines, Decision, FailoverPolicy, Trampoline};
use crate::handle::Handles;
use crate::health::{HealthTable, RailPolicy};
use crate::memory::{Access, KeepAlive, Region, RegionId, RegionTable};
use crate::metadata::{EtcdConfig, Registry};
pub use crate::metrics::Metrics;
use crate::request::{validate, Request, ValidatedRequest};
use crate::segment::{BufferDescriptor, Peer, SegmentTable};
use crate::select::rank;
use crate::server::{accept_loop, LocalSegment};
use crate::status::{aggregate, TransferStatus};
use crate::task::{Counters, Driver, Group, Observer, Task, TaskSnapshot};
use crate::transport::{
    Attempt, ControlPeers, LostHook, Transport, TransportContext, TransportFactory, TransportKind,
};
use crate::transports::fault::{FaultSpec, FaultTransport};
#[cfg(target_os = "linux")]
use crate::transports::shm::ShmTransport;
use crate::transports::tcp::{TcpConfig, TcpTransport};

/// Engine settings. `Default` gives the embedded, loopback-only default.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Listen address for control and data (`host:port`, port 0 = any). Default
    /// `127.0.0.1:0`: loopback only.
    pub listen: String,
    /// A peer silent for this long is declared lost and its in-flight work fails.
    pub peer_timeout: Duration,
    /// I/O threads of the engine's runtime.
    pub io_threads: usize,
    /// Transports enabled here. Default: every one, in `select::DEFAULT_ORDER`; one this
    /// build or machine lacks is disabled with the reason (`transportDisabled`).
    pub transports: Vec<TransportKind>,
    /// TCP transport settings.
    pub tcp: TcpConfig,
    /// Failover budget, poll behaviour and attempt deadline.
    pub failover: FailoverPolicy,
    /// When a (peer, transport) path that keeps failing is ranked last, and for how long.
    pub rail: RailPolicy,
    /// Fault injection per transport (tests and benchmarks).
    pub faults: Vec<(TransportKind, FaultSpec)>,
    /// Overrides the machine identity used for same-host detection (tests).
    pub machine_id: Option<String>,
    /// The address peers use to reach this engine (`host` or `host:port`; the bound port
    /// when none is given): the segment name in p2p mode and the published address with
    /// etcd. Needed when listening on all interfaces (`0.0.0.0:…`). Default: the bound
    /// address (127.0.0.1 for an unspecified one).
    pub advertise: Option<String>,
    /// Transports built outside this crate (e.g. RDMA from `ferry-verbs`); each is used
    /// when its kind is in `transports`.
    pub extra_transports: Vec<Arc<dyn TransportFactory>>,
    /// Cluster metadata in etcd; `None` (default) is p2p: segments are named `host:port`.
    pub metadata: Option<EtcdConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            peer_timeout: Duration::from_millis(3000),
            io_threads: 2,
            transports: crate::select::DEFAULT_ORDER.to_vec(),
            tcp: TcpConfig::default(),
            failover: FailoverPolicy::default(),
            rail: RailPolicy::default(),
            faults: Vec::new(),
            machine_id: None,
            advertise: None,
            extra_transports: Vec::new(),
            metadata: None,
        }
    }
}

/// Bounds of the engine settings, checked by [`EngineConfig::validate`]. Named as the JS
/// options are, since that is where users set them.
pub mod limits {
    use std::time::Duration;

    /// `peerTimeoutMs`: 10 ms ..= 1 h.
    pub const PEER_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(10), Duration::from_secs(3600));
    /// `ioThreads`: 1 ..= 64.
    pub const IO_THREADS: (usize, usize) = (1, 64);
    /// `connectionsPerPeer`: 1 ..= 64.
    pub const CONNECTIONS_PER_PEER: (usize, usize) = (1, 64);
    /// `sliceSize`: 4 KiB ..= 1 GiB.
    pub const SLICE_SIZE: (u64, u64) = (4096, 1 << 30);
    /// `connectTimeoutMs`: 1 ms ..= 10 min.
    pub const CONNECT_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(600));
    /// `attemptTimeoutMs` (when set): 1 ms ..= 24 h.
    pub const ATTEMPT_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(86_400));
    /// `leaseTtlMs`: whole seconds, 1 s ..= 1 h.
    pub const LEASE_TTL: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(3600));
}

impl EngineConfig {
    /// Checks every setting against [`limits`]; the message names the option and its
    /// bounds. `Engine::new` calls it, so no engine starts with a nonsense setting.
    pub fn validate(&self) -> Result<()> {
        fn within<T: PartialOrd + std::fmt::Debug>(
            name: &str,
            v: T,
            (lo, hi): (T, T),
            show: impl Fn(&T) -> String,
        ) -> Result<()> {
            if v < lo || v > hi {
                return Err(Error::InvalidArgument(format!(
                    "{name} must be in {}..={}, got {}",
                    show(&lo),
                    show(&hi),
                    show(&v)
                )));
            }
            Ok(())
        }
        let ms = |d: &Duration| d.as_millis().to_string();
        let n = |v: &usize| v.to_string();
        within("peerTimeoutMs", self.peer_timeout, limits::PEER_TIMEOUT, ms)?;
        within("ioThreads", self.io_threads, limits::IO_THREADS, n)?;
        within(
            "connectionsPerPeer",
            self.tcp.connections_per_peer,
            limits::CONNECTIONS_PER_PEER,
            n,
        )?;
        within("sliceSize", self.tcp.slice_size, limits::SLICE_SIZE, |v| {
            v.to_string()
        })?;
        within(
            "connectTimeoutMs",
            self.tcp.connect_timeout,
            limits::CONNECT_TIMEOUT,
            ms,
        )?;
        within(
            "maxFailoverAttempts",
            self.failover.max_failover_attempts,
            (0, crate::failover::MAX_FAILOVER_ATTEMPTS),
            |v| v.to_string(),
        )?;
        if let Some(t) = self.failover.attempt_timeout {
            within("attemptTimeoutMs", t, limits::ATTEMPT_TIMEOUT, ms)?;
        }
        if self.transports.is_empty() {
            return Err(Error::InvalidArgument(
                "transports must name at least one of shm, rdma, tcp".into(),
            ));
        }
        for (i, t) in self.transports.iter().enumerate() {
            if self.transports[..i].contains(t) {
                return Err(Error::InvalidArgument(format!(
                    "transports names {} twice",
                    t.name()
                )));
            }
        }
        if let Some(m) = &self.metadata {
            within("leaseTtlMs", m.lease_ttl, limits::LEASE_TTL, ms)?;
            if m.lease_ttl.subsec_nanos() != 0 {
                return Err(Error::InvalidArgument(format!(
                    "leaseTtlMs must be whole seconds, got {}",
                    m.lease_ttl.as_millis()
                )));
            }
            if m.prefix.is_empty() {
                return Err(Error::InvalidArgument(
                    "metadataPrefix must not be empty".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Something that happened to the engine, for the event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// A peer was declared lost; its in-flight work failed.
    PeerLost {
        /// Segment name.
        segment: String,
        /// Why.
        reason: String,
    },
    /// A lost peer answers again.
    PeerRecovered {
        /// Segment name.
        segment: String,
    },
    /// A transport was taken out of use: towards one peer by the rail monitor (`segment`
    /// and `until_ms` set), or on this engine because it failed to install at start.
    TransportDisabled {
        /// The transport.
        transport: TransportKind,
        /// The peer it is paused towards; `None` for an install failure.
        segment: Option<String>,
        /// Why.
        reason: String,
        /// End of the pause, in ms since the Unix epoch; `None` for an install failure.
        until_ms: Option<u64>,
    },
    /// A task's attempt failed and it moved to another attempt.
    Failover {
        /// Segment name.
        segment: String,
        /// Transport of the failed attempt.
        from: TransportKind,
        /// Transport of the new attempt.
        to: TransportKind,
        /// Switches this task has made, this one included.
        attempt: u32,
        /// Why the attempt failed.
        reason: String,
    },
}

/// What `open_segment` returns.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    /// Handle to use in requests.
    pub handle: u64,
    /// Segment name.
    pub name: String,
    /// The peer's engine id.
    pub engine_id: u64,
    /// Buffers the peer exposes.
    pub buffers: Vec<BufferDescriptor>,
}

/// Aggregate status of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSnapshot {
    /// Aggregated status.
    pub status: TransferStatus,
    /// Bytes moved (a lower bound while pending).
    pub transferred: u64,
    /// Number of tasks.
    pub tasks: usize,
}

type EventSink = Arc<dyn Fn(EngineEvent) + Send + Sync>;

const OPEN: u8 = 0;
const CLOSING: u8 = 1;
const CLOSED: u8 = 2;

struct Inner {
    state: AtomicU8,
    engine_id: u64,
    config: EngineConfig,
    local: Arc<LocalSegment>,
    runtime: Mutex<Option<Runtime>>,
    handle: tokio::runtime::Handle,
    shutdown: CancellationToken,
    regions: Arc<RegionTable>,
    segments: SegmentTable,
    batches: BatchTable,
    transports: HashMap<TransportKind, Arc<dyn Transport>>,
    enabled: Vec<TransportKind>,
    /// Why each requested transport that is not enabled could not be used.
    disabled: HashMap<TransportKind, String>,
    #[cfg(target_os = "linux")]
    shm: Option<Arc<ShmTransport>>,
    deadlines: Arc<Deadlines>,
    /// Error history per (peer, transport): failing paths rank last for a cooldown.
    health: HealthTable<(u64, TransportKind)>,
    /// Set once any error was recorded, so successes skip the table until then.
    health_dirty: AtomicBool,
    ops: Mutex<HashMap<u64, Vec<Arc<Task>>>>,
    next_op: AtomicU64,
    stats: Arc<Stats>,
    /// Runtime threads (workers and blocking pool) that are running now.
    threads: Arc<AtomicUsize>,
    /// Futures started with `Engine::spawn` that have not ended yet.
    spawned: Arc<Pending>,
    events: Mutex<Option<EventSink>>,
    /// Events emitted while no sink was set (start-time ones included), bounded.
    backlog: Mutex<Vec<EngineEvent>>,
    metadata: Option<Arc<Registry>>,
}

/// Counters that outlive the engine's resources, so that `metrics()` works after close.
#[derive(Default)]
struct Stats {
    counters: Arc<Counters>,
    submitted: AtomicU64,
    peers_lost: AtomicU64,
    peers_recovered: AtomicU64,
    failovers: AtomicU64,
    attempt_timeouts: AtomicU64,
    transports_disabled: AtomicU64,
}

/// A count of things in progress that `close` waits for, with a bound.
#[derive(Default)]
struct Pending {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Pending {
    fn enter(self: &Arc<Self>) -> PendingGuard {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        PendingGuard(self.clone())
    }

    /// Waits until nothing is pending or `bound` has passed; returns whether it is idle.
    fn wait_idle(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *count > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = self
                .idle
                .wait_timeout(count, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

struct PendingGuard(Arc<Pending>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().unwrap_or_else(|p| p.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// How long `close` waits for futures started with `Engine::spawn` to end once the engine
/// signalled shutdown (the engine's own async calls end at once with `Closed`).
const SPAWNED_GRACE: Duration = Duration::from_secs(1);

/// What an `Engine` handle points at: the identity and counters, which stay, and the live
/// engine, which `close` takes away.
struct Shell {
    engine_id: u64,
    name: String,
    local_addr: SocketAddr,
    config: EngineConfig,
    stats: Arc<Stats>,
    /// Kept past close, so a handle is still told apart from a foreign one then.
    handles: Handles,
    live: RwLock<Option<Arc<Inner>>>,
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The last handle went without `close`: close now, so that the runtime (whose tasks
        // may hold the live engine) cannot keep it alive.
        let live = self
            .live
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(inner) = live {
            inner.close();
        }
    }
}

/// A handle that does not keep the engine alive.
#[derive(Clone)]
pub struct WeakEngine(Weak<Shell>);

impl WeakEngine {
    /// The engine, if it still exists.
    pub fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(|shell| Engine { shell })
    }
}

/// A Ferry engine. Clones share the engine.
#[derive(Clone)]
pub struct Engine {
    shell: Arc<Shell>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("segment", &self.shell.name)
            .field("engine_id", &self.shell.engine_id)
            .finish()
    }
}

/// The open engine, for the duration of one call: holding it keeps `Inner` alive, so it is
/// never kept beyond the call.
struct Live {
    inner: Arc<Inner>,
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // getrandom only fails where the OS has no entropy source; fall back to time and pid.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return t ^ (u64::from(std::process::id()) << 32);
    }
    u64::from_le_bytes(b).max(1)
}

fn machine_identity() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "{}/{}",
        read("/etc/machine-id"),
        read("/proc/sys/kernel/random/boot_id")
    )
}

impl Engine {
    /// Starts an engine: binds the listen address and starts its I/O threads.
    pub fn new(config: EngineConfig) -> Result<Self> {
        config.validate()?;
        let threads = Arc::new(AtomicUsize::new(0));
        let (started, stopped) = (threads.clone(), threads.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads.clamp(1, 64))
            .thread_name("ferry-io")
            .on_thread_start(move || {
                started.fetch_add(1, Ordering::AcqRel);
            })
            .on_thread_stop(move || {
                stopped.fetch_sub(1, Ordering::AcqRel);
            })
            .enable_all()
            .build()
            .map_err(|e| Error::io("start I/O threads", &e))?;
        let std_listener = std::net::TcpListener::bind(&config.listen).map_err(|e| {
            Error::InvalidArgument(format!("cannot listen on {}: {e}", config.listen))
        })?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("listen", &e))?;
        let local_addr = std_listener
            .local_addr()
            .map_err(|e| Error::io("listen", &e))?;
        if !local_addr.ip().is_loopback() {
            tracing::warn!(%local_addr, "listening on a non-loopback address without authentication");
        }
        let name = match &config.advertise {
            Some(a) => advertised_name(a, local_addr.port())?,
            None if local_addr.ip().is_unspecified() => {
                if config.metadata.is_some() {
                    tracing::warn!(
                        %local_addr,
                        "listening on all interfaces without an advertise address: the segment \
                         is published as 127.0.0.1, which other hosts cannot reach"
                    );
                }
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), local_addr.port()).to_string()
            }
            None => local_addr.to_string(),
        };
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener).map_err(|e| Error::io("listen", &e))?
        };
        let engine_id = random_u64();
        let mut token = [0u8; 16];
        token[..8].copy_from_slice(&random_u64().to_le_bytes());
        token[8..].copy_from_slice(&random_u64().to_le_bytes());
        let regions = Arc::new(RegionTable::default());
        let control_peers: Arc<ControlPeers> = Arc::default();
        let machine_id = config.machine_id.clone().unwrap_or_else(machine_identity);
        let shutdown = CancellationToken::new();
        let handle = runtime.handle().clone();
        // The shm transport reports a dead same-host peer through the engine, which does
        // not exist yet: the hook reads it from this slot once it does.
        let slot: Arc<std::sync::OnceLock<Weak<Inner>>> = Arc::default();

        let mut transports: HashMap<TransportKind, Arc<dyn Transport>> = HashMap::new();
        let tcp: Arc<dyn Transport> = Arc::new(TcpTransport::new(
            handle.clone(),
            engine_id,
            config.tcp,
            shutdown.child_token(),
        ));
        transports.insert(TransportKind::Tcp, tcp);
        #[cfg(target_os = "linux")]
        let shm = if config.transports.contains(&TransportKind::Shm) {
            let hook_slot = slot.clone();
            let hook: crate::transports::shm::DeathHook = Arc::new(move |peer, reason| {
                if let Some(inner) = hook_slot.get().and_then(Weak::upgrade) {
                    inner.declare_lost(peer, reason);
                }
            });
            let shm = Arc::new(ShmTransport::new(
                machine_id.clone(),
                engine_id,
                config.io_threads.clamp(1, 8),
                handle.clone(),
                shutdown.child_token(),
                hook,
            )?);
            transports.insert(TransportKind::Shm, shm.clone());
            Some(shm)
        } else {
            None
        };
        let mut disabled: HashMap<TransportKind, String> = HashMap::new();
        let lost_slot = slot.clone();
        let lost: LostHook = Arc::new(move |peer, reason| {
            if let Some(inner) = lost_slot.get().and_then(Weak::upgrade) {
                inner.declare_lost(peer, reason);
            }
        });
        for factory in &config.extra_transports {
            let kind = factory.kind();
            if !config.transports.contains(&kind) || transports.contains_key(&kind) {
                continue;
            }
            let context = TransportContext {
                engine_id,
                machine_id: machine_id.clone(),
                handle: handle.clone(),
                shutdown: shutdown.child_token(),
                regions: regions.clone(),
                lost: lost.clone(),
                control_peers: control_peers.clone(),
            };
            match factory.build(context) {
                Ok(t) => {
                    transports.insert(kind, t);
                }
                Err(e) => {
                    let why = match e {
                        Error::TransportUnavailable(why) => why,
                        other => other.to_string(),
                    };
                    tracing::info!(transport = kind.name(), reason = %why, "transport disabled");
                    disabled.insert(kind, why);
                }
            }
        }
        for (kind, spec) in &config.faults {
            if let Some(inner) = transports.remove(kind) {
                let wrapped = FaultTransport::new(inner, spec.clone(), handle.clone());
                transports.insert(*kind, Arc::new(wrapped));
            }
        }
        let mut enabled = Vec::new();
        let mut backlog = Vec::new();
        for kind in &config.transports {
            match transports.get(kind).map(|t| t.install()) {
                Some(Ok(())) => enabled.push(*kind),
                Some(Err(e)) => {
                    tracing::warn!(transport = kind.name(), error = %e, "transport not installed");
                    disabled.insert(*kind, format!("install failed: {e}"));
                }
                None if disabled.contains_key(kind) => {}
                None => {
                    tracing::info!(
                        transport = kind.name(),
                        "transport not available in this build"
                    );
                    disabled.insert(*kind, "not available in this build".into());
                }
            }
        }
        // Every requested transport that cannot be used is reported to the first
        // subscriber, with the reason.
        for kind in &config.transports {
            if let Some(why) = disabled.get(kind) {
                backlog.push(EngineEvent::TransportDisabled {
                    transport: *kind,
                    segment: None,
                    reason: why.clone(),
                    until_ms: None,
                });
            }
        }
        #[cfg(target_os = "linux")]
        let shm_socket = if enabled.contains(&TransportKind::Shm) {
            let _guard = runtime.enter();
            let (listener, name) = crate::transports::shm::bind(engine_id)?;
            handle.spawn(crate::transports::shm::serve(
                listener,
                regions.clone(),
                token,
                shutdown.clone(),
            ));
            Some(name)
        } else {
            None
        };
        #[cfg(not(target_os = "linux"))]
        let shm_socket = None;
        let local = Arc::new(LocalSegment {
            engine_id,
            name,
            machine_id,
            token,
            regions: regions.clone(),
            transports: crate::select::DEFAULT_ORDER
                .into_iter()
                .filter(|k| enabled.contains(k))
                .filter_map(|k| Some((k, transports.get(&k)?.clone())))
                .collect(),
            shm_socket,
            control_peers,
        });
        let metadata = match crate::metadata::register(&handle, &config, &local, &shutdown) {
            Ok(m) => m,
            Err(e) => {
                shutdown.cancel();
                runtime.shutdown_background();
                return Err(e);
            }
        };
        handle.spawn(accept_loop(listener, local.clone(), shutdown.clone()));
        let tick = config
            .failover
            .attempt_timeout
            .map(|t| (t / 10).clamp(Duration::from_millis(5), Duration::from_millis(100)))
            .unwrap_or(Duration::from_millis(100));
        let rail = config.rail;
        let handles = Handles::default();
        let stats = Arc::new(Stats::default());
        let shell_config = config.clone();
        let inner = Arc::new(Inner {
            state: AtomicU8::new(OPEN),
            engine_id,
            config,
            local,
            runtime: Mutex::new(Some(runtime)),
            handle,
            shutdown,
            regions,
            segments: SegmentTable::default(),
            batches: BatchTable::new(handles),
            transports,
            enabled,
            disabled,
            #[cfg(target_os = "linux")]
            shm,
            deadlines: Arc::new(Deadlines::new(std::time::Instant::now(), tick)),
            health: HealthTable::new(rail),
            health_dirty: AtomicBool::new(false),
            ops: Mutex::new(HashMap::new()),
            next_op: AtomicU64::new(1),
            stats: stats.clone(),
            threads,
            spawned: Arc::default(),
            events: Mutex::new(None),
            backlog: Mutex::new(backlog),
            metadata,
        });
        let _ = slot.set(Arc::downgrade(&inner));
        if inner.config.failover.attempt_timeout.is_some() {
            inner.handle.spawn(sweep_deadlines(
                Arc::downgrade(&inner),
                inner.shutdown.clone(),
            ));
        }
        tracing::debug!(segment = %inner.local.name, "engine started");
        let name = match &inner.metadata {
            Some(m) => m.name().to_string(),
            None => inner.local.name.clone(),
        };
        let shell = Shell {
            engine_id,
            name,
            local_addr,
            config: shell_config,
            stats,
            handles,
            live: RwLock::new(Some(inner)),
        };
        Ok(Self {
            shell: Arc::new(shell),
        })
    }

    /// The open engine, or `Closed`.
    fn live(&self) -> Result<Live> {
        let live = self.shell.live.read().unwrap_or_else(|p| p.into_inner());
        match &*live {
            Some(inner) => Ok(Live {
                inner: inner.clone(),
            }),
            None => Err(Error::Closed),
        }
    }

    /// A weak handle (for cleanup hooks that must not keep the engine alive).
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.shell))
    }

    /// Whether `close` has been called.
    pub fn is_closed(&self) -> bool {
        self.live().map_or(true, |l| l.is_closed())
    }

    /// This engine's segment name, which peers pass to `open_segment`: `host:port`, or the
    /// logical name published in etcd.
    pub fn segment_name(&self) -> &str {
        &self.shell.name
    }

    /// Test hook: stops (or resumes) this engine's etcd keep-alives without revoking its
    /// lease, as if the engine had died. No effect without etcd metadata.
    #[doc(hidden)]
    pub fn pause_metadata_keepalive(&self, paused: bool) {
        if let Ok(l) = self.live() {
            if let Some(m) = &l.inner.metadata {
                m.pause_keepalive(paused);
            }
        }
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.shell.local_addr
    }

    /// Random id of this engine instance.
    pub fn engine_id(&self) -> u64 {
        self.shell.engine_id
    }

    /// The handle space of this engine: what the binding encodes ids with, so that a
    /// handle of another engine is refused (`handle.rs`).
    pub fn handles(&self) -> Handles {
        self.shell.handles
    }

    /// The configuration in force.
    pub fn config(&self) -> &EngineConfig {
        &self.shell.config
    }

    /// Receives engine events. Replaces any previous sink; events emitted while no sink was
    /// set (such as start-time install failures) are delivered to the new one first. On a
    /// closed engine the sink is dropped at once.
    pub fn set_event_sink(&self, sink: Option<EventSink>) {
        if let Ok(l) = self.live() {
            l.set_event_sink(sink);
        }
    }

    // ---- memory -------------------------------------------------------------------

    /// Allocates an engine-owned, page-aligned, zero-filled region.
    pub fn allocate(&self, len: u64) -> Result<Arc<Region>> {
        self.live()?.allocate(len)
    }

    /// Registers user memory.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `keep_alive`
    /// lives, and `keep_alive` must keep it so.
    pub unsafe fn register_memory(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        keep_alive: Box<dyn KeepAlive>,
    ) -> Result<Arc<Region>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.live()?.register_memory(ptr, len, access, keep_alive) }
    }

    /// Releases a region (allocated or registered). In-flight transfers finish first.
    pub fn release(&self, id: RegionId) -> Result<()> {
        self.live()?.release(id)
    }

    /// Looks a local region up.
    pub fn region(&self, id: RegionId) -> Result<Arc<Region>> {
        self.live()?.region(id)
    }

    // ---- segments -----------------------------------------------------------------

    /// Opens (or refreshes) a remote segment by name: `host:port`, or with etcd metadata
    /// a name registered there (`Metadata` error when etcd cannot be asked).
    ///
    /// `close()` ends a pending call at once with `Closed`, whatever the peer does. Dropping
    /// the future abandons the open (a segment already inserted stays open).
    pub async fn open_segment(&self, name: &str) -> Result<SegmentInfo> {
        let live = self.live()?;
        let closed = live.inner.shutdown.clone();
        tokio::select! {
            biased;
            _ = closed.cancelled() => Err(Error::Closed),
            r = live.open_segment(name) => r.map_err(|e| if closed.is_cancelled() { Error::Closed } else { e }),
        }
    }

    /// Runs `fut` on the engine's I/O threads (for callers outside async code). `close()`
    /// waits up to a second for such futures to end after it signals shutdown — time for
    /// those awaiting the engine's own calls, which then end with `Closed`, to report it —
    /// and drops the rest with the runtime.
    pub fn spawn<F>(&self, fut: F) -> Result<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.live()?.spawn(fut)
    }

    /// `open_segment` for synchronous callers; must not be called from the engine's threads.
    pub fn open_segment_blocking(&self, name: &str) -> Result<SegmentInfo> {
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = self.clone();
        let name = name.to_string();
        self.spawn(async move {
            let _ = tx.send(engine.open_segment(&name).await);
        })?;
        rx.recv().unwrap_or(Err(Error::Closed))
    }

    /// Whether `kind` can currently carry requests to the segment `handle`; the reason
    /// when it cannot (e.g. "rdma is disabled on this engine: no RDMA device").
    pub fn transport_reachable(
        &self,
        handle: u64,
        kind: TransportKind,
    ) -> Result<std::result::Result<(), String>> {
        self.live()?.transport_reachable(handle, kind)
    }

    /// Closes a segment: its link stops and its in-flight work fails.
    pub fn close_segment(&self, handle: u64) -> Result<()> {
        self.live()?.close_segment(handle)
    }

    // ---- submission ---------------------------------------------------------------

    /// Allocates a batch for up to `capacity` tasks.
    pub fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        self.live()?.allocate_batch(capacity)
    }

    /// Validates every request, then submits them as tasks of `batch`. Returns the index
    /// of the first new task. On any error nothing is submitted.
    pub fn submit_transfer(&self, batch: u64, requests: &[Request]) -> Result<usize> {
        self.live()?.submit_transfer(batch, requests)
    }

    /// Status of one task.
    pub fn transfer_status(&self, batch: u64, task: usize) -> Result<TaskSnapshot> {
        self.live()?.transfer_status(batch, task)
    }

    /// Status of every task of a batch.
    pub fn transfer_status_list(&self, batch: u64) -> Result<Vec<TaskSnapshot>> {
        self.live()?.transfer_status_list(batch)
    }

    /// Aggregate status of a batch.
    pub fn batch_status(&self, batch: u64) -> Result<BatchSnapshot> {
        self.live()?.batch_status(batch)
    }

    /// Frees a batch. Tasks still pending are canceled (their bytes may still land).
    pub fn free_batch(&self, batch: u64) -> Result<()> {
        self.live()?.free_batch(batch)
    }

    /// Submits `requests` and calls `on_done` once with every task's final snapshot.
    /// Returns an operation id for `cancel`.
    pub fn transfer<F>(&self, requests: &[Request], on_done: F) -> Result<u64>
    where
        F: FnOnce(Vec<TaskSnapshot>) + Send + 'static,
    {
        self.live()?.transfer(requests, on_done)
    }

    /// `transfer` for synchronous callers (tests, tools): waits for the outcome.
    pub fn transfer_blocking(&self, requests: &[Request]) -> Result<Vec<TaskSnapshot>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.transfer(requests, move |snaps| {
            let _ = tx.send(snaps);
        })?;
        rx.recv().map_err(|_| Error::Closed)
    }

    /// Cancels a pending `transfer`; returns whether it was still pending.
    pub fn cancel(&self, op: u64) -> bool {
        self.live().is_ok_and(|l| l.cancel(op))
    }

    /// Engine counters. They stay readable after `close` (segments and regions then 0).
    pub fn metrics(&self) -> Metrics {
        let (s, c) = (&self.shell.stats, &self.shell.stats.counters);
        let (segments, regions) = match self.live() {
            Ok(l) => (
                l.inner.segments.len() as u64,
                l.inner.regions.snapshot().len() as u64,
            ),
            Err(_) => (0, 0),
        };
        Metrics {
            tasks_submitted: s.submitted.load(Ordering::Relaxed),
            tasks_completed: c.completed.load(Ordering::Relaxed),
            tasks_failed: c.failed.load(Ordering::Relaxed),
            bytes_transferred: c.bytes.load(Ordering::Relaxed),
            peers_lost: s.peers_lost.load(Ordering::Relaxed),
            peers_recovered: s.peers_recovered.load(Ordering::Relaxed),
            failovers: s.failovers.load(Ordering::Relaxed),
            attempt_timeouts: s.attempt_timeouts.load(Ordering::Relaxed),
            transports_disabled: s.transports_disabled.load(Ordering::Relaxed),
            segments_open: segments,
            regions,
            ..Metrics::default()
        }
        .with_tasks(&c.tasks)
    }

    /// Closes the engine. Idempotent; pending work ends CANCELED with `Closed`, pending
    /// async calls end with `Closed`. When it returns, the engine's threads have stopped and
    /// its sockets, memfds and mappings are released (a Buffer still viewing an
    /// engine-owned region then reads zeros); handles and regions that outlive it are inert.
    /// Calls in flight on other threads finish first with what they hold, and release it.
    pub fn close(&self) {
        let live = self
            .shell
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(inner) = live {
            inner.close();
            // `inner` is dropped here: the last reference unless a call on another thread
            // still holds one for its duration.
        }
    }
}

impl Live {
    fn check_open(&self) -> Result<()> {
        if self.inner.state.load(Ordering::Acquire) == OPEN {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }

    /// A lookup that failed while `close` ran reports `Closed`, not the empty table.
    fn or_closed(&self, e: Error) -> Error {
        if self.is_closed() {
            Error::Closed
        } else {
            e
        }
    }

    fn is_closed(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) != OPEN
    }

    fn set_event_sink(&self, sink: Option<EventSink>) {
        let mut events = self.inner.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sink) = &sink {
            let backlog =
                std::mem::take(&mut *self.inner.backlog.lock().unwrap_or_else(|p| p.into_inner()));
            for e in backlog {
                sink(e);
            }
        }
        *events = sink;
    }

    // ---- memory -------------------------------------------------------------------

    /// Allocates an engine-owned, page-aligned, zero-filled region.
    fn allocate(&self, len: u64) -> Result<Arc<Region>> {
        self.check_open()?;
        let region = self.inner.regions.allocate(len)?;
        self.inner.region_added(&region);
        Ok(region)
    }

    /// Registers user memory.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `keep_alive`
    /// lives, and `keep_alive` must keep it so.
    unsafe fn register_memory(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        keep_alive: Box<dyn KeepAlive>,
    ) -> Result<Arc<Region>> {
        self.check_open()?;
        // SAFETY: forwarded from this function's contract.
        let region = unsafe { self.inner.regions.register(ptr, len, access, keep_alive) }?;
        self.inner.region_added(&region);
        Ok(region)
    }

    /// Releases a region (allocated or registered). In-flight transfers finish first.
    fn release(&self, id: RegionId) -> Result<()> {
        self.check_open()?;
        self.inner.regions.release(id)?;
        for kind in &self.inner.enabled {
            if let Some(t) = self.inner.transports.get(kind) {
                t.region_released(id);
            }
        }
        Ok(())
    }

    /// Looks a local region up.
    fn region(&self, id: RegionId) -> Result<Arc<Region>> {
        self.check_open()?;
        self.inner.regions.get(id)
    }

    // ---- segments -----------------------------------------------------------------

    /// Opens (or refreshes) a remote segment by name: `host:port`, or with etcd metadata
    /// a name registered there (`Metadata` error when etcd cannot be asked).
    async fn open_segment(&self, name: &str) -> Result<SegmentInfo> {
        self.check_open()?;
        let (addr, revision) = match &self.inner.metadata {
            Some(m) => self.inner.resolve(m, name).await?,
            None if name.is_empty() || !name.contains(':') => {
                return Err(Error::InvalidArgument(format!(
                    "segment name must be host:port, got {name:?}"
                )))
            }
            None => (name.to_string(), None),
        };
        let timeout = self.inner.config.tcp.connect_timeout;
        let desc = fetch_descriptor(&addr, self.inner.engine_id, timeout).await?;
        self.check_open()?;
        let (peer, fresh) = self.inner.segments.insert_with(name, |handle| {
            let peer = Peer::new(
                handle,
                name.to_string(),
                desc.clone(),
                self.inner.shutdown.child_token(),
            );
            peer.set_addr(&addr);
            peer
        });
        if fresh {
            let cfg = LinkConfig {
                local_engine_id: self.inner.engine_id,
                peer_timeout: self.inner.config.peer_timeout,
            };
            let events: Arc<dyn LinkEvents> = Arc::new(Events(Arc::downgrade(&self.inner)));
            if let (Some(m), Some(rev)) = (&self.inner.metadata, revision) {
                let _guard = self.inner.handle.enter();
                m.watch(peer.clone(), events.clone(), rev, self.inner.engine_id);
            }
            self.inner.handle.spawn(run_link(peer.clone(), cfg, events));
        } else {
            peer.set_descriptor(desc);
        }
        self.inner.attach_transports(&peer).await;
        let desc = peer.descriptor();
        Ok(SegmentInfo {
            handle: peer.handle(),
            name: peer.name().to_string(),
            engine_id: desc.engine_id,
            buffers: desc.buffers.clone(),
        })
    }

    /// Runs `fut` on the engine's I/O threads (for callers outside async code).
    fn spawn<F>(&self, fut: F) -> Result<()>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.check_open()?;
        let guard = self.inner.spawned.enter();
        self.inner.handle.spawn(async move {
            let _guard = guard;
            fut.await;
        });
        Ok(())
    }

    /// Whether `kind` can currently carry requests to the segment `handle`; the reason
    /// when it cannot (e.g. "rdma is disabled on this engine: no RDMA device").
    fn transport_reachable(
        &self,
        handle: u64,
        kind: TransportKind,
    ) -> Result<std::result::Result<(), String>> {
        self.check_open()?;
        let peer = self.inner.segments.get(handle)?;
        Ok(self.inner.reachable(kind, &peer))
    }

    /// Closes a segment: its link stops and its in-flight work fails.
    fn close_segment(&self, handle: u64) -> Result<()> {
        self.check_open()?;
        let peer = self.inner.segments.remove(handle)?;
        peer.link_cancel.cancel();
        let error = Error::UnknownSegment(format!("{} was closed", peer.name()));
        for t in self.inner.transports.values() {
            t.forget_peer(&peer, error.clone());
        }
        Ok(())
    }

    // ---- submission ---------------------------------------------------------------

    fn prepare(&self, requests: &[Request]) -> Result<Vec<(ValidatedRequest, Vec<TransportKind>)>> {
        self.check_open()?;
        if requests.is_empty() {
            return Err(Error::InvalidArgument("no requests given".into()));
        }
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                // A required transport this engine cannot use: say why here first (the
                // target not offering it either is the lesser news).
                if let (true, Some(kind)) = (r.require_transport, r.transport) {
                    if let Some(why) = self.inner.not_enabled(kind) {
                        return Err(Error::TransportUnavailable(format!(
                            "request {i}: {} required: {why}",
                            kind.name()
                        )));
                    }
                }
                let v = validate(
                    r,
                    |id| self.inner.regions.get(id),
                    |h| self.inner.segments.get(h),
                )
                .map_err(|e| annotate(e, i))?;
                let ranked = self.inner.candidates(&v).map_err(|e| annotate(e, i))?;
                Ok((v, ranked))
            })
            .collect()
    }

    fn make_tasks(
        &self,
        prepared: Vec<(ValidatedRequest, Vec<TransportKind>)>,
        group: Option<&Arc<Group>>,
        observer: Observer,
    ) -> Vec<Arc<Task>> {
        let driver: Weak<dyn Driver> = Arc::downgrade(&self.inner) as Weak<dyn Driver>;
        prepared
            .into_iter()
            .map(|(v, ranked)| {
                let pinned = v.require_transport;
                Task::with_driver(
                    v,
                    group.cloned(),
                    self.inner.stats.counters.clone(),
                    observer,
                    Some(driver.clone()),
                    ranked,
                    pinned,
                )
            })
            .collect()
    }

    fn launch(&self, tasks: &[Arc<Task>]) {
        self.inner
            .stats
            .submitted
            .fetch_add(tasks.len() as u64, Ordering::Relaxed);
        for task in tasks {
            let first = task.with_state(|st| st.candidates.first().copied());
            match first {
                Some(kind) => self.inner.start_attempt(task, kind),
                None => {
                    task.fail(Error::TransportUnavailable("no candidate transport".into()));
                }
            }
        }
    }

    /// Allocates a batch for up to `capacity` tasks.
    fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        self.check_open()?;
        self.inner.batches.allocate(capacity)
    }

    /// Validates every request, then submits them as tasks of `batch`. Returns the index
    /// of the first new task. On any error nothing is submitted.
    fn submit_transfer(&self, batch: u64, requests: &[Request]) -> Result<usize> {
        self.check_open()?;
        let b = self
            .inner
            .batches
            .get(batch)
            .map_err(|e| self.or_closed(e))?;
        b.check_room(batch, requests.len())?;
        let prepared = self.prepare(requests)?;
        let tasks = self.make_tasks(prepared, None, Observer::Poll);
        let first = b.push(batch, tasks.clone())?;
        self.launch(&tasks);
        Ok(first)
    }

    /// Status of one task.
    fn transfer_status(&self, batch: u64, task: usize) -> Result<TaskSnapshot> {
        self.check_open()?;
        let b = self
            .inner
            .batches
            .get(batch)
            .map_err(|e| self.or_closed(e))?;
        b.task(task)
            .map(|t| t.snapshot())
            .ok_or(Error::InvalidTask {
                batch,
                task: task as u64,
            })
    }

    /// Status of every task of a batch.
    fn transfer_status_list(&self, batch: u64) -> Result<Vec<TaskSnapshot>> {
        self.check_open()?;
        let b = self
            .inner
            .batches
            .get(batch)
            .map_err(|e| self.or_closed(e))?;
        Ok(b.snapshots())
    }

    /// Aggregate status of a batch.
    fn batch_status(&self, batch: u64) -> Result<BatchSnapshot> {
        self.check_open()?;
        let b = self
            .inner
            .batches
            .get(batch)
            .map_err(|e| self.or_closed(e))?;
        let (status, transferred, tasks) = b.status();
        Ok(BatchSnapshot {
            status,
            transferred,
            tasks,
        })
    }

    /// Frees a batch. Tasks still pending are canceled (their bytes may still land).
    fn free_batch(&self, batch: u64) -> Result<()> {
        self.check_open()?;
        let b = self
            .inner
            .batches
            .free(batch)
            .map_err(|e| self.or_closed(e))?;
        for t in b.tasks() {
            t.finish(TransferStatus::Canceled, Some(Error::Canceled));
        }
        Ok(())
    }

    /// Submits `requests` and calls `on_done` once with every task's final snapshot.
    /// Returns an operation id for `cancel`.
    fn transfer<F>(&self, requests: &[Request], on_done: F) -> Result<u64>
    where
        F: FnOnce(Vec<TaskSnapshot>) + Send + 'static,
    {
        let prepared = self.prepare(requests)?;
        let op = self.inner.next_op.fetch_add(1, Ordering::Relaxed);
        let weak = Arc::downgrade(&self.inner);
        let holder: Arc<Mutex<Vec<Arc<Task>>>> = Arc::default();
        let holder_cb = holder.clone();
        let group = Group::new(
            prepared.len(),
            Box::new(move || {
                let tasks =
                    std::mem::take(&mut *holder_cb.lock().unwrap_or_else(|p| p.into_inner()));
                if let Some(inner) = weak.upgrade() {
                    inner
                        .ops
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&op);
                }
                on_done(tasks.iter().map(|t| t.snapshot()).collect());
            }),
        );
        let tasks = self.make_tasks(prepared, Some(&group), Observer::Progress);
        *holder.lock().unwrap_or_else(|p| p.into_inner()) = tasks.clone();
        self.inner
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(op, tasks.clone());
        self.launch(&tasks);
        Ok(op)
    }

    /// Cancels a pending `transfer`; returns whether it was still pending.
    fn cancel(&self, op: u64) -> bool {
        let tasks = self
            .inner
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&op)
            .cloned();
        let Some(tasks) = tasks else { return false };
        let mut any = false;
        for t in tasks {
            any |= t.finish(TransferStatus::Canceled, Some(Error::Canceled));
        }
        any
    }
}

/// The segment name for an advertise address: `host:port` as given, or `host` with the
/// bound port.
fn advertised_name(advertise: &str, bound_port: u16) -> Result<String> {
    let bad = |why: &str| Error::InvalidArgument(format!("advertise {advertise:?}: {why}"));
    let a = advertise.trim();
    if a.is_empty() || a.contains(char::is_whitespace) || a.contains('/') {
        return Err(bad("expected host or host:port"));
    }
    if let Ok(sa) = a.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(bad("port 0 cannot be reached"));
        }
        return Ok(sa.to_string());
    }
    if let Ok(ip) = a
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<std::net::IpAddr>()
    {
        if ip.is_unspecified() {
            return Err(bad("an unspecified address cannot be reached"));
        }
        return Ok(SocketAddr::new(ip, bound_port).to_string());
    }
    match a.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains(':') => {
            let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
            if port == 0 {
                return Err(bad("port 0 cannot be reached"));
            }
            Ok(format!("{host}:{port}"))
        }
        Some(_) => Err(bad("expected host or host:port")),
        None => Ok(format!("{a}:{bound_port}")),
    }
}

fn annotate(e: Error, index: usize) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("request {index}: {m}")),
        Error::OutOfRange(m) => Error::OutOfRange(format!("request {index}: {m}")),
        other => other,
    }
}

impl Inner {
    fn close(&self) {
        if self
            .state
            .compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        if let Some(m) = &self.metadata {
            crate::metadata::revoke_blocking(&self.handle, m);
        }
        self.shutdown.cancel();
        // Cancel in-flight work first so every waiter wakes with a terminal status.
        let mut pending: Vec<Arc<Task>> = self
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .flat_map(|(_, t)| t)
            .collect();
        for batch in self.batches.drain() {
            pending.extend(batch.tasks());
        }
        for t in &pending {
            t.finish(TransferStatus::Canceled, Some(Error::Closed));
        }
        // Inside some runtime (possibly our own) we may not block.
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        if !in_runtime && !self.spawned.wait_idle(SPAWNED_GRACE) {
            tracing::debug!("futures started with spawn still running at close; dropped");
        }
        for t in self.transports.values() {
            t.shutdown();
        }
        for peer in self.segments.drain() {
            peer.link_cancel.cancel();
        }
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = runtime {
            if in_runtime {
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_secs(2));
            }
        }
        // Every thread that may touch local memory has stopped when the runtime's threads
        // have (the transports joined theirs in `shutdown`). Then the memfds can go, even
        // where a JS Buffer still views a region: its pages become private zeros. Otherwise
        // (close from inside a runtime, or a thread that would not stop) the regions keep
        // their memfds until their last user lets go.
        if self.threads.load(Ordering::Acquire) == 0 {
            let n = self.regions.detach_owned();
            tracing::debug!(regions = n, "memfds of engine-owned regions released");
        } else {
            tracing::debug!("I/O threads still running at close: regions keep their memfds");
        }
        self.regions.clear();
        *self.events.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.state.store(CLOSED, Ordering::Release);
        tracing::debug!(segment = %self.local.name, "engine closed");
    }

    /// Ranked candidate transports for a validated request.
    fn candidates(&self, v: &ValidatedRequest) -> Result<Vec<TransportKind>> {
        let registered = v
            .descriptor
            .buffer(v.remote_buffer)
            .map(|b| b.transports.clone())
            .unwrap_or_default();
        let reachable: Vec<TransportKind> = self
            .enabled
            .iter()
            .copied()
            .filter(|k| self.reachable(*k, &v.peer).is_ok())
            .collect();
        if let Some(hint) = v.transport {
            if let Err(why) = self.reachable(hint, &v.peer) {
                if v.require_transport && v.peer.is_lost() {
                    return Err(v.peer.lost_error());
                }
                if v.require_transport {
                    return Err(Error::TransportUnavailable(format!(
                        "{} required but unavailable towards {}: {why}",
                        hint.name(),
                        v.peer.name()
                    )));
                }
            }
        }
        let ranked = rank(
            &registered,
            &reachable,
            v.transport.filter(|h| reachable.contains(h)),
        )
        .map_err(|e| {
            // Nothing reachable because the peer died: say that, not "no transport".
            if v.peer.is_lost() {
                v.peer.lost_error()
            } else {
                e
            }
        })?;
        if v.require_transport {
            return Ok(ranked.into_iter().take(1).collect());
        }
        Ok(self.rank_by_health(v.peer.handle(), &ranked, v.transport))
    }

    /// Moves transports that keep failing towards `peer` to the end (a pinned first
    /// attempt stays first).
    fn rank_by_health(
        &self,
        peer: u64,
        ranked: &[TransportKind],
        hint: Option<TransportKind>,
    ) -> Vec<TransportKind> {
        if !self.health_dirty.load(Ordering::Relaxed) {
            return ranked.to_vec();
        }
        let now = std::time::Instant::now();
        let mut out = self.health.rank(ranked, |k| (peer, *k), now);
        if let Some(h) = hint {
            if let Some(i) = out.iter().position(|k| *k == h) {
                let k = out.remove(i);
                out.insert(0, k);
            }
        }
        out
    }

    /// Whether `kind` can reach `peer` from here; the reason when it cannot.
    fn reachable(&self, kind: TransportKind, peer: &Peer) -> std::result::Result<(), String> {
        if let Some(why) = self.not_enabled(kind) {
            return Err(why);
        }
        match self.transports.get(&kind) {
            Some(t) => t.reachable(peer),
            None => Err(format!("{} is not available in this build", kind.name())),
        }
    }

    /// Why `kind` is not enabled here (`None` when it is).
    fn not_enabled(&self, kind: TransportKind) -> Option<String> {
        if self.enabled.contains(&kind) {
            return None;
        }
        Some(match self.disabled.get(&kind) {
            Some(why) => format!("{} is disabled on this engine: {why}", kind.name()),
            None => format!("{} is not enabled on this engine", kind.name()),
        })
    }

    /// Starts a new attempt of `task` on `kind`.
    fn start_attempt(&self, task: &Arc<Task>, kind: TransportKind) {
        let Some(attempt) = task.begin_attempt(kind) else {
            return;
        };
        if let Some(timeout) = self.config.failover.attempt_timeout {
            let key = self.deadlines.add(
                Arc::downgrade(task),
                attempt,
                std::time::Instant::now() + timeout,
            );
            task.set_deadline(attempt, &self.deadlines, key);
        }
        tracing::debug!(
            peer = task.request().peer.name(),
            transport = kind.name(),
            attempt,
            "attempt"
        );
        let Some(transport) = self.transports.get(&kind) else {
            task.attempt_failed(attempt, Error::TransportUnavailable(kind.name().into()));
            return;
        };
        let a = Attempt {
            task: task.clone(),
            attempt,
        };
        if let Some(Err(e)) = transport.submit(std::slice::from_ref(&a)).pop() {
            task.attempt_failed(attempt, e);
        }
    }

    fn emit(&self, event: EngineEvent) {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        match events.clone() {
            Some(sink) => {
                drop(events);
                sink(event);
            }
            // Kept (under the sink's lock, so `set_event_sink` cannot miss it) for the next sink.
            None => {
                let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
                if backlog.len() < 256 && self.state.load(Ordering::Acquire) == OPEN {
                    backlog.push(event);
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

thread_local! {
    /// Attempt failures raised on this thread while it handles one (see `Trampoline`).
    static FAILURES: Trampoline<(Arc<Task>, Error)> = Trampoline::default();
}

impl Driver for Inner {
    fn attempt_failed(&self, task: &Arc<Task>, _attempt: u32, error: Error) {
        // A failure raised while handling another (the resubmission failed at submit) is
        // queued and handled after it, so the stack stays flat whatever the budget.
        FAILURES.with(|f| {
            f.run((task.clone(), error), |(task, error)| {
                self.handle_attempt_failure(&task, error)
            })
        });
    }

    fn attempt_succeeded(&self, task: &Task, _attempt: u32) {
        self.note_success(task);
    }
}

impl Inner {
    fn handle_attempt_failure(&self, task: &Arc<Task>, error: Error) {
        if self.state.load(Ordering::Acquire) != OPEN {
            task.fail(error);
            return;
        }
        // A peer declared lost is out of reach whatever the transport: end the task now
        // instead of retrying into it, and count nothing against the transport's health.
        if task.request().peer.is_lost() {
            task.fail(error);
            return;
        }
        let current = task.transport().unwrap_or(TransportKind::Tcp);
        let retryable = matches!(
            error.status(),
            TransferStatus::Failed | TransferStatus::Timeout
        );
        let peer = task.request().peer.handle();
        if retryable {
            self.health_dirty.store(true, Ordering::Relaxed);
            let now = std::time::Instant::now();
            if self.health.record_error(&(peer, current), now) {
                tracing::info!(
                    peer = task.request().peer.name(),
                    transport = current.name(),
                    "transport keeps failing towards this peer: ranked last for a cooldown"
                );
                self.stats
                    .transports_disabled
                    .fetch_add(1, Ordering::Relaxed);
                let left = self
                    .health
                    .paused_until(&(peer, current))
                    .map_or(Duration::ZERO, |u| u.saturating_duration_since(now));
                let until = std::time::SystemTime::now() + left;
                self.emit(EngineEvent::TransportDisabled {
                    transport: current,
                    segment: Some(task.request().peer.name().to_string()),
                    reason: error.to_string(),
                    until_ms: until
                        .duration_since(std::time::UNIX_EPOCH)
                        .ok()
                        .map(|d| d.as_millis() as u64),
                });
            }
        }
        let candidates = task.with_state(|st| st.candidates.clone());
        let ranked = self.rank_by_health(peer, &candidates, None);
        let decision = task.with_state(|st| {
            let d = decide(
                &self.config.failover,
                task.observer(),
                st.pinned,
                retryable,
                st.switches,
                &ranked,
                current,
            );
            if let Decision::Retry(_) = d {
                st.switches += 1;
            }
            (d, st.switches)
        });
        match decision {
            (Decision::Retry(to), switches) => {
                self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                let segment = task.request().peer.name().to_string();
                tracing::debug!(%segment, from = current.name(), to = to.name(), switches, %error, "failover");
                self.emit(EngineEvent::Failover {
                    segment,
                    from: current,
                    to,
                    attempt: switches,
                    reason: error.to_string(),
                });
                self.start_attempt(task, to);
            }
            (Decision::Fail(why), _) => {
                tracing::debug!(?why, %error, "task failed");
                task.fail(error);
            }
        }
    }
}

impl Inner {
    /// The control address of segment `name` with etcd metadata, and the revision to watch
    /// its record from (`None` when the segment is already open and watched).
    async fn resolve(&self, m: &Registry, name: &str) -> Result<(String, Option<i64>)> {
        if let Some(peer) = self.segments.by_name(name) {
            return Ok((peer.addr(), None));
        }
        let (record, revision) = m.resolve(name).await?;
        Ok((record.addr, Some(revision)))
    }

    /// Declares `peer` lost: every transport fails its in-flight work towards it at once.
    fn declare_lost(&self, peer: &Arc<Peer>, reason: String) {
        if !peer.mark_lost(&reason) {
            return;
        }
        self.stats.peers_lost.fetch_add(1, Ordering::Relaxed);
        // The event goes first, so that listeners learn of the loss before the failures.
        self.emit(EngineEvent::PeerLost {
            segment: peer.name().to_string(),
            reason,
        });
        for t in self.transports.values() {
            t.fail_peer(peer, peer.lost_error());
        }
    }

    /// Sets up every transport towards `peer` (shm maps its buffers, rdma connects queue
    /// pairs); a failure only leaves that transport unable to reach the peer.
    async fn attach_transports(&self, peer: &Arc<Peer>) {
        #[cfg(target_os = "linux")]
        if let Some(shm) = &self.shm {
            if let Err(e) = shm.attach(peer).await {
                tracing::info!(peer = peer.name(), error = %e, "shared memory unavailable; using the network");
            }
        }
        let pending: Vec<_> = self
            .enabled
            .iter()
            .filter_map(|k| Some((*k, self.transports.get(k)?.attach(peer)?)))
            .collect();
        for (kind, fut) in pending {
            if let Err(e) = fut.await {
                tracing::info!(peer = peer.name(), transport = kind.name(), error = %e, "transport cannot reach this peer");
            }
        }
    }

    /// Tells every enabled transport about a new local region.
    fn region_added(&self, region: &Arc<Region>) {
        for kind in &self.enabled {
            if let Some(t) = self.transports.get(kind) {
                if let Err(e) = t.region_added(region) {
                    tracing::warn!(transport = kind.name(), region = region.id(), error = %e, "region not served by this transport");
                }
            }
        }
    }

    fn note_success(&self, task: &Task) {
        if self.health_dirty.load(Ordering::Relaxed) {
            if let Some(kind) = task.transport() {
                self.health.record_success(
                    &(task.request().peer.handle(), kind),
                    std::time::Instant::now(),
                );
            }
        }
    }
}

/// Fails attempts that pass their deadline (they then fail over like any failed attempt).
async fn sweep_deadlines(inner: Weak<Inner>, cancel: CancellationToken) {
    let tick = match inner.upgrade() {
        Some(i) => i.deadlines.tick(),
        None => return,
    };
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        for (task, attempt) in inner.deadlines.expired(std::time::Instant::now()) {
            let Some(task) = task.upgrade() else { continue };
            if task.attempt() == attempt && !task.status().is_terminal() {
                inner.stats.attempt_timeouts.fetch_add(1, Ordering::Relaxed);
                task.attempt_failed(attempt, Error::Timeout);
            }
        }
    }
}

/// Routes link events to the engine without keeping it alive.
struct Events(Weak<Inner>);

impl LinkEvents for Events {
    fn peer_lost(&self, peer: &Arc<Peer>, reason: String) {
        if let Some(inner) = self.0.upgrade() {
            inner.declare_lost(peer, reason);
        }
    }

    fn peer_back(&self, peer: &Arc<Peer>) {
        let was_lost = peer.mark_alive();
        if let Some(inner) = self.0.upgrade() {
            // Transports set up again (idempotent: a second notice finds them set up).
            let (engine, p) = (inner.clone(), peer.clone());
            inner
                .handle
                .spawn(async move { engine.attach_transports(&p).await });
            if was_lost {
                inner.stats.peers_recovered.fetch_add(1, Ordering::Relaxed);
                inner.emit(EngineEvent::PeerRecovered {
                    segment: peer.name().to_string(),
                });
            }
        }
    }
}

/// Aggregates snapshots (used by the Promise path to pick the outcome).
pub fn outcome_status(snaps: &[TaskSnapshot]) -> TransferStatus {
    aggregate(snaps.iter().map(|s| s.status))
}

#[cfg(test)]
mod advertise_tests {
    use super::{advertised_name, EngineConfig, TransportKind};
    use std::time::Duration;

    #[test]
    fn settings_out_of_bounds_are_refused_by_name() {
        assert_eq!(EngineConfig::default().validate(), Ok(()));
        type Change = Box<dyn Fn(&mut EngineConfig)>;
        let bad: Vec<(&str, Change)> = vec![
            (
                "peerTimeoutMs",
                Box::new(|c| c.peer_timeout = Duration::ZERO),
            ),
            (
                "peerTimeoutMs",
                Box::new(|c| c.peer_timeout = Duration::from_secs(3601)),
            ),
            ("ioThreads", Box::new(|c| c.io_threads = 0)),
            (
                "connectionsPerPeer",
                Box::new(|c| c.tcp.connections_per_peer = 65),
            ),
            ("sliceSize", Box::new(|c| c.tcp.slice_size = 100)),
            (
                "connectTimeoutMs",
                Box::new(|c| c.tcp.connect_timeout = Duration::ZERO),
            ),
            (
                "maxFailoverAttempts",
                Box::new(|c| c.failover.max_failover_attempts = 100_000),
            ),
            (
                "attemptTimeoutMs",
                Box::new(|c| c.failover.attempt_timeout = Some(Duration::ZERO)),
            ),
            ("transports", Box::new(|c| c.transports.clear())),
            (
                "transports",
                Box::new(|c| c.transports = vec![TransportKind::Tcp, TransportKind::Tcp]),
            ),
        ];
        for (name, change) in bad {
            let mut c = EngineConfig::default();
            change(&mut c);
            let err = c.validate().expect_err(name);
            assert_eq!(err.code(), "ERR_FERRY_INVALID_ARGUMENT");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
        let mut c = EngineConfig::default();
        c.failover.max_failover_attempts = crate::failover::MAX_FAILOVER_ATTEMPTS;
        c.failover.attempt_timeout = None;
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn advertise_takes_host_or_host_port() {
        assert_eq!(
            advertised_name("10.0.0.2", 7000).expect("ip"),
            "10.0.0.2:7000"
        );
        assert_eq!(
            advertised_name("10.0.0.2:9", 7000).expect("ip:port"),
            "10.0.0.2:9"
        );
        assert_eq!(
            advertised_name("node-3", 7000).expect("host"),
            "node-3:7000"
        );
        assert_eq!(
            advertised_name("node-3:81", 7000).expect("host:port"),
            "node-3:81"
        );
        assert_eq!(advertised_name("::1", 7000).expect("v6"), "[::1]:7000");
        assert_eq!(
            advertised_name("[::1]:5", 7000).expect("v6 port"),
            "[::1]:5"
        );
        for bad in [
            "",
            " ",
            "0.0.0.0",
            "a:b",
            "a:0",
            "10.0.0.1:0",
            "h:70000",
            "http://x",
        ] {
            let e = advertised_name(bad, 7000).expect_err(bad);
            assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT", "{bad}");
        }
    }
}

#[cfg(test)]
mod teardown_tests {
    use super::*;
    use crate::request::Opcode;

    fn tcp_only() -> EngineConfig {
        EngineConfig {
            transports: vec![TransportKind::Tcp],
            ..EngineConfig::default()
        }
    }

    fn write(local: &Region, seg: u64, remote: &Region, len: u64) -> Request {
        Request {
            opcode: Opcode::Write,
            local: local.id(),
            local_offset: 0,
            segment: seg,
            remote_buffer: remote.id(),
            remote_offset: 0,
            length: len,
            transport: None,
            require_transport: false,
        }
    }

    fn inner_of(e: &Engine) -> Weak<Inner> {
        Arc::downgrade(&e.live().expect("open").inner)
    }

    #[test]
    fn close_lets_go_of_the_engine_and_detaches_held_regions() {
        let target = Engine::new(tcp_only()).expect("target");
        let initiator = Engine::new(tcp_only()).expect("initiator");
        let remote = target.allocate(1 << 16).expect("remote");
        let local = initiator.allocate(1 << 16).expect("local");
        let p = local.range_ptr(0, 4096).expect("range");
        // SAFETY: the region is ours and nothing transfers into it yet.
        unsafe { std::ptr::write_bytes(p, 7, 4096) };
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open");
        let snaps = initiator
            .transfer_blocking(&[write(&local, seg.handle, &remote, 4096)])
            .expect("transfer");
        assert_eq!(snaps[0].status, TransferStatus::Completed);
        let released = initiator.allocate(4096).expect("released");
        initiator.release(released.id()).expect("release");

        let weak = inner_of(&initiator);
        let name = initiator.segment_name().to_string();
        initiator.close();
        assert!(
            weak.upgrade().is_none(),
            "nothing keeps the closed engine's resources"
        );
        for r in [&local, &released] {
            assert!(!r.mapping().expect("owned").is_attached(), "memfd closed");
        }
        // SAFETY: the region's range stays mapped while we hold it; nothing writes it now.
        let bytes = unsafe { std::slice::from_raw_parts(p, 4096) };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "a detached region reads zeros"
        );
        // The handle is an inert shell.
        assert!(initiator.is_closed());
        assert_eq!(
            initiator.allocate(1).unwrap_err().code(),
            "ERR_FERRY_CLOSED"
        );
        assert_eq!(
            initiator.allocate_batch(1).unwrap_err().code(),
            "ERR_FERRY_CLOSED"
        );
        assert!(!initiator.cancel(1));
        let m = initiator.metrics();
        assert_eq!((m.tasks_completed, m.segments_open, m.regions), (1, 0, 0));
        assert_eq!(initiator.segment_name(), name);
        initiator.close(); // idempotent
        target.close();
    }

    #[test]
    fn dropping_the_last_handle_closes_the_engine() {
        let engine = Engine::new(tcp_only()).expect("engine");
        let region = engine.allocate(4096).expect("region");
        let weak = inner_of(&engine);
        drop(engine);
        assert!(weak.upgrade().is_none());
        assert!(!region.mapping().expect("owned").is_attached());
    }

    #[test]
    fn ended_attempts_leave_no_deadline_behind() {
        let target = Engine::new(tcp_only()).expect("target");
        let initiator = Engine::new(tcp_only()).expect("initiator");
        let remote = target.allocate(1 << 16).expect("remote");
        let local = initiator.allocate(1 << 16).expect("local");
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open");
        let req = write(&local, seg.handle, &remote, 4096);
        for _ in 0..200 {
            initiator
                .transfer_blocking(std::slice::from_ref(&req))
                .expect("transfer");
        }
        let batch = initiator.allocate_batch(64).expect("batch");
        initiator
            .submit_transfer(batch, &vec![req.clone(); 64])
            .expect("submit");
        let deadline = Instant::now() + Duration::from_secs(20);
        while initiator.batch_status(batch).expect("status").status == TransferStatus::Pending {
            assert!(Instant::now() < deadline, "batch did not finish");
            std::thread::yield_now();
        }
        // Canceled tasks leave none either.
        let pending = initiator.allocate_batch(8).expect("batch");
        initiator
            .submit_transfer(pending, &vec![req; 8])
            .expect("submit");
        initiator.free_batch(pending).expect("free");
        let live = initiator.live().expect("open");
        assert_eq!(live.inner.deadlines.len(), 0);
        assert_eq!(live.inner.ops.lock().expect("ops").len(), 0);
        drop(live);
        initiator.close();
        target.close();
    }

    #[test]
    fn close_ends_an_open_segment_that_the_peer_never_answers_with_closed() {
        // A listener that accepts and never replies.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = silent.local_addr().expect("addr");
        let (accepted_tx, accepted_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let conn = silent.accept().map(|(c, _)| c);
            let _ = accepted_tx.send(());
            // Keep the connection open until the test ends (the sender side drops).
            conn
        });
        let mut cfg = tcp_only();
        cfg.tcp.connect_timeout = Duration::from_secs(30);
        let engine = Engine::new(cfg).expect("engine");
        let (tx, rx) = std::sync::mpsc::channel();
        let opener = engine.clone();
        let name = addr.to_string();
        let open = std::thread::spawn(move || {
            let _ = tx.send(opener.open_segment_blocking(&name));
        });
        accepted_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the engine connected");
        let started = Instant::now();
        engine.close();
        let result = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("open_segment ended");
        assert_eq!(result.unwrap_err().code(), "ERR_FERRY_CLOSED");
        assert!(started.elapsed() < Duration::from_secs(5));
        open.join().expect("opener");
        drop(holder.join().expect("holder"));
    }
}
