//! Remote segments: the descriptor a peer publishes, and the local record of an opened
//! peer (its cached descriptor and liveness).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::lanes::{Lent, LentTable, Striped};
use crate::liveness::LossReason;
use crate::memory::Access;
use crate::wire::Token;

/// What a peer publishes about itself and its buffers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescriptor {
    /// Random id of the engine instance; changes when the peer restarts.
    pub engine_id: u64,
    /// The segment's name (`host:port`).
    pub name: String,
    /// Machine id (for same-host detection).
    pub machine_id: String,
    /// Process id of the engine.
    pub pid: u32,
    /// Address of the TCP data path.
    pub tcp_addr: String,
    /// Access token for data requests, hex encoded.
    pub token: String,
    /// Exposed buffers.
    pub buffers: Vec<BufferDescriptor>,
    /// What transports publish about the engine (e.g. `"rdma"`: device GIDs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub transport_info: BTreeMap<String, serde_json::Value>,
}

/// One exposed buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDescriptor {
    /// Buffer id (the target's region id).
    pub id: u64,
    /// Length in bytes.
    pub length: u64,
    /// What peers may do with it.
    pub access: Access,
    /// Transports the buffer is registered with.
    pub transports: Vec<TransportKind>,
    /// What transports publish about the buffer (e.g. `"rdma"`: address and rkey).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub transport_info: BTreeMap<String, serde_json::Value>,
}

impl SegmentDescriptor {
    /// Finds a buffer by id.
    pub fn buffer(&self, id: u64) -> Option<&BufferDescriptor> {
        self.buffers.iter().find(|b| b.id == id)
    }

    /// Parses the hex token.
    pub fn token_bytes(&self) -> Result<Token> {
        parse_token(&self.token)
    }
}

/// Encodes a token as lowercase hex.
pub fn token_hex(token: &Token) -> String {
    token.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a hex token.
pub fn parse_token(hex: &str) -> Result<Token> {
    let bad = || Error::Protocol(format!("bad token in descriptor: {hex:?}"));
    if hex.len() != 32 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// An opened remote segment.
pub struct Peer {
    handle: u64,
    name: String,
    /// Control address (`host:port`); the name itself in p2p mode.
    addr: RwLock<String>,
    /// Read for every request; replaced when the peer's descriptor is fetched again. One
    /// copy per lane, so that the reference each request takes counts on a cache line of
    /// its lane (`lanes.rs`).
    descriptor: Striped<ArcSwap<SegmentDescriptor>>,
    lost: AtomicBool,
    /// Set by `closeSegment` before anything else happens to the peer: work that fails from
    /// then on fails as a closed segment, not as a loss.
    closed: AtomicBool,
    /// Why it was last declared lost.
    lost_reason: Mutex<Option<LossReason>>,
    lost_count: AtomicU64,
    /// Cancels the control link (heartbeats, reconnects) of this peer.
    pub(crate) link_cancel: CancellationToken,
    /// Final failures that may mean the peer died, held until its fate is known.
    fate: Mutex<Fate>,
    /// Asks the link for a fresh proof of life (a ping answered after now).
    pub(crate) probe: tokio::sync::Notify,
    /// Asks the link for a direct check: the peer's etcd record went away, so it is lost
    /// unless it answers within the check's bound (`liveness::Link::check`).
    pub(crate) check: tokio::sync::Notify,
    /// Tells the link that the peer's incarnation changed: a connection to the old one is
    /// left for a new one.
    pub(crate) relink: tokio::sync::Notify,
    /// A transport's connection reached another incarnation, and the descriptor is being
    /// fetched for it: the connections that see the same meanwhile fetch nothing more.
    pub(crate) fetching_new: AtomicBool,
    /// Set when another connection got a reply from the peer's incarnation; the link takes
    /// it as a sign of life (`liveness::Link::signs_of_life`). Read on every reply, written
    /// once per sample: a busy peer's pongs may lag behind its data replies.
    heard_elsewhere: AtomicBool,
    /// The link's connection as notifications use it (`link_port`).
    pub(crate) link_port: Arc<crate::link_port::LinkPort>,
    /// Its transfer counters: its name's series in the engine's table (`peer_series`).
    series: Arc<crate::peer_series::PeerSeries>,
}

/// What a held failure learns: `Some(loss)` once the loss is announced, `None` when the
/// peer proved alive (or its link ended).
pub(crate) type Verdict = Box<dyn FnOnce(Option<Error>) + Send>;

#[derive(Default)]
struct Fate {
    /// The loss was announced (the `PeerLost` event emitted) and not recovered since.
    announced: bool,
    held: Vec<Verdict>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("handle", &self.handle)
            .field("name", &self.name)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Peer {
    pub(crate) fn new(
        handle: u64,
        name: String,
        descriptor: SegmentDescriptor,
        link_cancel: CancellationToken,
    ) -> Self {
        Self {
            handle,
            addr: RwLock::new(name.clone()),
            name,
            descriptor: Striped::new(|_| ArcSwap::from_pointee(descriptor.clone())),
            lost: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            lost_reason: Mutex::new(None),
            lost_count: AtomicU64::new(0),
            link_cancel,
            fate: Mutex::default(),
            probe: tokio::sync::Notify::new(),
            check: tokio::sync::Notify::new(),
            relink: tokio::sync::Notify::new(),
            fetching_new: AtomicBool::new(false),
            heard_elsewhere: AtomicBool::new(false),
            link_port: Arc::default(),
            series: Arc::default(),
        }
    }

    /// The peer, counting its transfers in `series` (its name's in the engine's table).
    pub(crate) fn with_series(mut self, series: Arc<crate::peer_series::PeerSeries>) -> Self {
        self.series = series;
        self
    }

    /// Its transfer counters.
    pub(crate) fn series(&self) -> &crate::peer_series::PeerSeries {
        &self.series
    }

    /// A connection to incarnation `engine_id` of the peer got an authenticated reply
    /// (its handshake proved the secret): a sign of life when that incarnation is the one
    /// known. Costs one relaxed load while the link has not sampled the last one.
    pub(crate) fn heard_from(&self, engine_id: impl FnOnce() -> u64) {
        if !self.heard_elsewhere.load(Ordering::Relaxed) && engine_id() == self.engine_id() {
            self.heard_elsewhere.store(true, Ordering::Relaxed);
        }
    }

    /// Whether another connection heard the peer since the last call (the link's sample).
    pub(crate) fn take_heard_elsewhere(&self) -> bool {
        self.heard_elsewhere.load(Ordering::Relaxed)
            && self.heard_elsewhere.swap(false, Ordering::Relaxed)
    }

    /// Holds `verdict` until the peer's fate is known: a failure that may mean the peer
    /// died must not reach the user before the `PeerLost` event that explains it. Runs it
    /// at once when the loss is already announced; else asks the link for a proof of life,
    /// which comes within the peer timeout either way.
    pub(crate) fn hold_until_fate(&self, verdict: Verdict) {
        if self.is_closed() {
            verdict(Some(self.closed_error()));
            return;
        }
        let mut fate = self.fate.lock().unwrap_or_else(|p| p.into_inner());
        if fate.announced {
            drop(fate);
            verdict(Some(self.lost_error()));
            return;
        }
        // No link will give a verdict any more (the segment or the engine closed; the
        // link releases what it holds as it ends, under this lock): none to wait for.
        if self.link_cancel.is_cancelled() {
            drop(fate);
            verdict(None);
            return;
        }
        fate.held.push(verdict);
        drop(fate);
        self.probe.notify_one();
    }

    /// The loss was announced: held failures end with it.
    pub(crate) fn loss_announced(&self) {
        let held = {
            let mut fate = self.fate.lock().unwrap_or_else(|p| p.into_inner());
            fate.announced = true;
            std::mem::take(&mut fate.held)
        };
        for verdict in held {
            verdict(Some(self.lost_error()));
        }
    }

    /// The peer answered a ping sent after the failures were held (or its link ended):
    /// they end with their own errors — or as a closed segment, when that is why the link
    /// ended.
    pub(crate) fn vouch_alive(&self) {
        let held = std::mem::take(&mut self.fate.lock().unwrap_or_else(|p| p.into_inner()).held);
        for verdict in held {
            verdict(self.is_closed().then(|| self.closed_error()));
        }
    }

    /// Whether failures are being held.
    pub(crate) fn holds(&self) -> bool {
        !self
            .fate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held
            .is_empty()
    }

    /// Local handle of this segment.
    pub fn handle(&self) -> u64 {
        self.handle
    }
    /// Segment name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Control address of the peer (`host:port`).
    pub fn addr(&self) -> String {
        self.addr.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
    pub(crate) fn set_addr(&self, addr: &str) {
        addr.clone_into(&mut self.addr.write().unwrap_or_else(|p| p.into_inner()));
    }
    /// The cached descriptor.
    pub fn descriptor(&self) -> Arc<SegmentDescriptor> {
        self.descriptor.local().load_full()
    }
    /// The current descriptor, borrowed for a moment (no reference taken: hold it only
    /// for a call, as `arc_swap`'s guards are meant to be).
    pub(crate) fn descriptor_now(&self) -> arc_swap::Guard<Arc<SegmentDescriptor>> {
        self.descriptor.local().load()
    }
    pub(crate) fn set_descriptor(&self, desc: SegmentDescriptor) {
        for lane in self.descriptor.iter() {
            lane.store(Arc::new(desc.clone()));
        }
    }
    /// Whether the peer is currently declared lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
    /// How many times it was declared lost.
    pub fn lost_count(&self) -> u64 {
        self.lost_count.load(Ordering::Relaxed)
    }
    /// Whether this engine closed the segment (`closeSegment`).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
    /// Marks the segment closed by this engine: what fails from now on is no loss.
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }
    /// The error of work cut off by `closeSegment`.
    pub fn closed_error(&self) -> Error {
        Error::SegmentClosed(self.name.clone())
    }
    /// The error of work planned against an incarnation of the peer that is gone: the
    /// peer restarted (as the one known now).
    pub fn restarted_error(&self) -> Error {
        Error::PeerLost {
            peer: self.name.clone(),
            reason: LossReason::Restarted {
                engine_id: self.engine_id(),
            },
        }
    }
    /// The engine id of the peer's incarnation this engine knows (its descriptor's).
    pub fn engine_id(&self) -> u64 {
        self.descriptor.local().load().engine_id
    }
    /// The error to give work aimed at this peer while it is lost (or closed).
    pub fn lost_error(&self) -> Error {
        if self.is_closed() {
            return self.closed_error();
        }
        let reason = self
            .lost_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Error::PeerLost {
            peer: self.name.clone(),
            // Set before the peer is first marked lost, so a lost peer always has one.
            reason: reason.unwrap_or(LossReason::Closed),
        }
    }
    /// `lost_error` if the peer is declared lost (or the segment closed), else a PeerLost
    /// error: a transport found it dead (`reason`).
    pub fn lost_error_or(&self, reason: &str) -> Error {
        if self.is_lost() || self.is_closed() {
            self.lost_error()
        } else {
            Error::PeerLost {
                peer: self.name.clone(),
                reason: LossReason::Transport(reason.to_string()),
            }
        }
    }

    /// Marks the peer lost; returns false if it already was (the loss keeps its first
    /// reason: a crashed peer seen again as a new incarnation stays crashed).
    pub(crate) fn mark_lost(&self, reason: &LossReason) -> bool {
        let mut why = self.lost_reason.lock().unwrap_or_else(|p| p.into_inner());
        if self.lost.swap(true, Ordering::AcqRel) {
            return false;
        }
        *why = Some(reason.clone());
        self.lost_count.fetch_add(1, Ordering::Relaxed);
        true
    }
    /// Marks the peer alive again; returns whether it was lost (so a recovery is reported
    /// once even when the control link and the metadata watch both notice it).
    pub(crate) fn mark_alive(&self) -> bool {
        self.fate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .announced = false;
        self.lost.swap(false, Ordering::AcqRel)
    }
}

/// The engine's table of opened segments.
#[derive(Default)]
pub struct SegmentTable {
    next_handle: AtomicU64,
    /// Handles by name; every change to the table is made under this lock, so that two
    /// opens of one name keep one peer.
    names: Mutex<FxHashMap<String, u64>>,
    /// Peers by handle (engine-made keys, looked up on every request: a fast hash, not a
    /// DoS-resistant one), lent per lane (`lanes.rs`).
    by_handle: LentTable<u64, Peer>,
}

impl SegmentTable {
    fn names(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, u64>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Looks a segment up by handle.
    pub fn get(&self, handle: u64) -> Result<Arc<Peer>> {
        self.by_handle
            .get(&handle)
            .ok_or_else(|| Error::UnknownSegment(format!("handle {handle}")))
    }
    /// Looks a segment up by handle, for a request: a reference that the calling thread's
    /// lane holds the count of (`lanes.rs`).
    pub fn lend(&self, handle: u64) -> Result<Lent<Peer>> {
        self.by_handle
            .lend(&handle)
            .ok_or_else(|| Error::UnknownSegment(format!("handle {handle}")))
    }
    /// Runs `f` on the peer under `handle`, taking no reference (`LentTable::with_loan`):
    /// `f` must not look segments up again. `None` if there is none.
    pub(crate) fn with_peer<R>(&self, handle: u64, f: impl FnOnce(&Peer) -> R) -> Option<R> {
        self.by_handle.with_loan(&handle, |p| f(p))
    }
    /// Looks a segment up by name.
    pub fn by_name(&self, name: &str) -> Option<Arc<Peer>> {
        let names = self.names();
        names.get(name).and_then(|h| self.by_handle.get(h))
    }
    /// Adds a peer unless one with the same name raced in first; returns the one kept and
    /// whether it is the new one.
    pub(crate) fn insert_with(
        &self,
        name: &str,
        make: impl FnOnce(u64) -> Peer,
    ) -> (Arc<Peer>, bool) {
        let mut names = self.names();
        if let Some(existing) = names.get(name).and_then(|h| self.by_handle.get(h)) {
            return (existing, false);
        }
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed) + 1;
        let peer = Arc::new(make(handle));
        names.insert(name.to_string(), handle);
        self.by_handle.insert(handle, peer.clone());
        (peer, true)
    }
    /// Removes a segment.
    pub fn remove(&self, handle: u64) -> Result<Arc<Peer>> {
        let mut names = self.names();
        let peer = self
            .by_handle
            .remove(&handle)
            .ok_or_else(|| Error::UnknownSegment(format!("handle {handle}")))?;
        names.remove(peer.name());
        Ok(peer)
    }
    /// Segments open.
    pub fn len(&self) -> usize {
        self.by_handle.len()
    }
    /// Whether no segment is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Removes every segment.
    pub fn drain(&self) -> Vec<Arc<Peer>> {
        let mut names = self.names();
        names.clear();
        let peers = self.by_handle.values();
        self.by_handle.clear();
        peers
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn token_hex_round_trip() {
        let t: Token = [0, 1, 2, 0xfe, 0xff, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0x80];
        assert_eq!(parse_token(&token_hex(&t)).expect("parse"), t);
        assert!(parse_token("zz").is_err());
        assert!(parse_token(&"g".repeat(32)).is_err());
        assert!(parse_token(&"é".repeat(16)).is_err());
    }

    /// A descriptor of a peer with no buffers and no transports.
    pub(crate) fn sample_descriptor() -> SegmentDescriptor {
        SegmentDescriptor {
            engine_id: 1,
            name: "127.0.0.1:1".into(),
            machine_id: "m".into(),
            pid: 1,
            tcp_addr: "127.0.0.1:1".into(),
            token: "00".repeat(16),
            buffers: Vec::new(),
            transport_info: BTreeMap::new(),
        }
    }

    #[test]
    fn loss_and_recovery_are_each_reported_once() {
        let peer = Peer::new(
            1,
            "127.0.0.1:1".into(),
            sample_descriptor(),
            Default::default(),
        );
        assert!(!peer.mark_alive(), "never lost: no recovery to report");
        assert!(peer.mark_lost(&LossReason::Silent { timeout_ms: 10 }));
        assert_eq!(
            peer.lost_error(),
            Error::PeerLost {
                peer: "127.0.0.1:1".into(),
                reason: LossReason::Silent { timeout_ms: 10 }
            },
            "the loss's error names the peer and carries the typed reason"
        );
        assert!(
            !peer.mark_lost(&LossReason::Closed),
            "a second loss notice is not a new loss"
        );
        assert!(peer.mark_alive(), "the first recovery notice reports it");
        assert!(
            !peer.mark_alive(),
            "the control link and the etcd watch both notice: once"
        );
    }

    #[test]
    fn a_loss_keeps_its_first_reason_and_a_closed_segment_is_no_loss() {
        let peer = Peer::new(1, "p:1".into(), sample_descriptor(), Default::default());
        assert!(peer.mark_lost(&LossReason::Broken("reset".into())));
        assert!(!peer.mark_lost(&LossReason::Restarted { engine_id: 2 }));
        assert_eq!(peer.lost_error().code(), "ERR_FERRY_PEER_LOST");
        assert!(matches!(
            peer.lost_error(),
            Error::PeerLost {
                reason: LossReason::Broken(_),
                ..
            }
        ));
        // Closed by this engine: held failures and later ones end as a closed segment.
        let got: Arc<Mutex<Vec<Option<&'static str>>>> = Arc::default();
        let closing = Peer::new(2, "p:2".into(), sample_descriptor(), Default::default());
        let sink = got.clone();
        closing.hold_until_fate(Box::new(move |e: Option<Error>| {
            sink.lock().expect("got").push(e.map(|e| e.code()));
        }));
        closing.mark_closed();
        closing.link_cancel.cancel();
        closing.vouch_alive();
        let sink = got.clone();
        closing.hold_until_fate(Box::new(move |e: Option<Error>| {
            sink.lock().expect("got").push(e.map(|e| e.code()));
        }));
        assert_eq!(
            *got.lock().expect("got"),
            [
                Some("ERR_FERRY_SEGMENT_CLOSED"),
                Some("ERR_FERRY_SEGMENT_CLOSED")
            ]
        );
        assert_eq!(
            closing.lost_error_or("target process exited").code(),
            "ERR_FERRY_SEGMENT_CLOSED"
        );
    }

    #[test]
    fn held_failures_end_with_the_verdict_and_never_wait_without_a_link() {
        use std::sync::{Arc, Mutex};
        let got: Arc<Mutex<Vec<Option<&'static str>>>> = Arc::default();
        let record = |got: &Arc<Mutex<Vec<Option<&'static str>>>>| -> Verdict {
            let got = got.clone();
            Box::new(move |loss: Option<Error>| {
                got.lock().expect("got").push(loss.map(|e| e.code()));
            })
        };
        let peer = Peer::new(1, "p:1".into(), sample_descriptor(), Default::default());
        peer.hold_until_fate(record(&got));
        peer.hold_until_fate(record(&got));
        assert!(peer.holds() && got.lock().expect("got").is_empty(), "held");
        peer.vouch_alive();
        assert_eq!(*got.lock().expect("got"), [None, None], "alive: own errors");
        got.lock().expect("got").clear();
        peer.hold_until_fate(record(&got));
        assert!(peer.mark_lost(&LossReason::Silent { timeout_ms: 10 }));
        peer.loss_announced();
        peer.hold_until_fate(record(&got));
        assert_eq!(
            *got.lock().expect("got"),
            [Some("ERR_FERRY_PEER_LOST"), Some("ERR_FERRY_PEER_LOST")],
            "lost: held and later ones end with the loss"
        );
        // A closed link gives no verdict: nothing is held for it.
        let closed = Peer::new(2, "p:2".into(), sample_descriptor(), Default::default());
        closed.link_cancel.cancel();
        got.lock().expect("got").clear();
        closed.hold_until_fate(record(&got));
        assert!(!closed.holds());
        assert_eq!(*got.lock().expect("got"), [None]);
    }
}
