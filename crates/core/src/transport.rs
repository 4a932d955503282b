//! The transport trait. The engine owns the loop around it: validation, selection,
//! bookkeeping and failover happen above; a transport only moves slices and writes each
//! task's outcome into the task's shared state.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::Result;
use crate::kind::TransportKind;
use crate::memory::{Region, RegionId, RegionTable};
use crate::segment::Peer;
use crate::task::Task;

/// A boxed future, for the trait's async hooks.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Reports a peer found dead, or gone with a goodbye, by a transport (the engine declares
/// it lost).
pub type LostHook = Arc<dyn Fn(&Arc<Peer>, crate::liveness::LossReason) + Send + Sync>;

/// Reports the engine id that a transport's own connection to a peer was answered with
/// (its handshake's). Another than the incarnation the engine knows means the peer
/// restarted: the engine fetches its descriptor and moves the segment to the new
/// incarnation, as when the link sees it (`incarnations.rs`). Cheap for the known one.
pub type AnsweredHook = Arc<dyn Fn(&Arc<Peer>, u64) + Send + Sync>;

/// One attempt of a task, handed to a transport.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The task.
    pub task: Arc<Task>,
    /// The attempt number every completion must quote.
    pub attempt: u32,
    /// More attempts of the same submission follow this one on the submitting thread: a
    /// transport that would do the work inline may hand it off, so that the submission's
    /// work runs side by side instead of one piece after another.
    pub more_follow: bool,
}

/// How a transport spreads its work over the machine (`Transport::spread`); `None` where
/// the notion does not apply to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportSpread {
    /// Data connections per peer that requests are spread and striped over (tcp).
    pub lanes_per_peer: Option<usize>,
    /// Threads that share large copies with the submitting ones (shm).
    pub copy_threads: Option<usize>,
}

/// A way of moving bytes to and from peers.
pub trait Transport: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Prepares the transport for use; a failure leaves it uninstalled (never selected).
    fn install(&self) -> Result<()> {
        Ok(())
    }

    /// Takes attempts (requests already validated) and returns one result per attempt.
    /// An `Err` means nothing of that attempt was sent, so it can safely be retried on
    /// another transport. `Ok` means the transport owns the attempt until it reports every
    /// slice done (`Task::slice_done`) or the attempt failed (`Task::attempt_failed`).
    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>>;

    /// Whether this transport tells each attempt when its bytes start moving
    /// (`Task::started`, once per connection or endpoint that carries a share of it), so
    /// that its deadline runs from then rather than from its submission: work it queues
    /// behind other work waits without its clock running. Such a transport must bound
    /// that wait itself: a connection with work outstanding and no answer for the
    /// attempt deadline ([`TransportContext::attempt_timeout`]) is stuck, and everything
    /// on it, queued work too, fails at once. Default: no (timed from submission).
    ///
    /// A transport that queues only some attempts, and whose queue always drains without
    /// waiting on the peer (shm's copy threads), says no here and times those it queues
    /// itself: `Task::time_from_start` with [`TransportContext::deadlines`] before it
    /// queues one, `Task::started` as it starts on it.
    fn reports_starts(&self) -> bool {
        false
    }

    /// [`Transport::submit`] of one attempt, without a `Vec` of results: the engine starts
    /// attempts one at a time, on the hot path. The default goes through `submit`.
    fn submit_one(&self, attempt: &Attempt) -> Result<()> {
        self.submit(std::slice::from_ref(attempt))
            .pop()
            .unwrap_or(Ok(()))
    }

    /// Moves `request` on the calling thread now, if this transport would do all of it
    /// there anyway (a same-host copy that stays inline): `Some(Ok(()))` once all of it is
    /// done, `Some(Err)` when it ran and does not count (the engine then starts an attempt
    /// as usual, which fails over as any failure does). `None` when the transport would
    /// not do it at once, or cannot tell why not (the attempt path reports that): nothing
    /// moved. `more_follow` as in [`Attempt::more_follow`].
    ///
    /// A polled submission asks this first (`submit.rs`): what completes here needs no
    /// task, no attempt and no report. The default does nothing now.
    fn complete_now(
        &self,
        _request: &crate::request::RequestView<'_>,
        _more_follow: bool,
    ) -> Option<Result<()>> {
        None
    }

    /// Fails every in-flight and queued slice towards `peer` at once and drops its
    /// connections (the peer was declared lost).
    fn fail_peer(&self, peer: &Peer, error: crate::Error);

    /// Like `fail_peer`, and forgets the peer (its segment was closed).
    fn forget_peer(&self, peer: &Peer, error: crate::Error) {
        self.fail_peer(peer, error);
    }

    /// Stops every thread and connection. Idempotent.
    fn shutdown(&self);

    /// Whether this transport can reach `peer` from here; the reason when it cannot.
    fn reachable(&self, _peer: &Peer) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Why this transport could not be set up towards `peer` for want of a resource (its
    /// attach ran out of memory or address space), while that holds: a request that
    /// requires it then fails with `ResourceLimit` and these words, not as merely
    /// unreachable. Asked only after [`Transport::reachable`] said no. Default: never.
    fn setup_limit(&self, _peer: &Peer) -> Option<String> {
        None
    }

    /// Sets up what the transport needs towards a newly opened (or recovered) peer, such
    /// as mappings or connected endpoints. A failure only leaves the peer unreachable by
    /// this transport.
    fn attach(&self, _peer: &Arc<Peer>) -> Option<BoxFuture<Result<()>>> {
        None
    }

    /// A local region was allocated or registered (e.g. register it with a NIC). An error
    /// leaves the region unserved by this transport, not unusable.
    fn region_added(&self, _region: &Arc<Region>) -> Result<()> {
        Ok(())
    }

    /// A local region was released.
    fn region_released(&self, _id: RegionId) {}

    /// Whether peers may reach `region` through this transport.
    fn serves(&self, _region: &Region) -> bool {
        true
    }

    /// Engine-wide information for the segment descriptor (e.g. device GIDs).
    fn describe(&self) -> Option<serde_json::Value> {
        None
    }

    /// How this transport spreads its work over the machine here, for operators (tebench's
    /// run header): what it uses, not what was asked.
    fn spread(&self) -> TransportSpread {
        TransportSpread::default()
    }

    /// Per-buffer information for the segment descriptor (e.g. an rkey).
    fn describe_buffer(&self, _region: &Region) -> Option<serde_json::Value> {
        None
    }

    /// Answers a peer's `TransportReq` (e.g. an RDMA endpoint handshake).
    fn control(&self, _request: &[u8]) -> Result<Vec<u8>> {
        Err(crate::Error::Protocol(format!(
            "{} takes no control requests",
            self.kind().name()
        )))
    }
}

/// Which peer engines currently hold a control connection to this engine (every opened
/// segment keeps one, with heartbeats). Lets a transport release what it set up for a peer
/// that went away, e.g. the target side of RDMA queue pairs.
#[derive(Debug, Default)]
pub struct ControlPeers {
    open: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
}

impl ControlPeers {
    /// Whether engine `engine_id` holds at least one control connection now.
    pub fn is_connected(&self, engine_id: u64) -> bool {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&engine_id)
    }

    /// Records a control connection from `engine_id` until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, engine_id: u64) -> ControlGuard {
        *self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(engine_id)
            .or_insert(0) += 1;
        ControlGuard {
            peers: self.clone(),
            engine_id,
        }
    }
}

/// Keeps a control connection counted.
pub(crate) struct ControlGuard {
    peers: Arc<ControlPeers>,
    engine_id: u64,
}

impl Drop for ControlGuard {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.engine_id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.engine_id);
            }
        }
    }
}

/// What a transport gets from the engine it is built for.
#[derive(Clone)]
pub struct TransportContext {
    /// The engine's id.
    pub engine_id: u64,
    /// The engine's machine identity.
    pub machine_id: String,
    /// The engine's I/O runtime.
    pub handle: tokio::runtime::Handle,
    /// Fires when the engine closes.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// The engine's local regions.
    pub regions: Arc<RegionTable>,
    /// Declares a peer lost.
    pub lost: LostHook,
    /// Hears which incarnation a transport's connection reached.
    pub answered: AnsweredHook,
    /// Peer engines with a control connection to this one.
    pub control_peers: Arc<ControlPeers>,
    /// The engine's access token (what peers must present for its memory).
    pub token: crate::wire::Token,
    /// The cluster secret a transport's own sockets demand (shm).
    pub secret: Option<crate::auth::Secret>,
    /// Connection caps and refusal counters shared with the listener.
    pub(crate) admission: Arc<crate::admission::Admission>,
    /// Serve the shm socket to other uids too.
    pub shm_any_uid: bool,
    /// Deadline of a handshake or a started frame.
    pub frame_timeout: std::time::Duration,
    /// The goodbye the engine says as it closes, on the connections peers watch its life
    /// on (shm's).
    pub(crate) farewell: Arc<crate::farewell::Farewell>,
    /// The engine's attempt deadline (`None`: none). A transport that reports starts
    /// ([`Transport::reports_starts`]) treats a connection with work outstanding and no
    /// answer for this long as stuck, and fails everything it holds, queued work too.
    pub attempt_timeout: Option<std::time::Duration>,
    /// The engine's attempt deadlines (`None` without an attempt timeout): where a
    /// transport that queues some attempts has those timed from their start
    /// ([`Transport::reports_starts`]).
    pub(crate) deadlines: Option<Arc<crate::deadlines::Deadlines<Task>>>,
}

/// Builds a transport for an engine. Every transport is built this way: tcp, shm and the
/// fault decorator here, rdma in `ferry-verbs`.
pub trait TransportFactory: Send + Sync + std::fmt::Debug {
    /// Which transport it builds.
    fn kind(&self) -> TransportKind;
    /// Builds it; an error leaves the transport disabled with that reason.
    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>>;
}
