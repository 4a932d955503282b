//! The TCP transport, initiator side (the serving side lives in `server.rs`). Per peer, a
//! small pool of data connections run by the I/O threads (`pool_conn`, their outgoing
//! frames in `outgoing`); a small awaited request from a thread with an event loop goes on
//! that thread's own connection instead, which its loop watches (`event_loop`,
//! `loop_conn`). Both build request frames in `request` and decode replies in `reply`,
//! the pure core: one encoder and one decoder, so both paths apply the same guards.

pub(crate) mod event_loop;
pub(crate) mod loop_conn;
mod outgoing;
mod pool_conn;
mod reply;
mod request;
mod sealed_frames;
mod stall;
mod stripe;
mod window;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

pub use crate::config::TcpConfig;
use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::segment::Peer;
use crate::task::Observer;
use crate::transport::{Attempt, Transport, TransportContext, TransportFactory};
use crate::wire::MAX_DATA_PAYLOAD;

use event_loop::{Lanes, LOOP_MAX};
use pool_conn::{PoolConn, Slices, Timeouts};
use request::Slice;

/// A peer's lanes (data connections). Only the first `active` are used: the pool starts
/// with one and grows (up to `connectionsPerPeer`) when a request had to wait behind
/// others on its connection, or a request's slices want more lanes at once (`stripe`).
/// Single-slice requests are spread over the active lanes in turn. Each connection
/// connects when its first work arrives, so a peer that is written to now and then costs
/// one data connection, and one that is never written to costs none.
struct PeerPool {
    conns: Vec<Arc<PoolConn>>,
    next: AtomicUsize,
    active: AtomicUsize,
    /// The threads striping requests to the peer now, so that each has lanes of its own.
    submitters: stripe::RecentSubmitters,
    /// The origin of `submitters`' clock.
    opened: crate::ticks::Stamp,
}

impl PeerPool {
    /// Sends one submission's slices for one connection, taken in turn among the active
    /// ones; grows the pool by one when they had to wait.
    fn send_one(&self, slices: Slices) {
        let active = self.active.load(Ordering::Relaxed).max(1);
        let i = self.next.fetch_add(1, Ordering::Relaxed) % active;
        let waited = self.conns[i].send(slices);
        self.active.fetch_max(
            stripe::grown(active, self.conns.len(), waited),
            Ordering::Relaxed,
        );
    }

    /// Where a request of `slices` slices from the calling thread goes: its thread's
    /// group of lanes among the threads striping to this peer now, opened now if it was
    /// not in use yet.
    fn stripe(&self, slices: usize) -> stripe::Stripe {
        let active = self.active.load(Ordering::Relaxed).max(1);
        let now = crate::ticks::nanos_between(self.opened, crate::ticks::stamp());
        let among = self.submitters.note(crate::lanes::current(), now);
        let s = stripe::stripe(slices, self.conns.len(), active, among);
        self.active.fetch_max(s.span, Ordering::Relaxed);
        s
    }
}

/// Builds the TCP transport.
#[derive(Debug, Clone, Copy)]
pub struct TcpFactory(pub TcpConfig);

impl TransportFactory for TcpFactory {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>> {
        let mut tcp = TcpTransport::new(
            context.handle,
            context.engine_id,
            self.0,
            context.shutdown,
            context.attempt_timeout,
        );
        tcp.lanes.answered = Some(context.answered);
        Ok(Arc::new(tcp))
    }
}

/// The TCP transport.
pub struct TcpTransport {
    rt: Handle,
    local_engine_id: u64,
    config: TcpConfig,
    pools: Mutex<FxHashMap<u64, Arc<PeerPool>>>,
    shutdown: CancellationToken,
    /// Set by `shutdown`: what a submit checks (`CancellationToken::is_cancelled` takes a
    /// mutex, which threads submitting side by side queue on).
    closed: AtomicBool,
    /// Connections watched by submitting threads' event loops (`event_loop`).
    lanes: Lanes,
    /// The engine's attempt deadline: a pool connection whose frames go unanswered this
    /// long is stuck (`pool_conn::Timeouts`).
    stuck_after: Option<std::time::Duration>,
}

impl TcpTransport {
    /// A transport whose connection actors run on `rt`; `stuck_after` is the engine's
    /// attempt deadline, which also bounds how long a connection may leave its frames
    /// unanswered.
    pub fn new(
        rt: Handle,
        local_engine_id: u64,
        config: TcpConfig,
        shutdown: CancellationToken,
        stuck_after: Option<std::time::Duration>,
    ) -> Self {
        let mut config = config;
        config.connections_per_peer = config.connections_per_peer.clamp(1, 64);
        config.slice_size = config.slice_size.clamp(4096, MAX_DATA_PAYLOAD);
        let lanes = Lanes {
            rt: rt.clone(),
            engine_id: local_engine_id,
            connect_timeout: config.connect_timeout,
            registry: Arc::default(),
            answered: None,
        };
        Self {
            rt,
            local_engine_id,
            config,
            pools: Mutex::new(FxHashMap::default()),
            shutdown,
            closed: AtomicBool::new(false),
            lanes,
            stuck_after,
        }
    }

    fn pool(&self, peer: &Arc<Peer>) -> Arc<PeerPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(peer.handle())
            .or_insert_with(|| {
                let conns = (0..self.config.connections_per_peer)
                    .map(|_| {
                        PoolConn::start(
                            peer,
                            &self.rt,
                            self.shutdown.clone(),
                            self.local_engine_id,
                            self.lanes.answered.clone(),
                            Timeouts {
                                connect: self.config.connect_timeout,
                                stuck_after: self.stuck_after,
                            },
                            window::size(window::ASSUMED_LINK, self.config.slice_size),
                        )
                    })
                    .collect();
                Arc::new(PeerPool {
                    conns,
                    next: AtomicUsize::new(0),
                    active: AtomicUsize::new(1),
                    submitters: stripe::RecentSubmitters::default(),
                    opened: crate::ticks::stamp(),
                })
            })
            .clone()
    }

    fn submit_attempt(&self, a: &Attempt) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let task = &a.task;
        let req = task.request();
        if req.peer.is_lost() {
            return Err(req.peer.lost_error());
        }
        let token = req.descriptor.token_bytes()?;
        let pool = self.pool(&req.peer);
        let slice_size = self.config.slice_size;
        let count = u32::try_from(req.slice_count(slice_size)).map_err(|_| {
            Error::InvalidArgument(format!(
                "request of {} bytes has too many slices",
                req.length
            ))
        })?;
        task.expect_slices(a.attempt, count);
        let slice_of = |piece: crate::request::Span, starts_share: bool| Slice {
            landing: crate::fence::Landing::new(task),
            task: task.clone(),
            attempt: a.attempt,
            opcode: req.opcode,
            region: req.local.clone(),
            local_offset: piece.local_offset,
            buffer: req.remote_buffer,
            remote_offset: piece.remote_offset,
            len: piece.length,
            token,
            engine_id: req.descriptor.engine_id,
            starts_share,
            payload_crc: None,
        };
        if count == 1 && task.observer() == Observer::Progress && req.length <= LOOP_MAX {
            // A small awaited request from a thread with an event loop: that loop watches
            // the reply (`event_loop`), when its connection is ready.
            let piece = req.slices(slice_size).next();
            if let Some(piece) = piece {
                let slice = slice_of(piece, true);
                if let Err(slice) = event_loop::try_send(&self.lanes, &req.peer, slice) {
                    pool.send_one(smallvec::smallvec![slice]);
                }
                return Ok(());
            }
        }
        if count == 1 {
            if let Some(piece) = req.slices(slice_size).next() {
                pool.send_one(smallvec::smallvec![slice_of(piece, true)]);
            }
            return Ok(());
        }
        // Striped over the lanes of this thread's group (`stripe`); each lane gets its
        // share as one list, written together.
        let stripe = pool.stripe(count as usize);
        let ways = stripe.ways;
        if ways > 1 {
            // Its deadline runs once every connection started on its share.
            task.expect_shares(a.attempt, ways as u32);
        }
        let mut shares: SmallVec<[Slices; 2]> = (0..ways).map(|_| Slices::new()).collect();
        for (i, piece) in req.slices(slice_size).enumerate() {
            let share = &mut shares[i % ways];
            share.push(slice_of(piece, share.is_empty()));
        }
        let mut waited = false;
        for (i, share) in shares.into_iter().enumerate() {
            waited |= pool.conns[stripe.lane(i)].send(share);
        }
        pool.active.fetch_max(
            stripe::grown(stripe.span, pool.conns.len(), waited),
            Ordering::Relaxed,
        );
        Ok(())
    }

    fn pools(&self) -> Vec<Arc<PeerPool>> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.values().cloned().collect()
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn reports_starts(&self) -> bool {
        true
    }

    fn spread(&self) -> crate::transport::TransportSpread {
        crate::transport::TransportSpread {
            lanes_per_peer: Some(self.config.connections_per_peer),
            ..Default::default()
        }
    }

    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>> {
        attempts.iter().map(|a| self.submit_attempt(a)).collect()
    }

    fn submit_one(&self, attempt: &Attempt) -> Result<()> {
        self.submit_attempt(attempt)
    }

    fn fail_peer(&self, peer: &Peer, error: Error) {
        let pool = {
            let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            pools.get(&peer.handle()).cloned()
        };
        self.lanes.registry.break_all(Some(peer.handle()), &error);
        if let Some(pool) = pool {
            for conn in &pool.conns {
                conn.tear_down();
                conn.fail_all(&error);
                conn.fail_queued(&error);
                conn.cancel();
            }
        }
    }

    fn forget_peer(&self, peer: &Peer, error: Error) {
        self.fail_peer(peer, error);
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer.handle());
    }

    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.shutdown.cancel();
        self.lanes.registry.break_all(None, &Error::Closed);
        for pool in self.pools() {
            for conn in &pool.conns {
                conn.tear_down();
                conn.fail_all(&Error::Closed);
                conn.fail_queued(&Error::Closed);
            }
        }
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
