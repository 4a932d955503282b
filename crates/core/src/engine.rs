//! The engine's public handle.
//!
//! `Engine` is a cheap handle over a shell that holds the engine's identity and counters
//! and, while it is open, an `Arc<Inner>` with everything else: the runtime, listeners,
//! connections, transports and the region table (both in `inner`, with the teardown). The
//! state machine is Open → Closing → Closed. `close()` stops new work, cancels what is in flight (waking every waiter), stops
//! the I/O threads, and then lets go of `Inner`, so sockets, memfds, mappings and threads are
//! released when `close()` returns — not when the last handle is dropped. Handles that
//! outlive it are inert: every call returns `Closed`, and the counters stay readable. Close
//! is idempotent, and safe to race with status reads from any number of threads: they get a
//! terminal status or `Closed`.
//!
//! The decisions live elsewhere, pure: which transports may serve a request (`plan`), what
//! follows a failed attempt (`attempt`), when a peer is lost (`liveness`). This module and
//! its helpers carry them out: `assembly` builds an engine, `submit` turns requests into
//! tasks, `dispatch` runs attempts, `peers` opens segments and handles their loss.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::block_submit::BlockSubmission;
use crate::blocks::{BlockOutcome, Blocks};
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::events::EventSink;
use crate::handle::Handles;
use crate::inner::{Inner, Shell};
use crate::kind::TransportKind;
use crate::memory::{Access, KeepAlive, Region, RegionId};
use crate::metrics::Metrics;
use crate::request::Request;
use crate::segment::BufferDescriptor;
use crate::status::TransferStatus;
use crate::task::TaskSnapshot;

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

impl SegmentInfo {
    /// `peer` as known now.
    pub(crate) fn of(peer: &crate::segment::Peer) -> Self {
        let desc = peer.descriptor();
        Self {
            handle: peer.handle(),
            name: peer.name().to_string(),
            engine_id: desc.engine_id,
            buffers: desc.buffers.clone(),
        }
    }
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

impl Engine {
    /// Starts an engine: binds the listen address and starts its I/O threads.
    pub fn new(config: EngineConfig) -> Result<Self> {
        let shell = crate::assembly::assemble(config)?;
        Ok(Self {
            shell: Arc::new(shell),
        })
    }

    /// The open engine for the duration of one call, or `Closed`. Holding it keeps
    /// `Inner` alive, so it is never kept beyond the call.
    pub(crate) fn live(&self) -> Result<Arc<Inner>> {
        let Some(inner) = self.shell.live.load_full() else {
            return Err(Error::Closed);
        };
        inner.check_open()?;
        Ok(inner)
    }

    /// Runs `f` on the open engine, or returns `Closed`: [`Engine::live`] for the calls a
    /// poller makes in a loop, without taking a reference of the shared count.
    fn with_live<R>(&self, f: impl FnOnce(&Arc<Inner>) -> Result<R>) -> Result<R> {
        let guard = self.shell.live.load();
        // let-else, not `ok_or`: no error made (and dropped) on every call.
        let Some(inner) = guard.as_ref() else {
            return Err(Error::Closed);
        };
        inner.check_open()?;
        f(inner)
    }

    /// A weak handle (for cleanup hooks that must not keep the engine alive).
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.shell))
    }

    /// Whether `close` has been called.
    pub fn is_closed(&self) -> bool {
        self.live().is_err()
    }

    /// This engine's segment name, which peers pass to `open_segment`: `host:port`, or the
    /// logical name published in etcd.
    pub fn segment_name(&self) -> &str {
        &self.shell.name
    }

    /// The warning an engine started with when it serves beyond loopback without a secret
    /// (allowed by `allow_unauthenticated`); `None` otherwise.
    pub fn exposure_warning(&self) -> Option<String> {
        crate::config::exposure_warning(&self.shell.config, self.shell.local_addr)
    }

    /// Test hook: stops (or resumes) this engine's etcd keep-alives without revoking its
    /// lease, as if the engine had died. No effect without etcd metadata.
    #[doc(hidden)]
    pub fn pause_metadata_keepalive(&self, paused: bool) {
        if let Some(m) = self.live().ok().and_then(|l| l.metadata.clone()) {
            m.pause_keepalive(paused);
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
            l.events.set_sink(sink);
        }
    }

    // ---- memory -------------------------------------------------------------------

    /// Allocates an engine-owned, page-aligned, zero-filled region.
    pub fn allocate(&self, len: u64) -> Result<Arc<Region>> {
        let l = self.live()?;
        let region = l.regions.allocate(len)?;
        l.region_added(&region);
        Ok(region)
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
        let l = self.live()?;
        // SAFETY: forwarded from this function's contract.
        let region = unsafe { l.regions.register(ptr, len, access, keep_alive) }?;
        l.region_added(&region);
        Ok(region)
    }

    /// Releases a region (allocated or registered). In-flight transfers finish first.
    pub fn release(&self, id: RegionId) -> Result<()> {
        let l = self.live()?;
        l.regions.release(id)?;
        for (_, t) in &l.transports {
            t.region_released(id);
        }
        Ok(())
    }

    /// Looks a local region up.
    pub fn region(&self, id: RegionId) -> Result<Arc<Region>> {
        self.live()?.regions.get(id)
    }

    // ---- segments -----------------------------------------------------------------

    /// Opens (or refreshes) a remote segment by name: `host:port`, or with etcd metadata
    /// a name registered there (`Metadata` error when etcd cannot be asked).
    ///
    /// `close()` ends a pending call at once with `Closed`, whatever the peer does. Dropping
    /// the future abandons the open (a segment already inserted stays open).
    pub async fn open_segment(&self, name: &str) -> Result<SegmentInfo> {
        let live = self.live()?;
        let closed = live.shutdown.clone();
        tokio::select! {
            biased;
            _ = closed.cancelled() => Err(Error::Closed),
            r = live.open_segment(name) => r.map_err(|e| if closed.is_cancelled() { Error::Closed } else { e }),
        }
    }

    /// What this engine knows now of segment `handle`: the peer's incarnation and buffers
    /// as last fetched — by the open, the link or the etcd watch (a restart), a request
    /// naming a buffer not listed yet, or [`Engine::refresh_segment`].
    pub fn segment_info(&self, handle: u64) -> Result<SegmentInfo> {
        let live = self.live()?;
        Ok(SegmentInfo::of(&*live.segments.get(handle)?))
    }

    /// Fetches segment `handle`'s descriptor from the peer now and applies it (a new
    /// incarnation ends the old one, buffers allocated since become known); returns it.
    pub async fn refresh_segment(&self, handle: u64) -> Result<SegmentInfo> {
        let live = self.live()?;
        let peer = live.segments.get(handle)?;
        let closed = live.shutdown.clone();
        tokio::select! {
            biased;
            _ = closed.cancelled() => Err(Error::Closed),
            r = live.refresh(&peer) => r.map(|()| SegmentInfo::of(&peer)).map_err(|e| if closed.is_cancelled() { Error::Closed } else { e }),
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
        let l = self.live()?;
        let guard = l.spawned.enter();
        l.handle.spawn(async move {
            let _guard = guard;
            fut.await;
        });
        Ok(())
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
        let l = self.live()?;
        let peer = l.segments.get(handle)?;
        Ok(match l.path(kind, &peer).why_not() {
            None => Ok(()),
            Some(why) => Err(why.to_string()),
        })
    }

    /// Closes a segment: its link stops and its in-flight work fails.
    pub fn close_segment(&self, handle: u64) -> Result<()> {
        self.live()?.close_segment(handle)
    }

    // ---- submission ---------------------------------------------------------------

    /// Allocates a batch for up to `capacity` tasks.
    pub fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        self.shell.open_batches()?.allocate(capacity)
    }

    /// Validates every request, then submits them as tasks of `batch`. Returns the index
    /// of the first new task. On any error nothing is submitted.
    pub fn submit_transfer(&self, batch: u64, requests: &[Request]) -> Result<usize> {
        self.with_live(|l| l.submit_transfer(batch, requests))
    }

    /// Status of one task.
    pub fn transfer_status(&self, batch: u64, task: usize) -> Result<TaskSnapshot> {
        let l = self.live()?;
        let b = l.batch(batch)?;
        b.snapshot(task).ok_or(Error::InvalidTask {
            batch,
            task: task as u64,
        })
    }

    /// Status of every task of a batch.
    pub fn transfer_status_list(&self, batch: u64) -> Result<Vec<TaskSnapshot>> {
        Ok(self.live()?.batch(batch)?.snapshots())
    }

    /// Aggregate status of a batch.
    pub fn batch_status(&self, batch: u64) -> Result<BatchSnapshot> {
        let (status, transferred, tasks) = self
            .shell
            .open_batches()?
            .with(batch, |b| b.status())
            .map_err(|e| self.shell.or_closed(e))?;
        Ok(BatchSnapshot {
            status,
            transferred,
            tasks,
        })
    }

    /// Blocks the calling thread until every task of `batch` has ended, or for at most
    /// `timeout`; returns the batch's status then (still pending after a timeout). For
    /// native pollers that would otherwise spin or sleep between status reads: a task
    /// ending wakes the waiter at once. Freeing or closing ends the wait too.
    pub fn wait_batch(&self, batch: u64, timeout: Duration) -> Result<BatchSnapshot> {
        let b = self.with_live(|l| l.batch(batch))?;
        b.wait_until(Instant::now() + timeout);
        let (status, transferred, tasks) = b.status();
        Ok(BatchSnapshot {
            status,
            transferred,
            tasks,
        })
    }

    /// Frees a batch. Tasks still pending are canceled, and it returns once nothing of
    /// theirs can land any more (`fence`), or after the attempt deadline at most.
    pub fn free_batch(&self, batch: u64) -> Result<()> {
        let batches = self.shell.open_batches()?;
        let crate::batch::Freed::Taken(b) =
            batches.free(batch).map_err(|e| self.shell.or_closed(e))?
        else {
            return Ok(());
        };
        let entries = b.take_entries();
        // Most were polled to their end: no error is made (and dropped) for those.
        let live = entries.iter().filter_map(|e| e.task());
        let mut canceled = false;
        for t in live.filter(|t| !t.status().is_terminal()) {
            canceled |= t.finish(TransferStatus::Canceled, Some(Error::Canceled));
        }
        if canceled {
            let bound = crate::fence::settle_bound(self.config().failover.attempt_timeout);
            b.wake().wait_until(
                || {
                    let mut live = entries.iter().filter_map(|e| e.task());
                    live.all(|t| t.shown_status().is_terminal())
                },
                Instant::now() + bound,
            );
        }
        batches.recycle(b, entries);
        Ok(())
    }

    /// Submits `requests` and calls `on_done` once with every task's final snapshot.
    /// Returns an operation id for `cancel`.
    pub fn transfer<F>(&self, requests: &[Request], on_done: F) -> Result<u64>
    where
        F: FnOnce(Vec<TaskSnapshot>) + Send + 'static,
    {
        self.live()?.transfer(requests, on_done)
    }

    /// Submits a block list (`blocks`), merged into requests, and calls `on_done` once
    /// with every block's outcome. Returns the operation id for `cancel` and the number of
    /// requests. Every block is checked before any moves.
    pub fn transfer_blocks<F>(&self, blocks: &Blocks, on_done: F) -> Result<(u64, usize)>
    where
        F: FnOnce(BlockOutcome) + Send + 'static,
    {
        self.live()?.transfer_blocks(blocks, on_done)
    }

    /// Submits a block list as tasks of `batch` (see `transfer_blocks`).
    pub fn submit_blocks(&self, batch: u64, blocks: &Blocks) -> Result<BlockSubmission> {
        self.with_live(|l| l.submit_blocks(batch, blocks))
    }

    /// Writes the raw status of tasks `first_task..` of `batch` into `out`, one byte each,
    /// as many as fit; returns how many were written. Allocates nothing.
    pub fn transfer_status_into(
        &self,
        batch: u64,
        first_task: usize,
        out: &mut [u8],
    ) -> Result<usize> {
        let b = self.with_live(|l| l.batch(batch))?;
        Ok(b.with_entries(|tasks| {
            let tasks = tasks.get(first_task..).unwrap_or_default();
            out.iter_mut()
                .zip(tasks)
                .map(|(o, t)| *o = t.status().raw())
                .count()
        }))
    }

    /// Writes the status of each block of a `submit_blocks` list into `out` (`starts` as
    /// its `BlockMap` has them); returns the blocks not yet terminal.
    pub fn block_status_into(
        &self,
        batch: u64,
        first_task: usize,
        starts: &[u32],
        out: &mut [u8],
    ) -> Result<usize> {
        crate::blocks::check_starts(starts)?;
        let b = self.with_live(|l| l.batch(batch))?;
        Ok(b.with_entries(|tasks| {
            crate::blocks::fill_status(starts, out, |r| {
                first_task
                    .checked_add(r)
                    .and_then(|i| tasks.get(i))
                    .map_or(TransferStatus::Invalid, |t| t.status())
            })
        }))
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

    /// What this engine spreads its work over: I/O threads, tcp lanes per peer, shm copy
    /// threads, as the transports use them. Transports are `None` once it is closed.
    pub fn spread(&self) -> crate::config::spread::EngineSpread {
        let mut out = crate::config::spread::EngineSpread {
            io_threads: self.config().io_threads,
            ..Default::default()
        };
        if let Ok(l) = self.live() {
            for (kind, t) in &l.transports {
                let s = t.spread();
                match kind {
                    crate::kind::TransportKind::Tcp => out.tcp_lanes = s.lanes_per_peer,
                    crate::kind::TransportKind::Shm => out.shm_copy_threads = s.copy_threads,
                    _ => {}
                }
            }
        }
        out
    }

    /// Engine counters. They stay readable after `close` (segments and regions then 0).
    pub fn metrics(&self) -> Metrics {
        let (s, c) = (&self.shell.stats, &self.shell.stats.counters);
        let (segments, regions, auth_failures, connections_refused) = match self.live() {
            Ok(l) => (
                l.segments.len() as u64,
                l.regions.len() as u64,
                l.local.admission.auth_failures(),
                l.local.admission.refused(),
            ),
            Err(_) => (0, 0, Vec::new(), Vec::new()),
        };
        // Ended before submitted: a task is counted submitted before it ends, so the
        // in-flight count (submitted − ended) is never below zero.
        let tasks = c.tasks();
        Metrics {
            tasks_submitted: c.submitted_total(),
            tasks_completed: tasks.completed(),
            tasks_failed: tasks.failed(),
            bytes_transferred: tasks.bytes_total(),
            peers_lost: s.peers_lost.load(Ordering::Relaxed),
            peers_recovered: s.peers_recovered.load(Ordering::Relaxed),
            failovers: s.failovers.load(Ordering::Relaxed),
            integrity_failures: s.integrity_failures.read(),
            attempt_timeouts: s.attempt_timeouts.load(Ordering::Relaxed),
            transports_disabled: s.transports_disabled.load(Ordering::Relaxed),
            segments_open: segments,
            regions,
            auth_failures,
            connections_refused,
            notifications: crate::metrics::NotifyMetrics::read(
                &s.notify,
                self.notifications_queued() as u64,
            ),
            peers: s.peers.read(),
            build: crate::metrics::BuildInfo::of_this_build(),
            ..Metrics::default()
        }
        .with_tasks(&tasks)
        .with_latency(&c.latency())
    }

    /// Notifications this engine sent whose delivery has not ended yet: handed to a peer's
    /// outbox and neither acknowledged by the target nor failed
    /// ([`NotifyCounters::in_flight`]). Three atomic loads, cheap enough to read before
    /// every submission: a sender that notifies faster than its targets acknowledge bounds
    /// its backlog with it. Meaningful while the engine is open.
    ///
    /// [`NotifyCounters::in_flight`]: crate::metrics::NotifyCounters::in_flight
    pub fn notifications_in_flight(&self) -> u64 {
        self.shell.stats.notify.in_flight()
    }

    /// Notifications this engine sent whose delivery ended, delivered or failed: it grows
    /// while a backlog drains. Two atomic loads.
    pub fn notifications_ended(&self) -> u64 {
        self.shell.stats.notify.ended()
    }

    /// Closes the engine. Idempotent; pending work ends CANCELED with `Closed`, pending
    /// async calls end with `Closed`. When it returns, the engine's threads have stopped and
    /// its sockets, memfds and mappings are released (a Buffer still viewing an
    /// engine-owned region then reads zeros); handles and regions that outlive it are inert.
    /// Calls in flight on other threads finish first with what they hold, and release it.
    pub fn close(&self) {
        self.shell.closed.store(true, Ordering::Release);
        if let Some(inner) = self.shell.live.swap(None) {
            inner.close();
            // `inner` is dropped here: the last reference unless a call on another thread
            // still holds one for its duration.
        }
    }

    #[cfg(test)]
    pub(crate) fn inner(&self) -> Arc<Inner> {
        self.live().expect("open")
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
