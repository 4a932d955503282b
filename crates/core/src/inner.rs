//! What an `Engine` handle points at: the `Shell`, which holds the engine's identity and
//! counters and outlives `close`, and while the engine is open an `Arc<Inner>` with
//! everything else: the runtime, listeners, connections, transports and the region table.
//!
//! `Inner`'s state machine is Open → Closing → Closed, and its `close` is the teardown: it
//! stops new work, cancels what is in flight (waking every waiter), stops the I/O threads,
//! and releases sockets, memfds and mappings. `assembly` builds the shell and `Inner`; the
//! engine's other modules (`submit`, `dispatch`, `peers`, `block_submit`, `notify`) add
//! `Inner`'s methods; `engine` is the public handle over them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustc_hash::FxHashMap;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use crate::attempt::Rail;
use crate::batch::BatchTable;
use crate::config::EngineConfig;
use crate::deadlines::Deadlines;
use crate::error::{Error, Result};
use crate::events::EventHub;
use crate::handle::Handles;
use crate::health::HealthTable;
use crate::kind::TransportKind;
use crate::memory::{Region, RegionTable};
use crate::metadata::Registry;
use crate::pending::Pending;
use crate::segment::SegmentTable;
use crate::server::LocalSegment;
use crate::status::TransferStatus;
use crate::task::{Counters, Holder, Task};
use crate::transport::Transport;

pub(crate) const OPEN: u8 = 0;
const CLOSING: u8 = 1;
const CLOSED: u8 = 2;

/// Everything an open engine owns; built by `assembly`.
pub(crate) struct Inner {
    pub(crate) state: AtomicU8,
    pub(crate) engine_id: u64,
    pub(crate) config: EngineConfig,
    pub(crate) local: Arc<LocalSegment>,
    pub(crate) runtime: Mutex<Option<Runtime>>,
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) shutdown: CancellationToken,
    pub(crate) regions: Arc<RegionTable>,
    pub(crate) segments: SegmentTable,
    /// The shell's (`Shell::batches`).
    pub(crate) batches: Arc<BatchTable>,
    /// The enabled transports (built and installed), in the order of `config.transports`.
    pub(crate) transports: Vec<(TransportKind, Arc<dyn Transport>)>,
    /// For each transport that is not enabled, the message that says so (and why).
    pub(crate) not_enabled: Vec<(TransportKind, Arc<str>)>,
    pub(crate) deadlines: Arc<Deadlines<Task>>,
    /// Error history per (peer, transport): failing paths rank last for a cooldown.
    pub(crate) health: HealthTable<Rail>,
    /// Set once any error was recorded, so successes skip the table until then.
    pub(crate) health_dirty: Arc<AtomicBool>,
    /// Operations of `transfer` in flight, for `cancel` and `close`: each holds its tasks
    /// once they are made (the completion hook takes them out).
    pub(crate) ops: Mutex<FxHashMap<u64, Holder>>,
    pub(crate) next_op: AtomicU64,
    pub(crate) stats: Arc<Stats>,
    /// Runtime threads (workers and blocking pool) that are running now.
    pub(crate) threads: Arc<AtomicUsize>,
    /// Futures started with `Engine::spawn` that have not ended yet.
    pub(crate) spawned: Arc<Pending>,
    pub(crate) events: EventHub,
    pub(crate) metadata: Option<Arc<Registry>>,
    /// The outboxes of the notifications this engine sends (`notify`).
    pub(crate) notifier: crate::notify::outbox::Notifier,
}

/// Counters that outlive the engine's resources, so that `metrics()` works after close.
#[derive(Default)]
pub(crate) struct Stats {
    /// Tasks submitted and ended, in lanes (`task::Counters`).
    pub(crate) counters: Counters,
    pub(crate) peers_lost: AtomicU64,
    pub(crate) peers_recovered: AtomicU64,
    pub(crate) failovers: AtomicU64,
    /// Verified transfers that failed their end-to-end check (`verify`), by transport.
    pub(crate) integrity_failures: crate::metrics::PerTransport,
    pub(crate) attempt_timeouts: AtomicU64,
    pub(crate) transports_disabled: AtomicU64,
    pub(crate) notify: Arc<crate::metrics::NotifyCounters>,
    /// Transfers per peer name, a bounded number of series (`peer_series`).
    pub(crate) peers: crate::peer_series::PeerSeriesTable,
}

/// How long `close` waits for futures started with `Engine::spawn` to end once the engine
/// signalled shutdown (the engine's own async calls end at once with `Closed`).
const SPAWNED_GRACE: Duration = Duration::from_secs(1);

/// How long `close` waits for its goodbye to be written on every connection that owes one.
const GOODBYE_GRACE: Duration = Duration::from_millis(250);

/// What an `Engine` handle points at: the identity and counters, which stay, and the live
/// engine, which `close` takes away.
pub(crate) struct Shell {
    pub(crate) engine_id: u64,
    pub(crate) name: String,
    pub(crate) local_addr: SocketAddr,
    pub(crate) config: EngineConfig,
    pub(crate) stats: Arc<Stats>,
    /// Kept past close, so a handle is still told apart from a foreign one then.
    pub(crate) handles: Handles,
    pub(crate) live: ArcSwapOption<Inner>,
    /// The batch table, here as well as in `Inner`: a poller's calls on its batches
    /// (allocate, status, free) need nothing else of the live engine, so they take no
    /// reference to it. `close` empties it.
    pub(crate) batches: Arc<BatchTable>,
    /// Set by `Engine::close` before it takes the live engine away: the batch calls answer
    /// `Closed` from then on.
    pub(crate) closed: AtomicBool,
}

impl Shell {
    /// The batch table, while the engine is open.
    pub(crate) fn open_batches(&self) -> Result<&BatchTable> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(&self.batches)
    }

    /// A batch lookup that failed once close began reports `Closed`, not the empty table.
    pub(crate) fn or_closed(&self, e: Error) -> Error {
        if self.closed.load(Ordering::Acquire) {
            Error::Closed
        } else {
            e
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The last handle went without `close`: close now, so that the runtime (whose tasks
        // may hold the live engine) cannot keep it alive.
        if let Some(inner) = self.live.swap(None) {
            inner.close();
        }
    }
}

impl Inner {
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) != OPEN
    }

    /// A lookup that failed while `close` ran reports `Closed`, not the empty table.
    pub(crate) fn or_closed(&self, e: Error) -> Error {
        if self.is_closed() {
            Error::Closed
        } else {
            e
        }
    }

    pub(crate) fn batch(&self, batch: u64) -> Result<Arc<crate::batch::Batch>> {
        self.check_open()?;
        self.batches.get(batch).map_err(|e| self.or_closed(e))
    }

    /// The enabled transport of `kind`.
    pub(crate) fn transport(&self, kind: TransportKind) -> Option<&Arc<dyn Transport>> {
        self.transports
            .iter()
            .find_map(|(k, t)| (*k == kind).then_some(t))
    }

    /// Tells every enabled transport about a new local region.
    pub(crate) fn region_added(&self, region: &Arc<Region>) {
        for (kind, t) in &self.transports {
            if let Err(e) = t.region_added(region) {
                tracing::warn!(transport = kind.name(), region = region.id(), error = %e, "region not served by this transport");
            }
        }
    }

    pub(crate) fn emit(&self, event: crate::events::EngineEvent) {
        self.events.emit(event, !self.is_closed());
    }

    /// Tears the engine down (`Engine::close`, or the last handle dropped): see the
    /// module's doc. Idempotent.
    pub(crate) fn close(&self) {
        if self
            .state
            .compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        // Inside some runtime (possibly our own) we may not block.
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        // Peers are told first, so that they report this engine `closed` (not crashed, not
        // its etcd record gone) before its connections go.
        let grace = if in_runtime {
            Duration::ZERO
        } else {
            GOODBYE_GRACE
        };
        if !self.local.farewell.say(grace) {
            tracing::debug!("closing before every peer was told goodbye");
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
            .flat_map(|(_, held)| held.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect();
        for batch in self.batches.drain() {
            pending.extend(batch.tasks());
        }
        for t in &pending {
            t.finish(TransferStatus::Canceled, Some(Error::Closed));
        }
        if !in_runtime && !self.spawned.wait_idle(SPAWNED_GRACE) {
            tracing::debug!("futures started with spawn still running at close; dropped");
        }
        for (_, t) in &self.transports {
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
        self.events.set_sink(None);
        self.state.store(CLOSED, Ordering::Release);
        tracing::debug!(segment = %self.local.name, "engine closed");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}
