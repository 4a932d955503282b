//! The verbs provider over the system's libibverbs, loaded with dlopen at run time so that
//! Ferry loads where no RDMA stack is installed.
//!
//! Exported verbs are resolved with `libloading`; `rdma-sys` supplies the C types and the
//! inline verbs (`ibv_post_send`, `ibv_poll_cq`) that call through the context's ops.
//! Nothing here calls an `extern "C"` function of rdma-sys, so the binary has no `NEEDED`
//! entry for libibverbs or librdmacm (a test checks it).
//!
//! libibverbs objects may be used from any thread; each handle here owns one object and
//! releases it in `Drop` after every child (which holds an `Arc` to it) is gone.

use std::any::Any;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use rdma_sys::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_gid, ibv_mr, ibv_pd,
    ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_type, ibv_send_flags, ibv_send_wr,
    ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wr_opcode,
};

use crate::provider::{
    CompletionQueue, Context, DeviceInfo, Gid, MemoryRegion, PortAttr, PostSendError,
    ProtectionDomain, Provider, QpAttr, QpAttrMask, QpCaps, QueuePair, SendWr, VerbsError,
    VerbsResult, WcStatus, WorkCompletion, WrOpcode,
};

/// The library loaded by [`IbverbsProvider::load`].
pub const LIBIBVERBS: &str = "libibverbs.so.1";

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
type GetDeviceGuid = unsafe extern "C" fn(*mut ibv_device) -> u64;
type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCq = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;

/// The resolved verbs; the library stays loaded while any handle holds this.
struct Lib {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    get_device_guid: GetDeviceGuid,
    open_device: OpenDevice,
    close_device: CloseDevice,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    create_qp: CreateQp,
    modify_qp: ModifyQp,
    destroy_qp: DestroyQp,
    query_port: QueryPort,
    query_gid: QueryGid,
    // Declared last: the function pointers above are only valid while it is loaded.
    _library: libloading::Library,
}

/// The errno of a verb that returned `rc` (libibverbs returns the errno itself, or -1 and
/// sets errno).
fn rc_errno(rc: c_int) -> i32 {
    if rc > 0 {
        rc
    } else {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    }
}

fn errno_error(verb: &'static str, errno: i32) -> VerbsError {
    VerbsError::errno(
        verb,
        errno,
        std::io::Error::from_raw_os_error(errno).to_string(),
    )
}

/// The error of a verb that returned NULL.
fn null_error(verb: &'static str) -> VerbsError {
    let errno = std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(libc::EIO);
    errno_error(verb, errno)
}

impl Lib {
    fn load(name: &str) -> VerbsResult<Self> {
        let unavailable = |e: libloading::Error| {
            VerbsError::Unavailable(format!("{name} could not be loaded: {e}"))
        };
        // SAFETY: loading libibverbs runs its initializers, which only set up its own state.
        let library = unsafe { libloading::Library::new(name) }.map_err(unavailable)?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the exported libibverbs verb of that name, whose C
                // signature the type alias it is assigned to mirrors; the pointer is kept only
                // next to the library that stays loaded with it.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(unavailable)?
            };
        }
        Ok(Self {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            get_device_guid: sym!("ibv_get_device_guid"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            _library: library,
        })
    }

    /// Runs `f` over the device list, freeing it afterwards.
    fn with_devices<T>(
        &self,
        f: impl FnOnce(&[*mut ibv_device]) -> VerbsResult<T>,
    ) -> VerbsResult<T> {
        let mut n: c_int = 0;
        // SAFETY: ibv_get_device_list writes the count and returns a NULL-terminated array
        // (or NULL with errno set).
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            let err = std::io::Error::last_os_error();
            return Err(VerbsError::Unavailable(format!(
                "no RDMA device: ibv_get_device_list: {err}"
            )));
        }
        let n = usize::try_from(n).unwrap_or(0);
        // SAFETY: the array holds `n` device pointers and stays valid until freed below.
        let devices = unsafe { std::slice::from_raw_parts(list, n) };
        let result = if devices.is_empty() {
            Err(VerbsError::Unavailable(
                "no RDMA device: ibv_get_device_list found none".into(),
            ))
        } else {
            f(devices)
        };
        // SAFETY: `list` came from ibv_get_device_list and is freed once; opened devices
        // stay valid after it.
        unsafe { (self.free_device_list)(list) };
        result
    }

    fn device_name(&self, dev: *mut ibv_device) -> String {
        // SAFETY: `dev` is an entry of a live device list; the name is a C string owned by it.
        let name = unsafe { (self.get_device_name)(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, valid while the list is.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The verbs provider over the system's libibverbs.
#[must_use]
pub struct IbverbsProvider {
    lib: Arc<Lib>,
}

impl std::fmt::Debug for IbverbsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbverbsProvider").finish_non_exhaustive()
    }
}

impl IbverbsProvider {
    /// Loads `libibverbs.so.1` and resolves the verbs.
    ///
    /// # Errors
    /// [`VerbsError::Unavailable`] when the library or one of its verbs is missing.
    pub fn load() -> VerbsResult<Self> {
        Self::load_library(LIBIBVERBS)
    }

    /// As [`load`](Self::load), from another library name or path.
    ///
    /// # Errors
    /// [`VerbsError::Unavailable`] when the library or one of its verbs is missing.
    pub fn load_library(name: &str) -> VerbsResult<Self> {
        Ok(Self {
            lib: Arc::new(Lib::load(name)?),
        })
    }
}

impl Provider for IbverbsProvider {
    fn name(&self) -> &'static str {
        "ibverbs"
    }

    fn devices(&self) -> VerbsResult<Vec<DeviceInfo>> {
        self.lib.with_devices(|devs| {
            Ok(devs
                .iter()
                .map(|&d| DeviceInfo {
                    name: self.lib.device_name(d),
                    // SAFETY: `d` is an entry of the live list.
                    guid: u64::from_be(unsafe { (self.lib.get_device_guid)(d) }),
                })
                .collect())
        })
    }

    fn open(&self, name: &str) -> VerbsResult<Arc<dyn Context>> {
        self.lib.with_devices(|devs| {
            let Some(&dev) = devs.iter().find(|&&d| self.lib.device_name(d) == name) else {
                let names: Vec<String> = devs.iter().map(|&d| self.lib.device_name(d)).collect();
                return Err(VerbsError::errno(
                    "ibv_open_device",
                    libc::ENODEV,
                    format!("no RDMA device {name:?} (present: {})", names.join(", ")),
                ));
            };
            // SAFETY: `dev` is an entry of the live list; the context outlives the list.
            let ctx = unsafe { (self.lib.open_device)(dev) };
            if ctx.is_null() {
                return Err(null_error("ibv_open_device"));
            }
            let ctx: Arc<dyn Context> = Arc::new(IbvContext(Arc::new(CtxInner {
                lib: self.lib.clone(),
                ctx,
                name: name.to_owned(),
            })));
            Ok(ctx)
        })
    }
}

/// An open device; closed when the context handle and every child are gone.
struct CtxInner {
    lib: Arc<Lib>,
    ctx: *mut ibv_context,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread; the pointer is released only
// in Drop, after every child holding an Arc to it is gone.
unsafe impl Send for CtxInner {}
// SAFETY: as above; the verbs called through `&self` are thread-safe in libibverbs.
unsafe impl Sync for CtxInner {}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, closed once; every child is gone.
        let rc = unsafe { (self.lib.close_device)(self.ctx) };
        if rc != 0 {
            tracing::warn!(device = %self.name, errno = rc_errno(rc), "ibv_close_device failed");
        }
    }
}

struct IbvContext(Arc<CtxInner>);

impl Context for IbvContext {
    fn device_name(&self) -> &str {
        &self.0.name
    }

    fn query_port(&self, port: u8) -> VerbsResult<PortAttr> {
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `attr` is at least as large as what the exported verb
        // (the compat layout, a prefix of ibv_port_attr) writes.
        let rc = unsafe { (self.0.lib.query_port)(self.0.ctx, port, &mut attr) };
        if rc != 0 {
            return Err(errno_error("ibv_query_port", rc_errno(rc)));
        }
        Ok(PortAttr {
            state: attr.state,
            active_mtu: attr.active_mtu,
            lid: attr.lid,
            link_layer: attr.link_layer,
            gid_table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> VerbsResult<Gid> {
        let index = c_int::try_from(index)
            .map_err(|_| VerbsError::errno("ibv_query_gid", libc::EINVAL, "GID index too large"))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: live context; `gid` is a valid output buffer.
        let rc = unsafe { (self.0.lib.query_gid)(self.0.ctx, port, index, &mut gid) };
        if rc != 0 {
            return Err(errno_error("ibv_query_gid", rc_errno(rc)));
        }
        // SAFETY: every bit pattern is a valid `raw` array.
        Ok(unsafe { gid.raw })
    }

    fn alloc_pd(&self) -> VerbsResult<Arc<dyn ProtectionDomain>> {
        // SAFETY: live context.
        let pd = unsafe { (self.0.lib.alloc_pd)(self.0.ctx) };
        if pd.is_null() {
            return Err(null_error("ibv_alloc_pd"));
        }
        Ok(Arc::new(IbvPd(Arc::new(PdInner {
            ctx: self.0.clone(),
            pd,
        }))))
    }

    fn create_cq(&self, depth: u32) -> VerbsResult<Arc<dyn CompletionQueue>> {
        let cqe = c_int::try_from(depth)
            .map_err(|_| VerbsError::errno("ibv_create_cq", libc::EINVAL, "CQ depth too large"))?;
        // SAFETY: live context; no completion channel.
        let cq = unsafe {
            (self.0.lib.create_cq)(
                self.0.ctx,
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(null_error("ibv_create_cq"));
        }
        Ok(Arc::new(IbvCq {
            ctx: self.0.clone(),
            cq,
        }))
    }
}

/// A protection domain; deallocated after its MRs and QPs.
struct PdInner {
    ctx: Arc<CtxInner>,
    pd: *mut ibv_pd,
}

// SAFETY: see CtxInner.
unsafe impl Send for PdInner {}
// SAFETY: see CtxInner.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once; its MRs and QPs are gone.
        let rc = unsafe { (self.ctx.lib.dealloc_pd)(self.pd) };
        if rc != 0 {
            tracing::warn!(errno = rc_errno(rc), "ibv_dealloc_pd failed");
        }
    }
}

struct IbvPd(Arc<PdInner>);

impl ProtectionDomain for IbvPd {
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> VerbsResult<Arc<dyn MemoryRegion>> {
        let flags = c_int::try_from(access)
            .map_err(|_| VerbsError::errno("ibv_reg_mr", libc::EINVAL, "access flags too large"))?;
        // SAFETY: live PD; the caller keeps `addr..addr+len` valid while registered.
        let mr = unsafe { (self.0.ctx.lib.reg_mr)(self.0.pd, addr.cast(), len, flags) };
        if mr.is_null() {
            return Err(null_error("ibv_reg_mr"));
        }
        // SAFETY: a non-NULL MR returned by ibv_reg_mr is initialized.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Arc::new(IbvMr {
            pd: self.0.clone(),
            mr,
            lkey,
            rkey,
            addr: addr as u64,
            len,
        }))
    }

    fn create_qp(
        &self,
        send_cq: &Arc<dyn CompletionQueue>,
        recv_cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> VerbsResult<Arc<dyn QueuePair>> {
        let (Some(scq), Some(rcq)) = (
            send_cq.as_any().downcast_ref::<IbvCq>(),
            recv_cq.as_any().downcast_ref::<IbvCq>(),
        ) else {
            return Err(VerbsError::errno(
                "ibv_create_qp",
                libc::EINVAL,
                "the CQs do not belong to the ibverbs provider",
            ));
        };
        // SAFETY: ibv_qp_init_attr is plain data; all-zero is valid (no SRQ, no context).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = scq.cq;
        init.recv_cq = rcq.cq;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_recv_wr = caps.max_recv_wr;
        init.cap.max_send_sge = caps.max_send_sge;
        init.cap.max_recv_sge = caps.max_recv_sge;
        // SAFETY: live PD and CQs of the same context; `init` is fully initialized.
        let qp = unsafe { (self.0.ctx.lib.create_qp)(self.0.pd, &mut init) };
        if qp.is_null() {
            return Err(null_error("ibv_create_qp"));
        }
        // SAFETY: a non-NULL QP returned by ibv_create_qp is initialized.
        let qpn = unsafe { (*qp).qp_num };
        Ok(Arc::new(IbvQp {
            pd: self.0.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            qp,
            qpn,
        }))
    }
}

struct IbvMr {
    pd: Arc<PdInner>,
    mr: *mut ibv_mr,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
}

// SAFETY: see CtxInner; the MR is only read through copies taken at registration.
unsafe impl Send for IbvMr {}
// SAFETY: see above.
unsafe impl Sync for IbvMr {}

impl MemoryRegion for IbvMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        let rc = unsafe { (self.pd.ctx.lib.dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::warn!(errno = rc_errno(rc), "ibv_dereg_mr failed");
        }
    }
}

/// Completions polled per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

struct IbvCq {
    ctx: Arc<CtxInner>,
    cq: *mut ibv_cq,
}

// SAFETY: see CtxInner; libibverbs serializes polling of one CQ internally.
unsafe impl Send for IbvCq {}
// SAFETY: see above.
unsafe impl Sync for IbvCq {}

impl Drop for IbvCq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once; the QPs using it are gone (they
        // hold this handle).
        let rc = unsafe { (self.ctx.lib.destroy_cq)(self.cq) };
        if rc != 0 {
            tracing::warn!(errno = rc_errno(rc), "ibv_destroy_cq failed");
        }
    }
}

impl CompletionQueue for IbvCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> VerbsResult<usize> {
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return Ok(0);
        }
        // SAFETY: ibv_wc is plain data; all-zero is a valid value.
        let mut wcs: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: live CQ; `wcs` has room for `want` entries.
        let n = unsafe { rdma_sys::ibv_poll_cq(self.cq, want as c_int, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(errno_error("ibv_poll_cq", rc_errno(-n)));
        }
        let n = n as usize;
        for (slot, wc) in out.iter_mut().zip(&wcs[..n]) {
            *slot = WorkCompletion {
                wr_id: wc.wr_id,
                status: WcStatus::from_raw(wc.status),
                opcode: if wc.opcode == ibv_wc_opcode::IBV_WC_RDMA_READ {
                    WrOpcode::RdmaRead
                } else {
                    WrOpcode::RdmaWrite
                },
                byte_len: wc.byte_len,
                qp_num: wc.qp_num,
                vendor_err: wc.vendor_err,
            };
        }
        Ok(n)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct IbvQp {
    pd: Arc<PdInner>,
    _send_cq: Arc<dyn CompletionQueue>,
    _recv_cq: Arc<dyn CompletionQueue>,
    qp: *mut ibv_qp,
    qpn: u32,
}

// SAFETY: see CtxInner; libibverbs QPs may be posted to from any thread.
unsafe impl Send for IbvQp {}
// SAFETY: see above.
unsafe impl Sync for IbvQp {}

impl Drop for IbvQp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once, before its CQs and PD (held here).
        let rc = unsafe { (self.pd.ctx.lib.destroy_qp)(self.qp) };
        if rc != 0 {
            tracing::warn!(
                qpn = self.qpn,
                errno = rc_errno(rc),
                "ibv_destroy_qp failed"
            );
        }
    }
}

impl QueuePair for IbvQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> VerbsResult<()> {
        // SAFETY: ibv_qp_attr is plain data; all-zero is a valid value.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = attr.state as u32;
        a.pkey_index = attr.pkey_index;
        a.port_num = attr.port_num;
        a.qp_access_flags = attr.access_flags;
        a.path_mtu = attr.path_mtu;
        a.dest_qp_num = attr.dest_qpn;
        a.rq_psn = attr.rq_psn;
        a.sq_psn = attr.sq_psn;
        a.max_rd_atomic = attr.max_rd_atomic;
        a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        a.min_rnr_timer = attr.min_rnr_timer;
        a.timeout = attr.timeout;
        a.retry_cnt = attr.retry_cnt;
        a.rnr_retry = attr.rnr_retry;
        a.ah_attr = ah_attr(attr);
        let mask = c_int::try_from(mask.0)
            .map_err(|_| VerbsError::errno("ibv_modify_qp", libc::EINVAL, "mask too large"))?;
        // SAFETY: live QP; `a` is fully initialized and only the masked fields are read.
        let rc = unsafe { (self.pd.ctx.lib.modify_qp)(self.qp, &mut a, mask) };
        if rc != 0 {
            return Err(errno_error("ibv_modify_qp", rc_errno(rc)));
        }
        Ok(())
    }

    /// # Safety
    /// As `QueuePair::post_send`: the HCA reads or writes the SGEs' memory after this returns.
    unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<Vec<ibv_sge>> = wrs
            .iter()
            .map(|w| {
                w.sg_list
                    .iter()
                    .map(|s| ibv_sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    })
                    .collect()
            })
            .collect();
        let mut chain: Vec<ibv_send_wr> = Vec::with_capacity(wrs.len());
        for (w, sg) in wrs.iter().zip(sges.iter_mut()) {
            // SAFETY: ibv_send_wr is plain data (pointers and unions of integers); all-zero
            // is a valid value.
            let mut raw: ibv_send_wr = unsafe { std::mem::zeroed() };
            raw.wr_id = w.wr_id;
            raw.sg_list = sg.as_mut_ptr();
            raw.num_sge = sg.len() as c_int;
            raw.opcode = match w.opcode {
                WrOpcode::RdmaWrite => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                WrOpcode::RdmaRead => ibv_wr_opcode::IBV_WR_RDMA_READ,
            };
            raw.send_flags = if w.signaled {
                ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            raw.wr.rdma = rdma_sys::rdma_t {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
            };
            chain.push(raw);
        }
        // Linked after the vector stops growing, so the pointers stay valid.
        let base = chain.as_mut_ptr();
        for i in 1..chain.len() {
            // SAFETY: `i` is in bounds of `chain`, which is not resized from here on.
            chain[i - 1].next = unsafe { base.add(i) };
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the chain and its SGE arrays outlive the call (the provider
        // copies WQEs before returning); the memory the SGEs name is the caller's to keep
        // valid and unaliased until the completions, per this function's contract.
        let rc = unsafe { rdma_sys::ibv_post_send(self.qp, base, &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let index = if bad.is_null() {
            0
        } else {
            // SAFETY: on failure `bad` points into `chain`.
            usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
        };
        Err(PostSendError {
            index,
            error: errno_error("ibv_post_send", rc_errno(rc)),
        })
    }
}

fn ah_attr(attr: &QpAttr) -> ibv_ah_attr {
    // SAFETY: ibv_ah_attr is plain data; all-zero is a valid value.
    let mut ah: ibv_ah_attr = unsafe { std::mem::zeroed() };
    ah.dlid = attr.av.dlid;
    ah.port_num = attr.av.port_num;
    if let Some(dgid) = attr.av.dgid {
        ah.is_global = 1;
        ah.grh.dgid = ibv_gid { raw: dgid };
        ah.grh.sgid_index = attr.av.sgid_index;
        ah.grh.hop_limit = attr.av.hop_limit;
    }
    ah
}

#[cfg(test)]
mod tests;
