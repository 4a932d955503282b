//! An emulated RC queue pair: the verbs state machine and the send queue with in-order
//! completion. The threads that carry its work requests to the responder (one worker that
//! sends and completes, one receiver per connection that reads responses) and the modeled
//! transport timeout are in `qp/carrier.rs`.
//!
//! The transport timeout models retransmissions that go unanswered: it runs only for a
//! packet known to be lost — the responder's connection closed or failed (its process
//! died, its device closed), could not be opened (no such responder), or the responder
//! dropped the packet (no QP connected to the sender). A request on an open connection to
//! a live responder has no deadline however long the responder takes, as a real HCA
//! acknowledges in hardware whatever its host's CPUs do.

use std::collections::VecDeque;

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod carrier;

use carrier::close_conn;

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
    /// The `corrupt` fault: one byte of what it carries is flipped on the way.
    corrupt: bool,
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
                Fault::None | Fault::Corrupt => Phase::Queued,
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
                corrupt: fault == Fault::Corrupt,
                phase,
            });
        }
        drop(g);
        self.cond.notify_all();
        result
    }
}
