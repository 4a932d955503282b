//! An emulated RC queue pair: the verbs state machine, the send queue with in-order
//! completion, the modeled transport timeout, and the threads that carry its work
//! requests to the responder (one worker that sends and completes, one receiver per
//! connection that reads responses).
//!
//! The transport timeout models retransmissions that go unanswered: it runs only for a
//! packet known to be lost — the responder's connection closed or failed (its process
//! died, its device closed), could not be opened (no such responder), or the responder
//! dropped the packet (no QP connected to the sender). A request on an open connection to
//! a live responder has no deadline however long the responder takes, as a real HCA
//! acknowledges in hardware whatever its host's CPUs do.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::device::{lock, responder_name, Registry};
use super::faults::{Fault, FaultState};
use super::target::{PeerView, TargetQp};
use super::wire::{self, Op, Request, Response, Status};
use super::CqShared;
use crate::provider::{
    access, mtu, Gid, PostSendError, QpAttr, QpAttrMask, QpCaps, QpState, SendWr, Sge, VerbsError,
    VerbsResult, WcStatus, WorkCompletion, WrOpcode,
};

/// How long one attempt to connect to a responder may take (a stopped peer's full
/// backlog); a live listener that does not accept in time is tried again.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The pause before connecting again to a responder whose backlog was full.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// How long a blocked socket write waits before the worker checks timeouts again (a
/// write to a live responder that does not read waits as long as the peer lives and the
/// QP stays connected).
const WRITE_SLICE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy)]
struct Attrs {
    access_flags: u32,
    dest_qpn: u32,
    dgid: Option<Gid>,
    timeout: u8,
    retry_cnt: u8,
}

impl Attrs {
    const RESET: Self = Self {
        access_flags: 0,
        dest_qpn: 0,
        dgid: None,
        timeout: 14,
        retry_cnt: 7,
    };

    /// 4.096 µs × 2^timeout × (retry_cnt + 1); `None` for timeout 0 (infinite).
    fn transport_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| modeled_timeout(self.timeout, self.retry_cnt))
    }
}

/// The modeled time after which an unanswered work request ends in `RetryExcErr`.
pub(crate) fn modeled_timeout(timeout: u8, retry_cnt: u8) -> Duration {
    Duration::from_nanos(4096u64 << timeout.min(31)) * (u32::from(retry_cnt) + 1)
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for the worker to send it.
    Queued,
    /// Sent at `sent`. `deadline` is `None` while the responder may still answer (its
    /// connection is open); once the packet is known lost it is the end of the retry
    /// budget, where the entry ends in `RetryExcErr` (it stays `None` under the infinite
    /// timeout 0).
    Sent {
        sent: Instant,
        deadline: Option<Instant>,
    },
    /// Answered; delivered to the CQ in order once `not_before` has passed.
    Done {
        status: WcStatus,
        not_before: Instant,
    },
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    wr_id: u64,
    opcode: WrOpcode,
    sges: Vec<Sge>,
    remote_addr: u64,
    rkey: u32,
    signaled: bool,
    byte_len: u64,
    delay: Duration,
    phase: Phase,
}

struct Conn {
    stream: Arc<UnixStream>,
    gen: u64,
}

struct Inner {
    state: QpState,
    attrs: Attrs,
    sq: VecDeque<Entry>,
    next_seq: u64,
    conn: Option<Conn>,
    /// Set when the connection to the responder failed; work requests then time out.
    conn_broken: bool,
    /// Bumped whenever the connection is closed, so stale threads notice.
    gen: u64,
    stop: bool,
    worker: Option<JoinHandle<()>>,
    receivers: Vec<JoinHandle<()>>,
}

/// The state of one QP shared by its handle, its threads and the responder.
pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) pd: u64,
    caps: QpCaps,
    registry: Arc<Registry>,
    cq: Arc<CqShared>,
    faults: Arc<FaultState>,
    inner: Mutex<Inner>,
    cond: Condvar,
}

fn einval(verb: &'static str, message: String) -> VerbsError {
    VerbsError::errno(verb, libc::EINVAL, message)
}

fn mask_names(mask: u32) -> String {
    const NAMES: [(QpAttrMask, &str); 15] = [
        (QpAttrMask::STATE, "STATE"),
        (QpAttrMask::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (QpAttrMask::PKEY_INDEX, "PKEY_INDEX"),
        (QpAttrMask::PORT, "PORT"),
        (QpAttrMask::AV, "AV"),
        (QpAttrMask::PATH_MTU, "PATH_MTU"),
        (QpAttrMask::TIMEOUT, "TIMEOUT"),
        (QpAttrMask::RETRY_CNT, "RETRY_CNT"),
        (QpAttrMask::RNR_RETRY, "RNR_RETRY"),
        (QpAttrMask::RQ_PSN, "RQ_PSN"),
        (QpAttrMask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (QpAttrMask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (QpAttrMask::SQ_PSN, "SQ_PSN"),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (QpAttrMask::DEST_QPN, "DEST_QPN"),
    ];
    let mut names: Vec<String> = NAMES
        .iter()
        .filter(|(m, _)| mask & m.0 != 0)
        .map(|(_, n)| format!("IBV_QP_{n}"))
        .collect();
    let known = NAMES.iter().fold(0, |a, (m, _)| a | m.0);
    if mask & !known != 0 {
        names.push(format!("{:#x}", mask & !known));
    }
    names.join("|")
}

impl TargetQp for QpShared {
    fn pd(&self) -> u64 {
        self.pd
    }

    fn peer_view(&self) -> PeerView {
        let g = lock(&self.inner);
        PeerView {
            state: g.state,
            dest_qpn: g.attrs.dest_qpn,
            dgid: g.attrs.dgid,
            access_flags: g.attrs.access_flags,
        }
    }
}

impl QpShared {
    /// Creates the QP, registers it on the device and starts its worker.
    pub(crate) fn create(
        registry: &Arc<Registry>,
        pd: u64,
        caps: QpCaps,
        cq: Arc<CqShared>,
        faults: Arc<FaultState>,
    ) -> VerbsResult<Arc<Self>> {
        let qp = registry.add_qp(|qpn| {
            Arc::new(Self {
                qpn,
                pd,
                caps,
                registry: registry.clone(),
                cq,
                faults,
                inner: Mutex::new(Inner {
                    state: QpState::Reset,
                    attrs: Attrs::RESET,
                    sq: VecDeque::new(),
                    next_seq: 1,
                    conn: None,
                    conn_broken: false,
                    gen: 0,
                    stop: false,
                    worker: None,
                    receivers: Vec::new(),
                }),
                cond: Condvar::new(),
            })
        });
        let worker = {
            let qp = qp.clone();
            std::thread::Builder::new()
                .name(format!("emuqp{:06x}w", qp.qpn))
                .spawn(move || qp.run_worker())
        };
        match worker {
            Ok(h) => {
                lock(&qp.inner).worker = Some(h);
                Ok(qp)
            }
            Err(e) => {
                registry.remove_qp(qp.qpn);
                Err(VerbsError::errno(
                    "ibv_create_qp",
                    e.raw_os_error().unwrap_or(libc::EAGAIN),
                    format!("emulated QP thread: {e}"),
                ))
            }
        }
    }

    /// Stops the threads and removes the QP from the device; pending work is discarded.
    pub(crate) fn shutdown(&self) {
        self.registry.remove_qp(self.qpn);
        let (worker, receivers) = {
            let mut g = lock(&self.inner);
            g.stop = true;
            close_conn(&mut g);
            (g.worker.take(), std::mem::take(&mut g.receivers))
        };
        self.cond.notify_all();
        for h in worker.into_iter().chain(receivers) {
            let _ = h.join();
        }
    }

    pub(crate) fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> VerbsResult<()> {
        use QpAttrMask as M;
        const VERB: &str = "ibv_modify_qp";
        if !mask.contains(M::STATE) {
            return Err(einval(
                VERB,
                format!("QP {:#x}: the mask lacks IBV_QP_STATE", self.qpn),
            ));
        }
        let mut g = lock(&self.inner);
        let from = g.state;
        let (required, optional) = match (from, attr.state) {
            (_, QpState::Reset) | (_, QpState::Err) => (M::STATE, M(0)),
            (QpState::Reset, QpState::Init) => {
                (M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, M(0))
            }
            (QpState::Init, QpState::Init) => (M::STATE, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            (QpState::Init, QpState::Rtr) => (
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::PKEY_INDEX | M::ACCESS_FLAGS,
            ),
            (QpState::Rtr, QpState::Rts) => (
                M::STATE
                    | M::SQ_PSN
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC,
                M::ACCESS_FLAGS | M::MIN_RNR_TIMER,
            ),
            (QpState::Rts, QpState::Rts) => (M::STATE, M::ACCESS_FLAGS | M::MIN_RNR_TIMER),
            (from, to) => {
                return Err(einval(
                    VERB,
                    format!(
                        "QP {:#x}: transition {from:?} -> {to:?} is not allowed",
                        self.qpn
                    ),
                ))
            }
        };
        let missing = required.0 & !mask.0;
        if missing != 0 {
            return Err(einval(
                VERB,
                format!(
                    "QP {:#x}: {from:?} -> {:?} needs {}",
                    self.qpn,
                    attr.state,
                    mask_names(missing)
                ),
            ));
        }
        let extra = mask.0 & !(required.0 | optional.0);
        if extra != 0 {
            return Err(einval(
                VERB,
                format!(
                    "QP {:#x}: {from:?} -> {:?} does not take {}",
                    self.qpn,
                    attr.state,
                    mask_names(extra)
                ),
            ));
        }
        let bad = |what: String| Err(einval(VERB, format!("QP {:#x}: {what}", self.qpn)));
        if mask.contains(M::PORT) && attr.port_num != 1 {
            return bad(format!(
                "port {} does not exist (emu0 has port 1)",
                attr.port_num
            ));
        }
        if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
            return bad(format!(
                "pkey index {} is outside the table (1 entry)",
                attr.pkey_index
            ));
        }
        let known_access = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
        if mask.contains(M::ACCESS_FLAGS) && attr.access_flags & !known_access != 0 {
            return bad(format!(
                "access flags {:#x} are not supported",
                attr.access_flags
            ));
        }
        if mask.contains(M::PATH_MTU) && mtu::bytes(attr.path_mtu) == 0 {
            return bad(format!(
                "path MTU {} is not an ibv_mtu value",
                attr.path_mtu
            ));
        }
        if mask.contains(M::DEST_QPN) && attr.dest_qpn > 0x00ff_ffff {
            return bad(format!(
                "dest QPN {:#x} is wider than 24 bits",
                attr.dest_qpn
            ));
        }
        if mask.contains(M::AV) {
            if attr.av.dgid.is_none() {
                return bad("the address vector has no GRH (RoCE needs dgid)".into());
            }
            if attr.av.port_num != 1 {
                return bad(format!(
                    "address vector port {} does not exist",
                    attr.av.port_num
                ));
            }
            if attr.av.sgid_index != 0 {
                return bad(format!(
                    "sgid index {} is outside the GID table (1 entry)",
                    attr.av.sgid_index
                ));
            }
        }
        if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
            return bad(format!("timeout {} exceeds 31", attr.timeout));
        }
        if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
            return bad(format!("retry count {} exceeds 7", attr.retry_cnt));
        }
        if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
            return bad(format!("RNR retry {} exceeds 7", attr.rnr_retry));
        }
        match attr.state {
            QpState::Reset => {
                // Verbs: moving to RESET empties the queues without completions.
                g.sq.clear();
                close_conn(&mut g);
                g.conn_broken = false;
                g.attrs = Attrs::RESET;
            }
            QpState::Err => close_conn(&mut g),
            _ => {
                if mask.contains(M::ACCESS_FLAGS) {
                    g.attrs.access_flags = attr.access_flags;
                }
                if mask.contains(M::DEST_QPN) {
                    g.attrs.dest_qpn = attr.dest_qpn;
                }
                if mask.contains(M::AV) {
                    g.attrs.dgid = attr.av.dgid;
                }
                if mask.contains(M::TIMEOUT) {
                    g.attrs.timeout = attr.timeout;
                }
                if mask.contains(M::RETRY_CNT) {
                    g.attrs.retry_cnt = attr.retry_cnt;
                }
            }
        }
        g.state = attr.state;
        drop(g);
        self.cond.notify_all();
        Ok(())
    }

    /// Queues work requests for the worker, which copies their local memory (through the
    /// lkey's `MrEntry`) when it sends or completes them.
    ///
    /// # Safety
    /// As `QueuePair::post_send`.
    pub(crate) unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        const VERB: &str = "ibv_post_send";
        let mut g = lock(&self.inner);
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            let refuse = |errno: i32, message: String| PostSendError {
                index,
                error: VerbsError::errno(VERB, errno, message),
            };
            if !matches!(g.state, QpState::Rts | QpState::Err) {
                result = Err(refuse(
                    libc::EINVAL,
                    format!("QP {:#x} is in {:?}; posting needs RTS", self.qpn, g.state),
                ));
                break;
            }
            if wr.sg_list.len() > self.caps.max_send_sge as usize {
                result = Err(refuse(
                    libc::EINVAL,
                    format!(
                        "{} SGEs exceed the QP's max_send_sge {}",
                        wr.sg_list.len(),
                        self.caps.max_send_sge
                    ),
                ));
                break;
            }
            if g.sq.len() >= self.caps.max_send_wr as usize {
                result = Err(refuse(
                    libc::ENOMEM,
                    format!(
                        "send queue full: {} work requests outstanding (max_send_wr {})",
                        g.sq.len(),
                        self.caps.max_send_wr
                    ),
                ));
                break;
            }
            let now = Instant::now();
            let (fault, delay) = if g.state == QpState::Rts {
                self.faults.draw()
            } else {
                (Fault::None, Duration::ZERO)
            };
            let phase = match fault {
                Fault::SilentLoss => {
                    tracing::debug!(
                        qpn = self.qpn,
                        wr_id = wr.wr_id,
                        "emulated fault: work request silently lost"
                    );
                    continue;
                }
                Fault::RetryExceeded => Phase::Sent {
                    sent: now,
                    deadline: Some(
                        now + g
                            .attrs
                            .transport_timeout()
                            .unwrap_or_else(|| modeled_timeout(14, 7)),
                    ),
                },
                Fault::RemoteAccess => Phase::Done {
                    status: WcStatus::RemAccessErr,
                    not_before: now + delay,
                },
                Fault::None => Phase::Queued,
            };
            let seq = g.next_seq;
            g.next_seq += 1;
            g.sq.push_back(Entry {
                seq,
                wr_id: wr.wr_id,
                opcode: wr.opcode,
                sges: wr.sg_list.to_vec(),
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
                signaled: wr.signaled,
                byte_len: wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
                delay,
                phase,
            });
        }
        drop(g);
        self.cond.notify_all();
        result
    }

    fn run_worker(self: Arc<Self>) {
        let mut g = lock(&self.inner);
        loop {
            if g.stop {
                return;
            }
            let now = Instant::now();
            self.settle(&mut g, now);
            if g.state == QpState::Rts {
                if let Some(idx) = g.sq.iter().position(|e| matches!(e.phase, Phase::Queued)) {
                    g = if g.conn.is_none() && !g.conn_broken {
                        self.open_connection(g)
                    } else {
                        self.send_one(g, idx, now)
                    };
                    continue;
                }
            }
            // Deadlines of everything on the wire, and the head's delivery time: completions
            // behind the head wait for it whatever their own time.
            let head_due = match g.sq.front().map(|e| e.phase) {
                Some(Phase::Done { not_before, .. }) => Some(not_before),
                _ => None,
            };
            let wake =
                g.sq.iter()
                    .filter_map(|e| match e.phase {
                        Phase::Sent { deadline, .. } => deadline,
                        _ => None,
                    })
                    .chain(head_due)
                    .min();
            g = match wake {
                Some(at) => {
                    let wait = at
                        .saturating_duration_since(now)
                        .max(Duration::from_micros(100));
                    self.cond
                        .wait_timeout(g, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cond.wait(g).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Validates and sends the queued entry at `idx`; returns with the lock held again.
    fn send_one<'a>(
        self: &'a Arc<Self>,
        mut g: MutexGuard<'a, Inner>,
        idx: usize,
        now: Instant,
    ) -> MutexGuard<'a, Inner> {
        let payload = match self.prepare(&g.sq[idx]) {
            Ok(p) => p,
            Err(status) => {
                let delay = g.sq[idx].delay;
                g.sq[idx].phase = Phase::Done {
                    status,
                    not_before: now + delay,
                };
                return g;
            }
        };
        g.sq[idx].phase = Phase::Sent {
            sent: now,
            deadline: None,
        };
        let Some((stream, gen)) = self.connection(&g) else {
            // Unreachable responder: the entry times out like an unanswered packet.
            arm_lost(&mut g, now);
            return g;
        };
        let e = &g.sq[idx];
        let req = Request {
            op: match e.opcode {
                WrOpcode::RdmaWrite => Op::Write,
                WrOpcode::RdmaRead => Op::Read,
            },
            seq: e.seq,
            src_qpn: self.qpn,
            dst_qpn: g.attrs.dest_qpn,
            src_gid: self.registry.gid,
            rkey: e.rkey,
            remote_addr: e.remote_addr,
            len: e.byte_len as u32,
        };
        drop(g);
        let sent = self.write_frame(&stream, gen, &req.encode(), &payload);
        let mut g = lock(&self.inner);
        if !sent && g.gen == gen {
            lose_conn(&mut g, Instant::now());
        }
        g
    }

    /// Checks the entry's local SGEs; for WRITE gathers the bytes to send.
    fn prepare(&self, e: &Entry) -> Result<Vec<u8>, WcStatus> {
        if e.byte_len > u64::from(wire::MAX_LEN) {
            return Err(WcStatus::LocLenErr);
        }
        let mut payload = Vec::new();
        if e.opcode == WrOpcode::RdmaWrite {
            payload.resize(e.byte_len as usize, 0);
        }
        let mut off = 0usize;
        for sge in &e.sges {
            if sge.length == 0 {
                continue;
            }
            let mr = self
                .registry
                .by_lkey(sge.lkey)
                .filter(|mr| mr.pd == self.pd && mr.contains(sge.addr, u64::from(sge.length)))
                .ok_or(WcStatus::LocProtErr)?;
            let len = sge.length as usize;
            match e.opcode {
                WrOpcode::RdmaWrite => {
                    if !mr.read_into(sge.addr, &mut payload[off..off + len]) {
                        return Err(WcStatus::LocProtErr);
                    }
                }
                WrOpcode::RdmaRead => {
                    if mr.access & access::LOCAL_WRITE == 0 {
                        return Err(WcStatus::LocProtErr);
                    }
                }
            }
            off += len;
        }
        Ok(payload)
    }

    /// Scatters READ response bytes into the entry's SGEs.
    fn scatter(&self, e: &Entry, data: &[u8]) -> WcStatus {
        let mut off = 0usize;
        for sge in &e.sges {
            if sge.length == 0 {
                continue;
            }
            let len = sge.length as usize;
            let ok = self
                .registry
                .by_lkey(sge.lkey)
                .filter(|mr| mr.pd == self.pd && mr.access & access::LOCAL_WRITE != 0)
                .is_some_and(|mr| mr.write_from(sge.addr, &data[off..off + len]));
            if !ok {
                return WcStatus::LocProtErr;
            }
            off += len;
        }
        WcStatus::Success
    }

    /// The open connection to the destination's responder (`None` when it broke).
    fn connection(&self, g: &Inner) -> Option<(Arc<UnixStream>, u64)> {
        if g.conn_broken {
            return None;
        }
        g.conn.as_ref().map(|c| (c.stream.clone(), c.gen))
    }

    /// Connects to the destination's responder without holding the lock (the connect is
    /// bounded by `CONNECT_TIMEOUT`) and installs the connection unless the QP moved on
    /// meanwhile; a failure marks the connection broken, so work requests time out.
    fn open_connection<'a>(self: &'a Arc<Self>, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        let gen = g.gen;
        let dgid = g.attrs.dgid;
        drop(g);
        let opened = dgid
            .ok_or_else(|| std::io::Error::from(ErrorKind::AddrNotAvailable))
            .and_then(|dgid| connect_bounded(&dgid, CONNECT_TIMEOUT))
            .and_then(|s| {
                s.set_write_timeout(Some(WRITE_SLICE))?;
                let r = s.try_clone()?;
                Ok((s, r))
            });
        let mut g = lock(&self.inner);
        if g.gen != gen || g.stop || g.conn.is_some() || g.conn_broken {
            if let Ok((s, _)) = opened {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            return g;
        }
        let (stream, reader) = match opened {
            Ok(pair) => pair,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // The listener exists but its backlog stayed full: the peer lives and does
                // not accept yet (stopped or starved). Its work requests wait, queued.
                tracing::debug!(qpn = self.qpn, error = %e, "emulated verbs: responder busy, connecting again");
                return self
                    .cond
                    .wait_timeout(g, CONNECT_BACKOFF)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            Err(e) => {
                tracing::debug!(qpn = self.qpn, error = %e, "emulated verbs: responder unreachable");
                g.conn_broken = true;
                return g;
            }
        };
        let qp = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("emuqp{:06x}r", self.qpn))
            .spawn(move || qp.run_receiver(reader, gen));
        match spawned {
            Ok(h) => {
                g.receivers.retain(|h| !h.is_finished());
                g.receivers.push(h);
                g.conn = Some(Conn {
                    stream: Arc::new(stream),
                    gen,
                });
            }
            Err(e) => {
                tracing::warn!(qpn = self.qpn, error = %e, "emulated verbs: no receiver thread");
                g.conn_broken = true;
            }
        }
        g
    }

    /// Writes a frame; gives up when the connection fails or is replaced or the QP stops.
    /// Blocked writes wake every `WRITE_SLICE` to run the timeouts.
    fn write_frame(&self, stream: &UnixStream, gen: u64, header: &[u8], payload: &[u8]) -> bool {
        for part in [header, payload] {
            let mut off = 0;
            while off < part.len() {
                match (&*stream).write(&part[off..]) {
                    Ok(0) => return false,
                    Ok(n) => off += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        let mut g = lock(&self.inner);
                        self.settle(&mut g, Instant::now());
                        if g.stop || g.gen != gen {
                            return false;
                        }
                    }
                    Err(_) => return false,
                }
            }
        }
        true
    }

    fn run_receiver(self: Arc<Self>, mut stream: UnixStream, gen: u64) {
        let broken = loop {
            let mut header = [0u8; wire::RESPONSE_LEN];
            if stream.read_exact(&mut header).is_err() {
                break true;
            }
            let resp = match Response::decode(&header) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(qpn = self.qpn, error = %e, "emulated verbs: malformed response, dropping the connection");
                    break true;
                }
            };
            let mut data = Vec::new();
            match (&mut stream)
                .take(u64::from(resp.len))
                .read_to_end(&mut data)
            {
                Ok(n) if n == resp.len as usize => {}
                _ => break true,
            }
            let mut g = lock(&self.inner);
            if g.gen != gen || g.stop {
                break false;
            }
            let Some(idx) =
                g.sq.iter()
                    .position(|e| e.seq == resp.seq && matches!(e.phase, Phase::Sent { .. }))
            else {
                continue;
            };
            if let (Status::Dropped, 0) = (resp.status, resp.len) {
                // The responder dropped it, as it would every retransmission: the retry
                // budget runs from the send.
                if let Phase::Sent {
                    sent,
                    deadline: None,
                } = g.sq[idx].phase
                {
                    let deadline = g.attrs.transport_timeout().map(|t| sent + t);
                    g.sq[idx].phase = Phase::Sent { sent, deadline };
                }
                drop(g);
                self.cond.notify_all();
                continue;
            }
            let e = &g.sq[idx];
            let status = match resp.status {
                Status::AccessNak if resp.len == 0 => WcStatus::RemAccessErr,
                Status::Ok if e.opcode == WrOpcode::RdmaWrite && resp.len == 0 => WcStatus::Success,
                Status::Ok
                    if e.opcode == WrOpcode::RdmaRead && u64::from(resp.len) == e.byte_len =>
                {
                    self.scatter(e, &data)
                }
                _ => {
                    tracing::warn!(qpn = self.qpn, seq = resp.seq, len = resp.len, "emulated verbs: response does not match its request, dropping the connection");
                    drop(g);
                    break true;
                }
            };
            let not_before = Instant::now() + e.delay;
            g.sq[idx].phase = Phase::Done { status, not_before };
            drop(g);
            self.cond.notify_all();
        };
        if broken {
            let mut g = lock(&self.inner);
            if g.gen == gen {
                lose_conn(&mut g, Instant::now());
            }
            drop(g);
            self.cond.notify_all();
        }
    }

    /// Times out unanswered entries and delivers finished ones in order; an error moves
    /// the QP to ERR, which flushes everything behind it.
    fn settle(&self, g: &mut Inner, now: Instant) {
        for e in g.sq.iter_mut() {
            if let Phase::Sent {
                deadline: Some(d), ..
            } = e.phase
            {
                if d <= now {
                    e.phase = Phase::Done {
                        status: WcStatus::RetryExcErr,
                        not_before: now,
                    };
                }
            }
        }
        while let Some(head) = g.sq.front() {
            let status = if g.state == QpState::Err {
                WcStatus::WrFlushErr
            } else {
                match head.phase {
                    Phase::Done { status, not_before } if not_before <= now => status,
                    _ => break,
                }
            };
            let Some(e) = g.sq.pop_front() else { break };
            if status != WcStatus::Success || e.signaled {
                self.cq.push(WorkCompletion {
                    wr_id: e.wr_id,
                    status,
                    opcode: e.opcode,
                    byte_len: if status == WcStatus::Success {
                        e.byte_len as u32
                    } else {
                        0
                    },
                    qp_num: self.qpn,
                    vendor_err: 0,
                });
            }
            if status != WcStatus::Success && g.state != QpState::Err {
                tracing::debug!(
                    qpn = self.qpn,
                    wr_id = e.wr_id,
                    status = status.name(),
                    "emulated QP enters ERR"
                );
                g.state = QpState::Err;
                close_conn(g);
            }
        }
    }
}

fn close_conn(g: &mut Inner) {
    if let Some(c) = g.conn.take() {
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
    }
    g.gen += 1;
}

/// The responder's connection failed or closed while the QP used it: the responder's
/// process died or its device closed, so every request still unanswered is lost.
fn lose_conn(g: &mut Inner, now: Instant) {
    g.conn_broken = true;
    close_conn(g);
    arm_lost(g, now);
}

/// Starts the retry budget of every sent entry without a deadline, all of them lost: each
/// ends `RetryExcErr` when its budget, counted from its send, has run out, and not before
/// `now`, when the loss was seen.
fn arm_lost(g: &mut Inner, now: Instant) {
    let Some(budget) = g.attrs.transport_timeout() else {
        return;
    };
    for e in g.sq.iter_mut() {
        if let Phase::Sent {
            sent,
            deadline: None,
        } = e.phase
        {
            e.phase = Phase::Sent {
                sent,
                deadline: Some((sent + budget).max(now)),
            };
        }
    }
}

/// Connects to the responder of `gid`, giving up after `timeout` (a blocking unix connect
/// otherwise waits forever when the listener's backlog is full, e.g. a stopped peer).
fn connect_bounded(gid: &Gid, timeout: Duration) -> std::io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let name = responder_name(gid);
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > addr.sun_path.len() {
        return Err(ErrorKind::InvalidInput.into());
    }
    // Abstract name: a leading NUL, then the name (no terminator).
    for (slot, &b) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *slot = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    // SAFETY: `tv` is a valid timeval of the size passed; a unix connect honours SO_SNDTIMEO.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `addr` is an initialized sockaddr_un and `len` does not exceed its size.
    let rc = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(UnixStream::from(owned))
}
