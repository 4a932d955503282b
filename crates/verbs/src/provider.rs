//! The verbs interface: device list, open, protection domain, memory registration,
//! completion queues, queue pairs (create/modify/destroy by drop), post send, poll CQ,
//! query port and GID.
//!
//! Handles are reference counted and each holds its parent (QP → PD and CQs, MR → PD,
//! PD and CQ → context), so drop order always follows the verbs rules: a QP is destroyed
//! before its CQ, an MR before its PD, everything before the device is closed.
//!
//! Numeric values (access flags, attribute masks, work completion status, MTU) are the
//! libibverbs values, so the real provider passes them through unchanged.

use std::any::Any;
use std::sync::Arc;

/// A global identifier of a port (IPv6 format).
pub type Gid = [u8; 16];

/// What can go wrong in a verb.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// The provider cannot be used here (library missing, no device, …).
    #[error("rdma unavailable: {0}")]
    Unavailable(String),
    /// A verb failed with an errno (the verbs convention).
    #[error("{verb} failed: {message} (errno {errno})")]
    Errno {
        /// Which verb.
        verb: &'static str,
        /// The errno.
        errno: i32,
        /// What the provider said.
        message: String,
    },
}

impl VerbsError {
    /// An errno failure with a message.
    pub fn errno(verb: &'static str, errno: i32, message: impl Into<String>) -> Self {
        Self::Errno {
            verb,
            errno,
            message: message.into(),
        }
    }
}

/// Result of a verb.
pub type VerbsResult<T> = std::result::Result<T, VerbsError>;

/// One device as listed by `devices()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`mlx5_0`, `emu0`).
    pub name: String,
    /// Node GUID (0 when unknown).
    pub guid: u64,
}

/// Port state values (`ibv_port_state`).
pub mod port_state {
    /// The port is active.
    pub const ACTIVE: u32 = 4;
}

/// Link layers (`IBV_LINK_LAYER_*`).
pub mod link_layer {
    /// InfiniBand.
    pub const INFINIBAND: u8 = 1;
    /// Ethernet (RoCE).
    pub const ETHERNET: u8 = 2;
}

/// Path MTU values (`ibv_mtu`): 1 = 256 … 5 = 4096 bytes.
pub mod mtu {
    /// 1024 bytes.
    pub const MTU_1024: u32 = 3;
    /// 4096 bytes.
    pub const MTU_4096: u32 = 5;
    /// Bytes of an `ibv_mtu` value (0 when out of range).
    pub fn bytes(mtu: u32) -> u32 {
        if (1..=5).contains(&mtu) {
            128 << mtu
        } else {
            0
        }
    }
}

/// What `query_port` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// `ibv_port_state` value (`port_state::ACTIVE` = 4).
    pub state: u32,
    /// Active MTU (`ibv_mtu` value).
    pub active_mtu: u32,
    /// Local id (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// `link_layer::*`.
    pub link_layer: u8,
    /// Entries in the GID table.
    pub gid_table_len: u32,
}

/// Memory access flags (`ibv_access_flags`).
pub mod access {
    /// The local HCA may write (needed by RDMA READ destinations).
    pub const LOCAL_WRITE: u32 = 1;
    /// Peers may RDMA WRITE.
    pub const REMOTE_WRITE: u32 = 2;
    /// Peers may RDMA READ.
    pub const REMOTE_READ: u32 = 4;
}

/// Queue pair states (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Just created.
    Reset = 0,
    /// Initialized.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error.
    Sqe = 5,
    /// Error: every posted and new work request is flushed.
    Err = 6,
}

/// Attribute mask bits (`ibv_qp_attr_mask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttrMask(pub u32);

impl QpAttrMask {
    /// `qp_state`.
    pub const STATE: Self = Self(1);
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    /// `pkey_index`.
    pub const PKEY_INDEX: Self = Self(1 << 4);
    /// `port_num`.
    pub const PORT: Self = Self(1 << 5);
    /// `ah_attr`.
    pub const AV: Self = Self(1 << 7);
    /// `path_mtu`.
    pub const PATH_MTU: Self = Self(1 << 8);
    /// `timeout`.
    pub const TIMEOUT: Self = Self(1 << 9);
    /// `retry_cnt`.
    pub const RETRY_CNT: Self = Self(1 << 10);
    /// `rnr_retry`.
    pub const RNR_RETRY: Self = Self(1 << 11);
    /// `rq_psn`.
    pub const RQ_PSN: Self = Self(1 << 12);
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    /// `sq_psn`.
    pub const SQ_PSN: Self = Self(1 << 16);
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    /// `dest_qp_num`.
    pub const DEST_QPN: Self = Self(1 << 20);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for QpAttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Address vector of the remote port (`ibv_ah_attr` with its GRH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Remote LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Remote GID; `Some` sets `is_global` (required on RoCE).
    pub dgid: Option<Gid>,
    /// Local GID index used as source.
    pub sgid_index: u8,
    /// Hop limit of the GRH.
    pub hop_limit: u8,
    /// Local port.
    pub port_num: u8,
}

/// Attributes for `modify` (only the fields named by the mask are read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: QpState,
    /// Partition key index.
    pub pkey_index: u16,
    /// Local port (1-based).
    pub port_num: u8,
    /// Remote access allowed on this QP (`access::*`).
    pub access_flags: u32,
    /// Path MTU (`ibv_mtu` value).
    pub path_mtu: u32,
    /// Remote QP number.
    pub dest_qpn: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Outstanding RDMA READs as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READs as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Local ack timeout: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Retransmissions before `RetryExcErr`.
    pub retry_cnt: u8,
    /// RNR retransmissions.
    pub rnr_retry: u8,
    /// Remote address.
    pub av: AddressVector,
}

impl QpAttr {
    /// Attributes that only name a state (for RESET and ERR).
    pub fn state(state: QpState) -> Self {
        Self {
            state,
            pkey_index: 0,
            port_num: 1,
            access_flags: 0,
            path_mtu: mtu::MTU_1024,
            dest_qpn: 0,
            rq_psn: 0,
            sq_psn: 0,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            av: AddressVector::default(),
        }
    }
}

/// Queue sizes requested at `create_qp` (RC, no SRQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding at once.
    pub max_send_wr: u32,
    /// Receive work requests outstanding at once.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
}

/// A scatter/gather entry: local memory inside an MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Local address.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the MR holding it.
    pub lkey: u32,
}

/// One-sided operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    /// Local SGEs → remote memory.
    RdmaWrite,
    /// Remote memory → local SGEs.
    RdmaRead,
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: WrOpcode,
    /// Local memory.
    pub sg_list: &'a [Sge],
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// Work completion status (`ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// Local length error.
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local protection error (bad lkey or SGE outside its MR).
    LocProtErr,
    /// Flushed because the QP is in the error state.
    WrFlushErr,
    /// Remote invalid request.
    RemInvReqErr,
    /// Remote access error (bad rkey, bounds or permission).
    RemAccessErr,
    /// Remote operation error.
    RemOpErr,
    /// Transport retries exhausted (the peer does not answer).
    RetryExcErr,
    /// RNR retries exhausted.
    RnrRetryExcErr,
    /// Another status (raw `ibv_wc_status` value).
    Other(u32),
}

impl WcStatus {
    /// From the raw `ibv_wc_status` value.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Success,
            1 => Self::LocLenErr,
            2 => Self::LocQpOpErr,
            4 => Self::LocProtErr,
            5 => Self::WrFlushErr,
            9 => Self::RemInvReqErr,
            10 => Self::RemAccessErr,
            11 => Self::RemOpErr,
            12 => Self::RetryExcErr,
            13 => Self::RnrRetryExcErr,
            other => Self::Other(other),
        }
    }

    /// The raw `ibv_wc_status` value.
    pub fn raw(self) -> u32 {
        match self {
            Self::Success => 0,
            Self::LocLenErr => 1,
            Self::LocQpOpErr => 2,
            Self::LocProtErr => 4,
            Self::WrFlushErr => 5,
            Self::RemInvReqErr => 9,
            Self::RemAccessErr => 10,
            Self::RemOpErr => 11,
            Self::RetryExcErr => 12,
            Self::RnrRetryExcErr => 13,
            Self::Other(raw) => raw,
        }
    }

    /// The libibverbs name (`IBV_WC_REM_ACCESS_ERR`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Success => "IBV_WC_SUCCESS",
            Self::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            Self::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            Self::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            Self::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            Self::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            Self::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            Self::RemOpErr => "IBV_WC_REM_OP_ERR",
            Self::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            Self::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            Self::Other(_) => "IBV_WC_OTHER_ERR",
        }
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed (meaningful on success only, as in verbs).
    pub opcode: WrOpcode,
    /// Bytes moved.
    pub byte_len: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Vendor error code.
    pub vendor_err: u32,
}

impl Default for WorkCompletion {
    fn default() -> Self {
        Self {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WrOpcode::RdmaWrite,
            byte_len: 0,
            qp_num: 0,
            vendor_err: 0,
        }
    }
}

/// `post_send` failed at work request `index`; the ones before it were posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("post_send failed at work request {index}: {error}")]
pub struct PostSendError {
    /// First work request not posted.
    pub index: usize,
    /// Why.
    pub error: VerbsError,
}

/// A verbs implementation.
pub trait Provider: Send + Sync {
    /// `"ibverbs"` or `"emulated"`.
    fn name(&self) -> &'static str;
    /// Devices present.
    fn devices(&self) -> VerbsResult<Vec<DeviceInfo>>;
    /// Opens a device by name.
    fn open(&self, device: &str) -> VerbsResult<Arc<dyn Context>>;
}

/// An open device.
pub trait Context: Send + Sync {
    /// The device's name.
    fn device_name(&self) -> &str;
    /// Port attributes (ports are 1-based).
    fn query_port(&self, port: u8) -> VerbsResult<PortAttr>;
    /// One GID table entry.
    fn query_gid(&self, port: u8, index: u32) -> VerbsResult<Gid>;
    /// A protection domain.
    fn alloc_pd(&self) -> VerbsResult<Arc<dyn ProtectionDomain>>;
    /// A completion queue with room for `depth` completions.
    fn create_cq(&self, depth: u32) -> VerbsResult<Arc<dyn CompletionQueue>>;
}

/// A protection domain.
pub trait ProtectionDomain: Send + Sync {
    /// Registers memory; deregistered when the returned handle drops.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid (mapped, and not freed) until the returned handle
    /// and every work request using its keys are gone.
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> VerbsResult<Arc<dyn MemoryRegion>>;

    /// Creates an RC queue pair (in RESET) whose send and receive completions go to the
    /// given CQs of the same provider; destroyed when the handle drops.
    fn create_qp(
        &self,
        send_cq: &Arc<dyn CompletionQueue>,
        recv_cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> VerbsResult<Arc<dyn QueuePair>>;
}

/// Registered memory.
pub trait MemoryRegion: Send + Sync {
    /// Local key (SGEs).
    fn lkey(&self) -> u32;
    /// Remote key (peers' work requests).
    fn rkey(&self) -> u32;
    /// Start address.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync {
    /// Moves up to `out.len()` completions into `out`; returns how many. An error means
    /// the CQ is unusable (e.g. it overflowed).
    fn poll(&self, out: &mut [WorkCompletion]) -> VerbsResult<usize>;
    /// For providers to recover their own type.
    fn as_any(&self) -> &dyn Any;
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send + Sync {
    /// Local QP number.
    fn qpn(&self) -> u32;
    /// Moves the QP (RESET → INIT → RTR → RTS, any → ERR, any → RESET), with the
    /// attribute mask each transition requires.
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> VerbsResult<()>;
    /// Posts work requests in order; stops at the first one refused.
    ///
    /// The device reads (RDMA WRITE) or writes (RDMA READ) the local memory of a posted work
    /// request later, outside any borrow the caller holds, as `ibv_post_send` does.
    ///
    /// # Safety
    /// For every work request this call accepts (those before `PostSendError::index` on
    /// failure):
    /// - the memory of each SGE lies inside the memory region its `lkey` names and stays
    ///   valid until the request's completion has been polled from the send CQ, or until
    ///   that region is deregistered (deregistration waits for the device to let go);
    /// - nothing else writes that memory meanwhile, and for an RDMA READ nothing else reads
    ///   it either (the device writes it at a time the caller does not see);
    /// - `remote_addr .. remote_addr + length` is a range the `rkey` grants for the
    ///   operation. The responder checks the key, so a wrong range ends in
    ///   `WcStatus::RemAccessErr` rather than touching other memory; but a key of memory in
    ///   this process must have been registered under `ProtectionDomain::reg_mr`'s contract.
    unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostSendError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_status_round_trips_raw_values() {
        for raw in 0..25 {
            assert_eq!(WcStatus::from_raw(raw).raw(), raw);
        }
    }

    #[test]
    fn mtu_bytes() {
        assert_eq!(mtu::bytes(mtu::MTU_1024), 1024);
        assert_eq!(mtu::bytes(mtu::MTU_4096), 4096);
        assert_eq!(mtu::bytes(0), 0);
        assert_eq!(mtu::bytes(6), 0);
    }

    #[test]
    fn mask_contains() {
        let m = QpAttrMask::STATE | QpAttrMask::PORT;
        assert!(m.contains(QpAttrMask::STATE));
        assert!(!m.contains(QpAttrMask::AV));
    }
}
