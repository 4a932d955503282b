//! Building an engine from its settings: the runtime, the listener, the transports (every
//! one through a [`TransportFactory`]), the local segment, the metadata registry.
//!
//! A new transport is a factory: add it to [`factories`] (or pass it in
//! `EngineConfig::extra_transports`), its kind to `kind.rs`, and nothing here changes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::batch::BatchTable;
use crate::config::{advertised_name, EngineConfig};
use crate::deadlines::Deadlines;
use crate::error::{Error, Result};
use crate::events::{EngineEvent, EventHub};
use crate::farewell::Farewell;
use crate::handle::Handles;
use crate::health::HealthTable;
use crate::inner::{Inner, Shell, Stats, OPEN};
use crate::kind::TransportKind;
use crate::memory::RegionTable;
use crate::metadata::EngineIdentity;
use crate::notify::inbox::Inbox;
use crate::notify::outbox::{Notifier, OutboxConfig};
use crate::segment::SegmentTable;
use crate::server::{accept_loop, LocalSegment};
use crate::transport::{
    AnsweredHook, ControlPeers, LostHook, Transport, TransportContext, TransportFactory,
};
use crate::transports::fault::FaultFactory;
use crate::transports::tcp::TcpFactory;
use crate::wire::Token;

/// Every factory the settings ask for: the built-in transports, then the extra ones,
/// each wrapped with its fault injection when `faults` names it.
fn factories(config: &EngineConfig) -> Vec<Arc<dyn TransportFactory>> {
    let mut all: Vec<Arc<dyn TransportFactory>> = vec![Arc::new(TcpFactory(config.tcp))];
    #[cfg(target_os = "linux")]
    all.push(Arc::new(crate::transports::shm::ShmFactory));
    all.extend(config.extra_transports.iter().cloned());
    all.into_iter()
        .map(
            |f| match config.faults.iter().find(|(k, _)| *k == f.kind()) {
                Some((_, spec)) => Arc::new(FaultFactory {
                    inner: f,
                    spec: spec.clone(),
                }) as Arc<dyn TransportFactory>,
                None => f,
            },
        )
        .collect()
}

/// Enabled transports, in the order of `config.transports`.
type Enabled = Vec<(TransportKind, Arc<dyn Transport>)>;
/// Why each requested transport that is not enabled is not.
type Disabled = HashMap<TransportKind, String>;

/// The transports of `config.transports`, built and installed in that order, and why each
/// one that is not is disabled.
fn build_transports(config: &EngineConfig, context: &TransportContext) -> (Enabled, Disabled) {
    let factories = factories(config);
    let mut enabled = Vec::new();
    let mut disabled = HashMap::new();
    for kind in &config.transports {
        let Some(factory) = factories.iter().find(|f| f.kind() == *kind) else {
            tracing::info!(
                transport = kind.name(),
                "transport not available in this build"
            );
            disabled.insert(*kind, "not available in this build".to_string());
            continue;
        };
        let built = factory.build(context.clone()).and_then(|t| {
            t.install().map_err(|e| {
                t.shutdown();
                Error::TransportUnavailable(format!("install failed: {e}"))
            })?;
            Ok(t)
        });
        match built {
            Ok(t) => enabled.push((*kind, t)),
            Err(e) => {
                let why = match e {
                    Error::TransportUnavailable(why) => why,
                    other => other.to_string(),
                };
                tracing::info!(transport = kind.name(), reason = %why, "transport disabled");
                disabled.insert(*kind, why);
            }
        }
    }
    (enabled, disabled)
}

/// Starts an engine.
pub(crate) fn assemble(config: EngineConfig) -> Result<Shell> {
    config.validate()?;
    // The latency stamps' source is calibrated once per process, here, not on a transfer.
    crate::ticks::prepare();
    let threads = Arc::new(AtomicUsize::new(0));
    let (started, stopped) = (threads.clone(), threads.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.io_threads)
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
    let std_listener = std::net::TcpListener::bind(&config.listen)
        .map_err(|e| Error::InvalidArgument(format!("cannot listen on {}: {e}", config.listen)))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("listen", &e))?;
    crate::net::deepen_backlog(&std_listener)?;
    let local_addr = std_listener
        .local_addr()
        .map_err(|e| Error::io("listen", &e))?;
    crate::config::check_exposure(&config, local_addr)?;
    crate::config::check_encrypt(&config)?;
    let secret = crate::config::effective_secret(&config, crate::user_secret::user_secret)?;
    let name = segment_name(&config, local_addr)?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(std_listener).map_err(|e| Error::io("listen", &e))?
    };
    let engine_id = random_u64();
    let mut token: Token = [0u8; 16];
    token[..8].copy_from_slice(&random_u64().to_le_bytes());
    token[8..].copy_from_slice(&random_u64().to_le_bytes());
    let regions = Arc::new(RegionTable::default());
    let admission = Admission::new(config.connections, crate::resource::open_files_limit());
    let credentials = crate::auth::register(engine_id, secret.clone(), config.encrypt);
    let control_peers: Arc<ControlPeers> = Arc::default();
    let machine_id = config.machine_id.clone().unwrap_or_else(machine_identity);
    let shutdown = CancellationToken::new();
    let handle = runtime.handle().clone();
    // Transports report a dead peer through the engine, which does not exist yet: the
    // hook reads it from this slot once it does.
    let slot: Arc<OnceLock<Weak<Inner>>> = Arc::default();
    let lost_slot = slot.clone();
    let lost: LostHook = Arc::new(move |peer, reason| {
        if let Some(inner) = lost_slot.get().and_then(Weak::upgrade) {
            inner.declare_lost(peer, reason);
        }
    });
    let answered_slot = slot.clone();
    let answered: AnsweredHook = Arc::new(move |peer, engine_id| {
        if let Some(inner) = answered_slot.get().and_then(Weak::upgrade) {
            inner.incarnation_answered(peer, engine_id);
        }
    });
    let farewell: Arc<Farewell> = Arc::default();
    let tick = config
        .failover
        .attempt_timeout
        .map(|t| (t / 10).clamp(Duration::from_millis(5), Duration::from_millis(100)))
        .unwrap_or(Duration::from_millis(100));
    let deadlines = Arc::new(Deadlines::new(
        std::time::Instant::now(),
        tick,
        config.failover.attempt_timeout.unwrap_or_default(),
    ));
    let context = TransportContext {
        engine_id,
        machine_id: machine_id.clone(),
        handle: handle.clone(),
        shutdown: shutdown.child_token(),
        regions: regions.clone(),
        lost,
        answered,
        control_peers: control_peers.clone(),
        token,
        secret: secret.clone(),
        admission: admission.clone(),
        shm_any_uid: config.shm_any_uid,
        frame_timeout: config.frame_timeout,
        farewell: farewell.clone(),
        attempt_timeout: config.failover.attempt_timeout,
        deadlines: config.failover.attempt_timeout.map(|_| deadlines.clone()),
    };
    let (transports, disabled) = {
        let _guard = runtime.enter();
        build_transports(&config, &context)
    };
    // Every requested transport that cannot be used is reported to the first subscriber,
    // with the reason.
    let backlog: Vec<EngineEvent> = config
        .transports
        .iter()
        .filter_map(|kind| {
            Some(EngineEvent::TransportDisabled {
                transport: *kind,
                segment: None,
                reason: disabled.get(kind)?.clone(),
                until_ms: None,
            })
        })
        .collect();
    let stats = Arc::new(Stats::default());
    let local = Arc::new(LocalSegment {
        engine_id,
        name,
        machine_id: machine_id.clone(),
        token,
        regions: regions.clone(),
        transports: crate::kind::DEFAULT_ORDER
            .into_iter()
            .filter_map(|k| Some((k, transports.iter().find(|(t, _)| *t == k)?.1.clone())))
            .collect(),
        control_peers,
        secret,
        encrypt: config.encrypt,
        admission,
        frame_timeout: config.frame_timeout,
        notify_inbox: Arc::new(Inbox::new(
            engine_id,
            config.notify.queue_size,
            stats.notify.clone(),
        )),
        notify_max_bytes: config.notify.max_bytes,
        farewell,
        _credentials: credentials,
    });
    let metadata = match &config.metadata {
        None => None,
        Some(etcd) => {
            let identity = EngineIdentity {
                addr: &local.name,
                engine_id,
                machine_id: &machine_id,
            };
            match crate::metadata::register(&handle, etcd, identity, &shutdown) {
                Ok(m) => Some(m),
                Err(e) => {
                    shutdown.cancel();
                    for (_, t) in &transports {
                        t.shutdown();
                    }
                    runtime.shutdown_background();
                    return Err(e);
                }
            }
        }
    };
    handle.spawn(accept_loop(listener, local.clone(), shutdown.clone()));
    let handles = Handles::default();
    // Notifications name their sender as peers open it: its etcd name when published there.
    let outbox = OutboxConfig {
        engine_id,
        name: metadata
            .as_ref()
            .map_or_else(|| local.name.clone(), |m| m.name().to_string()),
        connect_timeout: config.tcp.connect_timeout,
        deadline: config.peer_timeout + config.tcp.connect_timeout,
    };
    let notifier = Notifier::new(outbox, stats.notify.clone(), shutdown.child_token());
    let batches = Arc::new(BatchTable::new(handles));
    let inner = Arc::new(Inner {
        state: AtomicU8::new(OPEN),
        engine_id,
        config: config.clone(),
        local,
        runtime: Mutex::new(Some(runtime)),
        handle,
        shutdown,
        regions,
        segments: SegmentTable::default(),
        batches: batches.clone(),
        transports,
        not_enabled: not_enabled_messages(&config, &disabled),
        deadlines,
        health: HealthTable::new(config.rail),
        health_dirty: Arc::default(),
        ops: Mutex::new(rustc_hash::FxHashMap::default()),
        next_op: AtomicU64::new(1),
        stats: stats.clone(),
        threads,
        spawned: Arc::default(),
        events: EventHub::with_backlog(backlog),
        metadata,
        notifier,
    });
    let _ = slot.set(Arc::downgrade(&inner));
    let driver: Weak<dyn crate::task::Driver> =
        Arc::downgrade(&inner) as Weak<dyn crate::task::Driver>;
    stats.counters.connect(driver, &inner.health_dirty);
    if inner.config.failover.attempt_timeout.is_some() {
        inner.handle.spawn(crate::dispatch::sweep_deadlines(
            Arc::downgrade(&inner),
            inner.shutdown.clone(),
        ));
    }
    tracing::debug!(segment = %inner.local.name, "engine started");
    let name = match &inner.metadata {
        Some(m) => m.name().to_string(),
        None => inner.local.name.clone(),
    };
    Ok(Shell {
        engine_id,
        name,
        local_addr,
        config,
        stats,
        handles,
        live: arc_swap::ArcSwapOption::new(Some(inner)),
        batches,
        closed: std::sync::atomic::AtomicBool::new(false),
    })
}

/// What a request is told about each transport that is not enabled here.
fn not_enabled_messages(
    config: &EngineConfig,
    disabled: &Disabled,
) -> Vec<(TransportKind, Arc<str>)> {
    crate::kind::DEFAULT_ORDER
        .into_iter()
        .filter(|k| !config.transports.contains(k) || disabled.contains_key(k))
        .map(|k| {
            let why = match disabled.get(&k) {
                Some(why) => format!("{k} is disabled on this engine: {why}"),
                None => format!("{k} is not enabled on this engine"),
            };
            (k, why.into())
        })
        .collect()
}

/// The p2p segment name: the advertise address, else the bound one (127.0.0.1 for an
/// unspecified one).
fn segment_name(config: &EngineConfig, local_addr: SocketAddr) -> Result<String> {
    Ok(match &config.advertise {
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
    })
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
