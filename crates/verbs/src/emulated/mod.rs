//! A verbs device in software, so the RDMA transport runs unchanged where no NIC exists.
//!
//! Every process has one device, `emu0`, shared by all contexts opened in it (two engines
//! in one process are two contexts on one device, like two processes on one HCA). Its
//! port 1 is an ACTIVE Ethernet port with a 4096-byte MTU and one GID: `fe80::/64` plus 8
//! random bytes, fixed for the life of the process.
//!
//! The device runs a responder on an abstract unix socket named from its GID
//! (`\0ferry-emu-verbs-<gid hex>`), started by the first `open` and stopped when the last
//! context drops. An initiator QP in RTS connects to the responder of its `av.dgid` at its
//! first post; the responder executes RDMA WRITE and READ against its registered MRs after
//! the checks an HCA makes (target QP connected to the sender, rkey in the QP's PD with the
//! right access on both MR and QP, bounds) and NAKs (`RemAccessErr` at the initiator)
//! without touching memory otherwise.
//!
//! Retries are modeled as on a real RC connection, where the responder's HCA acknowledges
//! in hardware whatever its host does: a live peer, however busy, slow or stopped, never
//! causes `RetryExcErr`, and only a peer that is gone does. The responder's socket tells
//! the two apart. While the connection is open the responder's process lives, and a work
//! request waits for its answer as long as it takes (a hung peer is the transport's slice
//! deadline's and the control plane's business). A work request is lost when the
//! connection fails or closes before it was answered (the process died, its device
//! closed), when the responder cannot be reached, or when the responder drops it because
//! the target QP is not connected to the sender (destroyed, reset, in error, connected
//! elsewhere), as an HCA drops the packet and every retransmission. A lost work request
//! ends in `RetryExcErr` once the modeled transport timeout, 4.096 µs × 2^timeout ×
//! (retry_cnt + 1), has passed since it was sent, and not before the loss is seen; with
//! timeout 0 (infinite) it never ends.
//!
//! The verbs rules are enforced strictly: the QP state order and the attribute mask of each
//! transition, work request and SGE limits, CQ overflow (the CQ becomes unusable), lkey and
//! rkey validation, in-order completion, and the error state that flushes every outstanding
//! and later work request. [`EmulatedFaults`] injects loss, errors and delay; its
//! `retry_exceeded` fault ends a work request in `RetryExcErr` after the modeled timeout
//! without sending it, `silent_loss` drops one with no completion ever, and `corrupt` flips
//! one byte of what one carries (a WRITE's payload, a READ's response) and completes it.
//!
//! Threads: the responder has a listener and one thread per inbound connection; each QP
//! has a worker (sends and completes) and a receiver per connection. Dropping a QP joins
//! its threads; dropping the last context joins the responder's.

mod device;
mod faults;
mod qp;
mod target;
#[cfg(test)]
mod tests;
mod wire;

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

pub use faults::{EmulatedFaults, FaultSpecError};

use crate::provider::{
    access, link_layer, mtu, port_state, CompletionQueue, Context, DeviceInfo, Gid, MemoryRegion,
    PortAttr, PostSendError, ProtectionDomain, Provider, QpAttr, QpAttrMask, QpCaps, QueuePair,
    SendWr, VerbsError, VerbsResult, WorkCompletion,
};
use device::{limits, lock, Device, MrEntry};
use faults::FaultState;
use qp::QpShared;

/// The device name.
pub const DEVICE_NAME: &str = "emu0";

/// The emulated verbs provider.
///
/// Cheap to create; the device behind it is per process. Faults given here (or later with
/// [`set_faults`](Self::set_faults)) apply to work requests posted on QPs of contexts
/// opened from this provider.
#[derive(Debug)]
pub struct EmulatedProvider {
    faults: Arc<FaultState>,
}

impl Default for EmulatedProvider {
    fn default() -> Self {
        Self::new(EmulatedFaults::default())
    }
}

impl EmulatedProvider {
    /// A provider injecting `faults` (`EmulatedFaults::default()` for none).
    #[must_use]
    pub fn new(faults: EmulatedFaults) -> Self {
        Self {
            faults: Arc::new(FaultState::new(faults)),
        }
    }

    /// Changes the faults, at once, for every context opened from this provider; the
    /// random source is reseeded with `faults.seed`.
    pub fn set_faults(&self, faults: EmulatedFaults) {
        self.faults.set(faults);
    }

    /// The faults in force.
    pub fn faults(&self) -> EmulatedFaults {
        self.faults.get()
    }

    /// The GID of this process's device (port 1, index 0).
    pub fn gid() -> Gid {
        device::process_gid()
    }
}

impl Provider for EmulatedProvider {
    fn name(&self) -> &'static str {
        "emulated"
    }

    fn devices(&self) -> VerbsResult<Vec<DeviceInfo>> {
        let gid = device::process_gid();
        let mut guid = [0u8; 8];
        guid.copy_from_slice(&gid[8..]);
        Ok(vec![DeviceInfo {
            name: DEVICE_NAME.into(),
            guid: u64::from_be_bytes(guid),
        }])
    }

    fn open(&self, name: &str) -> VerbsResult<Arc<dyn Context>> {
        if name != DEVICE_NAME {
            return Err(VerbsError::errno(
                "ibv_open_device",
                libc::ENODEV,
                format!("no emulated device {name:?} (the emulated device is {DEVICE_NAME})"),
            ));
        }
        Ok(Arc::new(EmuContext {
            device: device::device()?,
            faults: self.faults.clone(),
        }))
    }
}

struct EmuContext {
    device: Arc<Device>,
    faults: Arc<FaultState>,
}

impl EmuContext {
    fn check_port(&self, verb: &'static str, port: u8) -> VerbsResult<()> {
        if port == 1 {
            Ok(())
        } else {
            Err(VerbsError::errno(
                verb,
                libc::EINVAL,
                format!("port {port} does not exist ({DEVICE_NAME} has port 1)"),
            ))
        }
    }
}

impl Context for EmuContext {
    fn device_name(&self) -> &str {
        DEVICE_NAME
    }

    fn query_port(&self, port: u8) -> VerbsResult<PortAttr> {
        self.check_port("ibv_query_port", port)?;
        Ok(PortAttr {
            state: port_state::ACTIVE,
            active_mtu: mtu::MTU_4096,
            lid: 0,
            link_layer: link_layer::ETHERNET,
            gid_table_len: 1,
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> VerbsResult<Gid> {
        self.check_port("ibv_query_gid", port)?;
        if index != 0 {
            return Err(VerbsError::errno(
                "ibv_query_gid",
                libc::EINVAL,
                format!("GID index {index} is outside the table (1 entry)"),
            ));
        }
        Ok(self.device.registry.gid)
    }

    fn alloc_pd(&self) -> VerbsResult<Arc<dyn ProtectionDomain>> {
        Ok(Arc::new(EmuPd {
            id: self.device.registry.new_pd_id(),
            ctx: Arc::new(EmuContext {
                device: self.device.clone(),
                faults: self.faults.clone(),
            }),
        }))
    }

    fn create_cq(&self, depth: u32) -> VerbsResult<Arc<dyn CompletionQueue>> {
        if depth == 0 || depth > limits::MAX_CQE {
            return Err(VerbsError::errno(
                "ibv_create_cq",
                libc::EINVAL,
                format!("CQ depth {depth} is outside 1..={}", limits::MAX_CQE),
            ));
        }
        Ok(Arc::new(EmuCq {
            _device: self.device.clone(),
            shared: Arc::new(CqShared {
                depth,
                inner: Mutex::new(CqInner {
                    queue: VecDeque::new(),
                    overflowed: false,
                }),
            }),
        }))
    }
}

struct EmuPd {
    id: u64,
    ctx: Arc<EmuContext>,
}

impl ProtectionDomain for EmuPd {
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access_flags: u32,
    ) -> VerbsResult<Arc<dyn MemoryRegion>> {
        let einval = |m: String| Err(VerbsError::errno("ibv_reg_mr", libc::EINVAL, m));
        let known = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
        if access_flags & !known != 0 {
            return einval(format!("access flags {access_flags:#x} are not supported"));
        }
        if access_flags & access::REMOTE_WRITE != 0 && access_flags & access::LOCAL_WRITE == 0 {
            return einval("REMOTE_WRITE needs LOCAL_WRITE".into());
        }
        if addr.is_null() || len == 0 || (addr as u64).checked_add(len as u64).is_none() {
            return einval(format!("bad region {addr:p}+{len}"));
        }
        let entry = self
            .ctx
            .device
            .registry
            .register(self.id, addr as u64, len, access_flags);
        Ok(Arc::new(EmuMr {
            entry,
            pd: Arc::new(EmuPd {
                id: self.id,
                ctx: self.ctx.clone(),
            }),
        }))
    }

    fn create_qp(
        &self,
        send_cq: &Arc<dyn CompletionQueue>,
        recv_cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> VerbsResult<Arc<dyn QueuePair>> {
        let einval = |m: String| Err(VerbsError::errno("ibv_create_qp", libc::EINVAL, m));
        let (Some(scq), Some(_)) = (
            send_cq.as_any().downcast_ref::<EmuCq>(),
            recv_cq.as_any().downcast_ref::<EmuCq>(),
        ) else {
            return einval("the CQs are not emulated CQs".into());
        };
        if caps.max_send_wr > limits::MAX_QP_WR || caps.max_recv_wr > limits::MAX_QP_WR {
            return einval(format!(
                "max_send_wr {} / max_recv_wr {} exceed the device limit {}",
                caps.max_send_wr,
                caps.max_recv_wr,
                limits::MAX_QP_WR
            ));
        }
        if caps.max_send_sge > limits::MAX_SGE || caps.max_recv_sge > limits::MAX_SGE {
            return einval(format!(
                "max_send_sge {} / max_recv_sge {} exceed the device limit {}",
                caps.max_send_sge,
                caps.max_recv_sge,
                limits::MAX_SGE
            ));
        }
        let shared = QpShared::create(
            &self.ctx.device.registry,
            self.id,
            caps,
            scq.shared.clone(),
            self.ctx.faults.clone(),
        )?;
        Ok(Arc::new(EmuQp {
            shared,
            _pd: Arc::new(EmuPd {
                id: self.id,
                ctx: self.ctx.clone(),
            }),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
        }))
    }
}

struct EmuMr {
    entry: Arc<MrEntry>,
    pd: Arc<EmuPd>,
}

impl MemoryRegion for EmuMr {
    fn lkey(&self) -> u32 {
        self.entry.lkey
    }
    fn rkey(&self) -> u32 {
        self.entry.rkey
    }
    fn addr(&self) -> u64 {
        self.entry.addr
    }
    fn len(&self) -> usize {
        self.entry.len
    }
}

impl Drop for EmuMr {
    fn drop(&mut self) {
        self.pd.ctx.device.registry.deregister(&self.entry);
    }
}

/// The completions of an emulated CQ, shared with the QPs that complete into it.
pub(crate) struct CqShared {
    depth: u32,
    inner: Mutex<CqInner>,
}

struct CqInner {
    queue: VecDeque<WorkCompletion>,
    overflowed: bool,
}

impl CqShared {
    /// Adds a completion; beyond the depth the CQ overflows and becomes unusable.
    pub(crate) fn push(&self, wc: WorkCompletion) {
        let mut g = lock(&self.inner);
        if g.overflowed {
            return;
        }
        if g.queue.len() >= self.depth as usize {
            g.overflowed = true;
            tracing::error!(
                depth = self.depth,
                "emulated verbs: completion queue overflow; the CQ is now in error"
            );
            return;
        }
        g.queue.push_back(wc);
    }
}

struct EmuCq {
    _device: Arc<Device>,
    shared: Arc<CqShared>,
}

impl CompletionQueue for EmuCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> VerbsResult<usize> {
        let mut g = lock(&self.shared.inner);
        if g.overflowed {
            return Err(VerbsError::errno(
                "ibv_poll_cq",
                libc::EOVERFLOW,
                format!(
                    "completion queue overflowed (depth {}); completions were lost",
                    self.shared.depth
                ),
            ));
        }
        let n = out.len().min(g.queue.len());
        for (slot, wc) in out.iter_mut().zip(g.queue.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct EmuQp {
    shared: Arc<QpShared>,
    _pd: Arc<EmuPd>,
    _send_cq: Arc<dyn CompletionQueue>,
    _recv_cq: Arc<dyn CompletionQueue>,
}

impl QueuePair for EmuQp {
    fn qpn(&self) -> u32 {
        self.shared.qpn
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> VerbsResult<()> {
        self.shared.modify(attr, mask)
    }

    /// # Safety
    /// As `QueuePair::post_send`: the QP's worker copies from or into the SGEs' memory after
    /// this returns.
    unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        // SAFETY: the caller upholds `QueuePair::post_send`'s contract, which is
        // `QpShared::post_send`'s.
        unsafe { self.shared.post_send(wrs) }
    }
}

impl Drop for EmuQp {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}
