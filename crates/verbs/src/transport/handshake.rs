//! The endpoint handshake carried over the control plane (`TransportReq`), and the queue
//! pair bring-up both sides perform: RESET → INIT → RTR → RTS with the RC attribute masks.

use serde::{Deserialize, Serialize};

use crate::provider::{
    access, AddressVector, Gid, QpAttr, QpAttrMask, QpState, QueuePair, VerbsResult,
};

/// What each side tells the other about its end of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndpointInfo {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number it sends.
    pub psn: u32,
    /// Its GID (hex).
    pub gid: String,
    /// Its LID (InfiniBand).
    pub lid: u16,
    /// Its port's active MTU (`ibv_mtu`).
    pub mtu: u32,
}

/// The initiator's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ConnectRequest {
    /// The initiator engine (so a reconnect replaces its old queue pair).
    pub engine_id: u64,
    /// Which of the initiator's endpoints this is.
    pub slot: u32,
    /// Index of the target device to use (in the target's published list).
    pub device: usize,
    /// The initiator's end.
    pub endpoint: EndpointInfo,
}

/// Settings of the bring-up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bringup {
    pub port: u8,
    pub gid_index: u8,
    pub ack_timeout: u8,
    pub retry_cnt: u8,
}

/// Outstanding RDMA READs per QP (initiator and responder).
const RD_ATOMIC: u8 = 16;

/// RESET → INIT.
pub(crate) fn to_init(qp: &dyn QueuePair, b: Bringup) -> VerbsResult<()> {
    let mut attr = QpAttr::state(QpState::Init);
    attr.port_num = b.port;
    attr.pkey_index = 0;
    attr.access_flags = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    qp.modify(
        &attr,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
}

/// INIT → RTR → RTS towards `remote`.
pub(crate) fn connect(
    qp: &dyn QueuePair,
    b: Bringup,
    local: &EndpointInfo,
    remote: &EndpointInfo,
    remote_gid: Gid,
) -> VerbsResult<()> {
    let mut attr = QpAttr::state(QpState::Rtr);
    attr.path_mtu = local.mtu.min(remote.mtu).max(1);
    attr.dest_qpn = remote.qpn;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = RD_ATOMIC;
    attr.min_rnr_timer = 12;
    attr.av = AddressVector {
        dlid: remote.lid,
        dgid: Some(remote_gid),
        sgid_index: b.gid_index,
        hop_limit: 64,
        port_num: b.port,
    };
    qp.modify(
        &attr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )?;
    let mut attr = QpAttr::state(QpState::Rts);
    attr.sq_psn = local.psn;
    attr.timeout = b.ack_timeout;
    attr.retry_cnt = b.retry_cnt;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = RD_ATOMIC;
    qp.modify(
        &attr,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
}

/// Moves a queue pair to ERR: every outstanding work request is flushed.
pub(crate) fn to_error(qp: &dyn QueuePair) -> VerbsResult<()> {
    qp.modify(&QpAttr::state(QpState::Err), QpAttrMask::STATE)
}

/// A random 24-bit packet sequence number.
pub(crate) fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        return std::process::id() & 0xff_ffff;
    }
    u32::from_le_bytes(b) & 0xff_ffff
}
