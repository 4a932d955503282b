//! The process's emulated device: the registries of QPs and MRs, the GID, and the
//! responder that executes incoming RDMA WRITE/READ against registered memory.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::thread::JoinHandle;

use super::faults::Rng;
use super::target::TargetQp;
use super::wire::{self, Op, Request, Response, Status};
use crate::provider::{access, Gid, QpState, VerbsError, VerbsResult};

/// Inbound connections served at once; more are refused with a warning.
const MAX_INBOUND: usize = 4096;

/// Locks, ignoring poisoning (a panicking holder leaves plain data behind).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's GID: fe80::/64 and 8 random bytes, stable for the process's life.
pub(crate) fn process_gid() -> Gid {
    static GID: OnceLock<Gid> = OnceLock::new();
    *GID.get_or_init(|| {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        let mut tail = [0u8; 8];
        if getrandom::fill(&mut tail).is_err() {
            tail = Rng::from_os().next_u64().to_le_bytes();
        }
        gid[8..].copy_from_slice(&tail);
        gid
    })
}

/// The responder's abstract socket name for a GID (without the leading NUL).
pub(crate) fn responder_name(gid: &Gid) -> String {
    let hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
    format!("ferry-emu-verbs-{hex}")
}

/// The responder's abstract socket address for a GID.
pub(crate) fn responder_addr(gid: &Gid) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(responder_name(gid).as_bytes())
}

/// A registered memory region as the device sees it.
#[derive(Debug)]
pub(crate) struct MrEntry {
    pub(crate) pd: u64,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) access: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    /// False once deregistered; copies hold the read side so deregistration waits for
    /// them and no copy starts after it.
    live: RwLock<bool>,
}

impl MrEntry {
    /// Whether `addr..addr+len` lies inside the region.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        addr >= self.addr && end <= self.addr + self.len as u64
    }

    /// Copies region bytes at `addr` into `out`; false when deregistered or out of bounds.
    pub(crate) fn read_into(&self, addr: u64, out: &mut [u8]) -> bool {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        if !*live || !self.contains(addr, out.len() as u64) {
            return false;
        }
        // SAFETY: the range lies inside a live registration, whose memory the owner of
        // `reg_mr` promised stays valid until deregistration; deregistration takes the
        // write side of `live`, which we hold for reading during the copy. `out` is a
        // distinct Rust buffer, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` into the region at `addr`; false when deregistered or out of bounds.
    pub(crate) fn write_from(&self, addr: u64, data: &[u8]) -> bool {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        if !*live || !self.contains(addr, data.len() as u64) {
            return false;
        }
        // SAFETY: as in `read_into`: the range is inside a live registration that cannot be
        // deregistered during the copy, and `data` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
        true
    }

    /// Marks the region dead, waiting for copies in progress.
    fn kill(&self) {
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = false;
    }
}

#[derive(Default)]
struct Keys {
    lkeys: HashMap<u32, Arc<MrEntry>>,
    rkeys: HashMap<u32, Arc<MrEntry>>,
}

/// Everything the device knows, shared with its responder threads.
pub(crate) struct Registry {
    pub(crate) gid: Gid,
    qps: Mutex<HashMap<u32, Arc<dyn TargetQp>>>,
    keys: Mutex<Keys>,
    rng: Mutex<Rng>,
    next_pd: AtomicU64,
}

/// Device limits.
pub(crate) mod limits {
    /// Work requests per queue.
    pub(crate) const MAX_QP_WR: u32 = 4096;
    /// SGEs per work request.
    pub(crate) const MAX_SGE: u32 = 16;
    /// Entries per CQ.
    pub(crate) const MAX_CQE: u32 = (1 << 22) - 1;
}

impl Registry {
    fn new() -> Self {
        Self {
            gid: process_gid(),
            qps: Mutex::new(HashMap::new()),
            keys: Mutex::new(Keys::default()),
            rng: Mutex::new(Rng::from_os()),
            next_pd: AtomicU64::new(1),
        }
    }

    pub(crate) fn new_pd_id(&self) -> u64 {
        self.next_pd.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a region under fresh random keys (never 0, unique on the device).
    pub(crate) fn register(&self, pd: u64, addr: u64, len: usize, access: u32) -> Arc<MrEntry> {
        let mut keys = lock(&self.keys);
        let mut rng = lock(&self.rng);
        let mut fresh = |keys: &Keys| loop {
            let k = rng.next_u64() as u32;
            if k != 0 && !keys.lkeys.contains_key(&k) && !keys.rkeys.contains_key(&k) {
                break k;
            }
        };
        let lkey = fresh(&keys);
        let mut rkey = fresh(&keys);
        while rkey == lkey {
            rkey = fresh(&keys);
        }
        let entry = Arc::new(MrEntry {
            pd,
            addr,
            len,
            access,
            lkey,
            rkey,
            live: RwLock::new(true),
        });
        keys.lkeys.insert(lkey, entry.clone());
        keys.rkeys.insert(rkey, entry.clone());
        entry
    }

    /// Removes a region; returns after every copy into or out of it has finished.
    pub(crate) fn deregister(&self, entry: &MrEntry) {
        {
            let mut keys = lock(&self.keys);
            keys.lkeys.remove(&entry.lkey);
            keys.rkeys.remove(&entry.rkey);
        }
        entry.kill();
    }

    pub(crate) fn by_lkey(&self, lkey: u32) -> Option<Arc<MrEntry>> {
        lock(&self.keys).lkeys.get(&lkey).cloned()
    }

    fn by_rkey(&self, rkey: u32) -> Option<Arc<MrEntry>> {
        lock(&self.keys).rkeys.get(&rkey).cloned()
    }

    /// Adds a QP under a fresh 24-bit number (not 0 or 1, which verbs reserves).
    pub(crate) fn add_qp<Q: TargetQp + 'static>(&self, make: impl FnOnce(u32) -> Arc<Q>) -> Arc<Q> {
        let mut qps = lock(&self.qps);
        let mut rng = lock(&self.rng);
        let qpn = loop {
            let n = (rng.next_u64() as u32) & 0x00ff_ffff;
            if n > 1 && !qps.contains_key(&n) {
                break n;
            }
        };
        let qp = make(qpn);
        qps.insert(qpn, qp.clone() as Arc<dyn TargetQp>);
        qp
    }

    pub(crate) fn remove_qp(&self, qpn: u32) {
        lock(&self.qps).remove(&qpn);
    }

    fn qp(&self, qpn: u32) -> Option<Arc<dyn TargetQp>> {
        lock(&self.qps).get(&qpn).cloned()
    }
}

struct Inbound {
    next_id: u64,
    conns: HashMap<u64, (UnixStream, JoinHandle<()>)>,
}

/// The emulated device `emu0`: one per process, shared by every context.
pub(crate) struct Device {
    pub(crate) registry: Arc<Registry>,
    stop: Arc<AtomicBool>,
    listener: Option<JoinHandle<()>>,
    inbound: Arc<Mutex<Inbound>>,
}

/// The live device, if any context holds it.
static DEVICE: Mutex<Weak<Device>> = Mutex::new(Weak::new());

/// Whether a device's responder holds the process's responder name: set when one starts,
/// cleared at the end of its drop. Between its last `Arc` going and that end, a new device
/// cannot bind the name yet.
static RESPONDER_HELD: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// The longest an open waits for the previous device to finish shutting down.
const RESPONDER_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The process's device, started (responder listening) if no context holds it now.
pub(crate) fn device() -> VerbsResult<Arc<Device>> {
    let mut slot = lock(&DEVICE);
    if let Some(d) = slot.upgrade() {
        return Ok(d);
    }
    // The previous device may be inside its drop (its last context just went): wait,
    // bounded, until its responder has let the name go, or binding it fails EADDRINUSE.
    {
        let (held, released) = &RESPONDER_HELD;
        let guard = lock(held);
        let (mut guard, _) = released
            .wait_timeout_while(guard, RESPONDER_RELEASE_WAIT, |held| *held)
            .unwrap_or_else(|p| p.into_inner());
        *guard = true;
    }
    match Device::start() {
        Ok(d) => {
            let d = Arc::new(d);
            *slot = Arc::downgrade(&d);
            Ok(d)
        }
        Err(e) => {
            release_responder();
            Err(e)
        }
    }
}

fn release_responder() {
    let (held, released) = &RESPONDER_HELD;
    *lock(held) = false;
    released.notify_all();
}

impl Device {
    fn start() -> VerbsResult<Self> {
        let registry = Arc::new(Registry::new());
        let addr = responder_addr(&registry.gid).map_err(|e| {
            VerbsError::errno(
                "ibv_open_device",
                e.raw_os_error().unwrap_or(libc::EINVAL),
                format!("emulated responder address: {e}"),
            )
        })?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| {
            VerbsError::errno(
                "ibv_open_device",
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("emulated responder could not listen: {e}"),
            )
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let inbound = Arc::new(Mutex::new(Inbound {
            next_id: 0,
            conns: HashMap::new(),
        }));
        let handle = {
            let (stop, inbound, registry) = (stop.clone(), inbound.clone(), registry.clone());
            std::thread::Builder::new()
                .name("emu-verbs-listen".into())
                .spawn(move || listen(listener, stop, inbound, registry))
                .map_err(|e| {
                    VerbsError::errno(
                        "ibv_open_device",
                        e.raw_os_error().unwrap_or(libc::EAGAIN),
                        format!("emulated responder thread: {e}"),
                    )
                })?
        };
        Ok(Self {
            registry,
            stop,
            listener: Some(handle),
            inbound,
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // A concurrent open waits on RESPONDER_HELD (not on DEVICE, which it holds) until
        // the responder's name is free again.
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; the listener sees `stop` and returns.
        if let Ok(addr) = responder_addr(&self.registry.gid) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(h) = self.listener.take() {
            let _ = h.join();
        }
        let conns: Vec<_> = lock(&self.inbound).conns.drain().collect();
        for (_, (stream, handle)) in conns {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            let _ = handle.join();
        }
        release_responder();
    }
}

fn listen(
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    inbound: Arc<Mutex<Inbound>>,
    registry: Arc<Registry>,
) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!(error = %e, "emulated verbs responder: accept failed");
                // Bounded back-off so a persistent error (EMFILE) does not spin.
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut guard = lock(&inbound);
        if guard.conns.len() >= MAX_INBOUND {
            tracing::warn!(
                limit = MAX_INBOUND,
                "emulated verbs responder: too many connections, refusing one"
            );
            continue;
        }
        let Ok(clone) = stream.try_clone() else {
            tracing::warn!("emulated verbs responder: could not clone a connection");
            continue;
        };
        let id = guard.next_id;
        guard.next_id += 1;
        let (reg, inb) = (registry.clone(), inbound.clone());
        let spawned = std::thread::Builder::new()
            .name("emu-verbs-resp".into())
            .spawn(move || {
                serve(stream, &reg);
                // Finished: forget the handle (the thread ends right after).
                lock(&inb).conns.remove(&id);
            });
        match spawned {
            Ok(h) => {
                guard.conns.insert(id, (clone, h));
            }
            Err(e) => tracing::warn!(error = %e, "emulated verbs responder: no thread"),
        }
    }
}

/// Serves one initiator connection until EOF, a malformed frame or shutdown. The
/// connection closes only then (or when the process dies), which initiators take as the
/// loss of every request still unanswered on it.
fn serve(mut stream: UnixStream, registry: &Registry) {
    loop {
        let mut header = [0u8; wire::REQUEST_LEN];
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let req = match Request::decode(&header) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "emulated verbs responder: malformed request, dropping the connection");
                return;
            }
        };
        let mut payload = Vec::new();
        if req.op == Op::Write {
            match (&mut stream)
                .take(u64::from(req.len))
                .read_to_end(&mut payload)
            {
                Ok(n) if n == req.len as usize => {}
                _ => return,
            }
        }
        #[cfg(test)]
        if hooks::at_responder(req.dst_qpn) == hooks::Verdict::Sever {
            return;
        }
        // Every request is answered, so that the initiator can tell a dropped packet from
        // a responder that has not got to it yet: while this connection stays open the
        // responder's process lives, and a live peer's HCA would have acknowledged.
        let (status, data) =
            execute(registry, &req, &payload).unwrap_or((Status::Dropped, Vec::new()));
        let resp = Response {
            status,
            seq: req.seq,
            len: data.len() as u32,
        };
        if stream.write_all(&resp.encode()).is_err() || stream.write_all(&data).is_err() {
            return;
        }
    }
}

/// Runs one request; `None` drops it (no such connected QP), as an HCA drops the packet
/// and every retransmission of it.
fn execute(registry: &Registry, req: &Request, payload: &[u8]) -> Option<(Status, Vec<u8>)> {
    let qp = registry.qp(req.dst_qpn)?;
    let (pd, qp_access) = {
        let inner = qp.peer_view();
        let connected = matches!(inner.state, QpState::Rtr | QpState::Rts)
            && inner.dest_qpn == req.src_qpn
            && inner.dgid == Some(req.src_gid);
        if !connected {
            tracing::debug!(
                qpn = req.dst_qpn,
                from = req.src_qpn,
                "emulated verbs responder: packet for an unconnected QP dropped"
            );
            return None;
        }
        (qp.pd(), inner.access_flags)
    };
    let needed = match req.op {
        Op::Write => access::REMOTE_WRITE,
        Op::Read => access::REMOTE_READ,
    };
    let nak = Some((Status::AccessNak, Vec::new()));
    let Some(mr) = registry.by_rkey(req.rkey) else {
        return nak;
    };
    if mr.pd != pd
        || mr.access & needed == 0
        || qp_access & needed == 0
        || !mr.contains(req.remote_addr, u64::from(req.len))
    {
        return nak;
    }
    match req.op {
        Op::Write => {
            if !mr.write_from(req.remote_addr, payload) {
                return nak;
            }
            Some((Status::Ok, Vec::new()))
        }
        Op::Read => {
            let mut data = vec![0u8; req.len as usize];
            if !mr.read_into(req.remote_addr, &mut data) {
                return nak;
            }
            Some((Status::Ok, data))
        }
    }
}

/// Test hooks: hold the responder at a request for a given target QP, as a responder
/// thread the scheduler does not run, and release it or let it drop the connection (what
/// the initiator sees when the responder's process dies).
#[cfg(test)]
pub(crate) mod hooks {
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};

    use super::lock;

    /// The longest a held responder waits, should a test never release it.
    const HOLD_LIMIT: Duration = Duration::from_secs(60);

    #[derive(Default)]
    struct State {
        held: bool,
        sever: bool,
        arrived: usize,
    }

    struct Hold {
        qpn: u32,
        state: Mutex<State>,
        cond: Condvar,
    }

    static HOLDS: Mutex<Vec<Arc<Hold>>> = Mutex::new(Vec::new());

    /// What the responder does with a request after the hook.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Verdict {
        /// Execute it.
        Pass,
        /// Drop the connection without answering.
        Sever,
    }

    /// Called by the responder with each request before it runs it: blocks while a
    /// [`Stall`] holds the request's target QP.
    pub(crate) fn at_responder(dst_qpn: u32) -> Verdict {
        let hold = lock(&HOLDS).iter().find(|h| h.qpn == dst_qpn).cloned();
        let Some(hold) = hold else {
            return Verdict::Pass;
        };
        let limit = Instant::now() + HOLD_LIMIT;
        let mut s = lock(&hold.state);
        s.arrived += 1;
        hold.cond.notify_all();
        while s.held && !s.sever {
            let left = limit.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = hold
                .cond
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if s.sever {
            Verdict::Sever
        } else {
            Verdict::Pass
        }
    }

    /// Holds the responder at every request for one target QP until released; dropping
    /// it releases the responder.
    pub(crate) struct Stall(Arc<Hold>);

    impl Stall {
        /// Starts holding requests for target QP `qpn`.
        pub(crate) fn new(qpn: u32) -> Self {
            let hold = Arc::new(Hold {
                qpn,
                state: Mutex::new(State {
                    held: true,
                    ..State::default()
                }),
                cond: Condvar::new(),
            });
            lock(&HOLDS).push(hold.clone());
            Self(hold)
        }

        /// Waits until `n` requests in all have reached the hook; false after `bound`.
        pub(crate) fn wait_arrived(&self, n: usize, bound: Duration) -> bool {
            let limit = Instant::now() + bound;
            let mut s = lock(&self.0.state);
            while s.arrived < n {
                let left = limit.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                s = self
                    .0
                    .cond
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            true
        }

        /// Lets the held request, and every later one, run.
        pub(crate) fn release(&self) {
            lock(&self.0.state).held = false;
            self.0.cond.notify_all();
        }

        /// Makes the responder drop the connection of the held request (and of every later
        /// one for this QP) without answering.
        pub(crate) fn sever(&self) {
            lock(&self.0.state).sever = true;
            self.0.cond.notify_all();
        }

        /// Holds requests again: the next one for this QP waits at the hook.
        pub(crate) fn hold_again(&self) {
            let mut s = lock(&self.0.state);
            s.held = true;
            s.sever = false;
        }
    }

    impl Drop for Stall {
        fn drop(&mut self) {
            lock(&HOLDS).retain(|h| !Arc::ptr_eq(h, &self.0));
            self.release();
        }
    }
}
