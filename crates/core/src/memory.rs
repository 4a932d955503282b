//! Local memory: engine-owned regions (memfd-backed, page-aligned, shareable with same-host
//! peers) and user buffers registered with the engine, kept in a table by id.
//!
//! A region is reference counted: the table, each in-flight slice that touches it, and the
//! JS Buffer that views it each hold an `Arc<Region>`. The memory is unmapped only when the
//! last of them goes, so nothing ever points at freed memory.
//!
//! When the engine closes, an engine-owned region that something still holds (a JS Buffer
//! not yet collected) is detached: its memfd pages are replaced, at the same address, by
//! private anonymous zero pages and the memfd is closed. The descriptor and the shared pages
//! are released at close; the address range stays valid until the last holder goes.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::lanes::{Lent, LentTable};

/// Identifies a local region within one engine. Ids start at 0 and are never reused.
pub type RegionId = u64;

/// Largest region `allocate` accepts (1 TiB): a guard against nonsense sizes.
pub const MAX_REGION_BYTES: u64 = 1 << 40;

/// Who may touch a registered range from the other side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Access {
    /// Peers may read it only.
    ReadOnly,
    /// Peers may read and write it.
    ReadWrite,
}

/// A shared mapping backed by a memfd. Unmapped and closed on drop; `detach` closes the
/// memfd earlier and leaves private anonymous memory mapped in its place.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// `None` once detached.
    fd: Mutex<Option<OwnedFd>>,
}

// SAFETY: the mapping is plain memory owned by this value; sharing its address between
// threads is sound, and every access through it is raw-pointer based (see `Region`).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes only the address, length and fd.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a zero-filled memfd of `len` bytes and maps it shared, read-write.
    pub fn new_memfd(len: usize, name: &str) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("region length must be > 0".into()));
        }
        let cname = std::ffi::CString::new(name)
            .map_err(|_| Error::InvalidArgument("region name contains NUL".into()))?;
        // SAFETY: `cname` is a valid NUL-terminated string; memfd_create has no other inputs.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(Error::io("memfd_create", &std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("region length {len} too large")))?;
        // SAFETY: `fd` is a valid memfd owned by us.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(Error::io("ftruncate", &std::io::Error::last_os_error()));
        }
        // Seal the size: a peer that maps this region can then never be made to fault
        // (SIGBUS) by the file shrinking under its mapping.
        // SAFETY: F_ADD_SEALS on a memfd we own, created with MFD_ALLOW_SEALING.
        if unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        } != 0
        {
            return Err(Error::io("seal memfd", &std::io::Error::last_os_error()));
        }
        // The length it was truncated to, at a placement of its own (`ALIAS_SPAN`).
        let ptr = crate::linux::map_shared(fd.as_fd(), len, 0)
            .map_err(|e| Error::mapping("map region memory", len as u64, &e))?;
        Ok(Self {
            ptr,
            len,
            fd: Mutex::new(Some(fd)),
        })
    }

    /// The start of the mapping.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// A new descriptor of the memfd behind the mapping (for passing to same-host peers).
    /// Fails once the mapping is detached.
    pub fn dup_fd(&self) -> Result<OwnedFd> {
        let fd = self.fd.lock().unwrap_or_else(|p| p.into_inner());
        match &*fd {
            Some(fd) => fd.try_clone().map_err(|e| Error::io("dup memfd", &e)),
            None => Err(Error::Closed),
        }
    }

    /// Whether the memfd is still attached (not `detach`ed).
    pub fn is_attached(&self) -> bool {
        self.fd.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Replaces the shared memfd pages by private anonymous zero pages at the same address
    /// and closes the memfd, so that its descriptor and pages are released while the
    /// address range stays readable and writable. Returns whether it detached now (false
    /// when already detached).
    ///
    /// Call it once nothing of the engine touches the memory any more (transports and their
    /// threads stopped): bytes written into the old pages concurrently would be lost, bytes
    /// read would be zeros. It cannot make an access fault, whenever it runs.
    pub fn detach(&self) -> Result<bool> {
        let mut fd = self.fd.lock().unwrap_or_else(|p| p.into_inner());
        if fd.is_none() {
            return Ok(false);
        }
        // SAFETY: `[ptr, ptr + len)` is exactly the range this value mapped in `new_memfd`
        // and has not unmapped (that happens only in `Drop`, which no holder of `&self` can
        // race), so MAP_FIXED replaces only our own pages and no other mapping or
        // allocation. The replacement is atomic with respect to other threads: every page
        // of the range is mapped, readable and writable before, during and after the call,
        // so accesses through pointers into it (a JS Buffer, a late transfer) never fault;
        // they see either the old shared page or a private zero page. Memory contents
        // changing under a reader is the region's documented contract (see `Region`).
        let p = unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(
                "detach region memory",
                &std::io::Error::last_os_error(),
            ));
        }
        // MAP_FIXED either maps at the given address or fails.
        debug_assert_eq!(p.cast::<u8>(), self.ptr.as_ptr());
        // The mapping no longer refers to the memfd: closing it frees the shared pages once
        // no peer maps them either.
        drop(fd.take());
        Ok(true)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned (a detach maps the same range
        // again, at the same address), and no `Region` (hence no reference into the mapping)
        // outlives this value.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Keeps user memory alive while the engine uses it (e.g. a reference to a JS Buffer).
pub trait KeepAlive: Send + Sync {}
impl<T: Send + Sync> KeepAlive for T {}

enum Backing {
    Owned(Mapping),
    User(#[allow(dead_code)] Box<dyn KeepAlive>),
}

/// A registered range of local memory.
pub struct Region {
    id: RegionId,
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
    backing: Backing,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("access", &self.access)
            .field("owned", &matches!(self.backing, Backing::Owned(_)))
            .finish()
    }
}

// SAFETY: a region is an address range that stays valid while the `Region` lives (owned
// mapping or kept-alive user memory). Concurrent access to the bytes is the contract of a
// transfer engine, as with RDMA: the engine only touches ranges named by requests, and
// users must not race their own accesses against transfers of the same bytes.
unsafe impl Send for Region {}
// SAFETY: as above; shared references expose only the address and metadata.
unsafe impl Sync for Region {}

impl Region {
    /// Region id in its engine.
    pub fn id(&self) -> RegionId {
        self.id
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty (never true for a registered region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Remote access permission.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The memfd backing an engine-owned region.
    pub fn mapping(&self) -> Option<&Mapping> {
        match &self.backing {
            Backing::Owned(m) => Some(m),
            Backing::User(_) => None,
        }
    }

    /// Detaches an engine-owned region's memory from its memfd (see `Mapping::detach`);
    /// nothing to do for user memory. Returns whether it detached now.
    pub fn detach(&self) -> Result<bool> {
        match &self.backing {
            Backing::Owned(m) => m.detach(),
            Backing::User(_) => Ok(false),
        }
    }

    /// The address of `[offset, offset + len)`, checked to lie inside the region.
    pub fn range_ptr(&self, offset: u64, len: u64) -> Result<*mut u8> {
        check_range(offset, len, self.len as u64)?;
        // `offset < self.len` was just checked, so the add stays inside the allocation.
        Ok(self.ptr.as_ptr().wrapping_add(offset as usize))
    }
}

/// A checked range of a region, which it keeps alive: how the server and the network
/// transports read and write registered memory without raw pointers of their own.
///
/// Registered memory is shared by design: the user, peers and the NIC may write the same
/// bytes at once (a transfer's contract, as with RDMA, says which wins). The engine never
/// relies on the bytes staying put while it copies them, so such races cost consistency of
/// the data, never memory safety of the engine.
pub struct Window {
    region: Arc<Region>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `ptr` points into `region`'s mapping, which the window keeps alive; the window
// is used by one thread at a time (it moves, it is not shared).
unsafe impl Send for Window {}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("region", &self.region.id())
            .field("len", &self.len)
            .finish()
    }
}

impl Window {
    /// `[offset, offset + len)` of `region`, checked to lie inside it (`len` may be 0).
    pub fn new(region: &Arc<Region>, offset: u64, len: u64) -> Result<Self> {
        let size = region.len() as u64;
        match offset.checked_add(len) {
            Some(end) if end <= size => {}
            _ => {
                return Err(Error::OutOfRange(format!(
                    "[{offset}, {offset}+{len}) outside a buffer of {size} bytes"
                )))
            }
        }
        // Inside the region, so both fit in usize and the add stays in the allocation.
        let len = usize::try_from(len).map_err(|_| Error::OutOfRange("window too long".into()))?;
        let ptr =
            NonNull::new(region.ptr.as_ptr().wrapping_add(offset as usize)).unwrap_or(region.ptr);
        Ok(Self {
            region: region.clone(),
            ptr,
            len,
        })
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, to send.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `[ptr, ptr + len)` was checked to lie inside the region's mapping, which
        // `self.region` keeps mapped for the borrow's duration (see the type's note on
        // concurrent writers).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to receive into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`; `&mut self` keeps this window's own borrows apart.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Checks that `[offset, offset + len)` lies inside `[0, size)`, without overflow.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    if len == 0 {
        return Err(Error::InvalidArgument("length must be > 0".into()));
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange(format!(
            "[{offset}, {offset}+{len}) outside a buffer of {size} bytes"
        ))),
    }
}

/// The engine's table of local regions.
#[derive(Default)]
pub struct RegionTable {
    next_id: AtomicU64,
    /// By engine-made id, looked up on every request: a fast hash, lent per lane.
    regions: LentTable<RegionId, Region>,
    /// Every engine-owned region allocated here that may still be alive (released ones
    /// included: a Buffer may still view them), for `detach_owned`. Dead entries are pruned
    /// as it grows, so it stays within twice the live ones (and at least `PRUNE_MIN`).
    owned: Mutex<OwnedList>,
}

#[derive(Default)]
struct OwnedList {
    regions: Vec<Weak<Region>>,
    prune_at: usize,
}

const PRUNE_MIN: usize = 64;

impl OwnedList {
    fn push(&mut self, region: &Arc<Region>) {
        if self.regions.len() >= self.prune_at.max(PRUNE_MIN) {
            self.regions.retain(|w| w.strong_count() > 0);
            self.prune_at = self.regions.len() * 2;
        }
        self.regions.push(Arc::downgrade(region));
    }
}

impl RegionTable {
    /// Allocates a new engine-owned region of `len` bytes.
    pub fn allocate(&self, len: u64) -> Result<Arc<Region>> {
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(Error::InvalidArgument(format!(
                "allocate: length must be in 1..={MAX_REGION_BYTES}, got {len}"
            )));
        }
        let len_usize = usize::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("allocate: length {len} too large")))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mapping = Mapping::new_memfd(len_usize, &format!("ferry-region-{id}"))?;
        let region = Arc::new(Region {
            id,
            ptr: mapping.ptr,
            len: len_usize,
            access: Access::ReadWrite,
            backing: Backing::Owned(mapping),
        });
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(&region);
        self.insert(region.clone());
        Ok(region)
    }

    /// Registers user memory.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `keep_alive`
    /// lives, and `keep_alive` must keep it so.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        keep_alive: Box<dyn KeepAlive>,
    ) -> Result<Arc<Region>> {
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::InvalidArgument("cannot register a null buffer".into()))?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register an empty buffer".into(),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let region = Arc::new(Region {
            id,
            ptr,
            len,
            access,
            backing: Backing::User(keep_alive),
        });
        self.insert(region.clone());
        Ok(region)
    }

    fn insert(&self, region: Arc<Region>) {
        self.regions.insert(region.id, region);
    }

    /// Looks a region up by id.
    pub fn get(&self, id: RegionId) -> Result<Arc<Region>> {
        self.regions.get(&id).ok_or(Error::UnknownRegion(id))
    }

    /// Looks a region up by id, for a request: a reference that the calling thread's lane
    /// holds the count of (`lanes.rs`).
    pub fn lend(&self, id: RegionId) -> Result<Lent<Region>> {
        // let-else, not `ok_or`: no error made (and dropped) per request.
        let Some(region) = self.regions.lend(&id) else {
            return Err(Error::UnknownRegion(id));
        };
        Ok(region)
    }

    /// Runs `f` on the region `id`, taking no reference (`LentTable::with_loan`): `f` must
    /// not look regions up again. `None` if there is none.
    pub(crate) fn with_region<R>(&self, id: RegionId, f: impl FnOnce(&Region) -> R) -> Option<R> {
        self.regions.with_loan(&id, |r| f(r))
    }

    /// Removes a region from the table. In-flight users keep it alive until they finish.
    pub fn release(&self, id: RegionId) -> Result<()> {
        self.regions
            .remove(&id)
            .map(drop)
            .ok_or(Error::UnknownRegion(id))
    }

    /// A snapshot of all regions, by id.
    pub fn snapshot(&self) -> Vec<Arc<Region>> {
        let mut all = self.regions.values();
        all.sort_by_key(|r| r.id);
        all
    }

    /// How many regions are registered.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every region from the table.
    pub fn clear(&self) {
        self.regions.clear();
    }

    /// Detaches every engine-owned region still alive, in the table or not (see
    /// `Mapping::detach`): their memfds are closed now, whoever still holds them. For
    /// engine close, once no transport touches local memory. Returns how many it detached.
    pub fn detach_owned(&self) -> usize {
        let owned = std::mem::take(&mut *self.owned.lock().unwrap_or_else(|p| p.into_inner()));
        let mut detached = 0;
        for region in owned.regions.iter().filter_map(Weak::upgrade) {
            match region.detach() {
                Ok(true) => detached += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(region = region.id(), error = %e, "region memory not detached")
                }
            }
        }
        detached
    }

    /// Engine-owned regions tracked for `detach_owned` (tests).
    #[cfg(test)]
    fn owned_tracked(&self) -> usize {
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .regions
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_is_zeroed_page_aligned_and_releasable() {
        let table = RegionTable::default();
        let r = table.allocate(10_000).expect("allocate");
        assert_eq!(r.as_ptr() as usize % 4096, 0);
        assert_eq!(r.len(), 10_000);
        let p = r.range_ptr(0, 10_000).expect("range");
        // SAFETY: the whole range belongs to the region we hold.
        let bytes = unsafe { std::slice::from_raw_parts(p, 10_000) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert_eq!(table.get(r.id()).expect("get").id(), r.id());
        table.release(r.id()).expect("release");
        assert_eq!(
            table.get(r.id()).unwrap_err().code(),
            "ERR_FERRY_UNKNOWN_REGION"
        );
        assert!(table.release(r.id()).is_err());
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(check_range(9, 1, 10).is_ok());
        assert_eq!(
            check_range(0, 0, 10).unwrap_err().code(),
            "ERR_FERRY_INVALID_ARGUMENT"
        );
        assert_eq!(
            check_range(10, 1, 10).unwrap_err().code(),
            "ERR_FERRY_OUT_OF_RANGE"
        );
        assert_eq!(
            check_range(u64::MAX, 2, 10).unwrap_err().code(),
            "ERR_FERRY_OUT_OF_RANGE"
        );
        assert_eq!(
            check_range(1, u64::MAX, 10).unwrap_err().code(),
            "ERR_FERRY_OUT_OF_RANGE"
        );
    }

    fn read_all(r: &Region) -> Vec<u8> {
        let p = r.range_ptr(0, r.len() as u64).expect("range");
        // SAFETY: the range belongs to the region we hold, and nothing else writes it.
        unsafe { std::slice::from_raw_parts(p, r.len()) }.to_vec()
    }

    fn write_all(r: &Region, byte: u8) {
        let p = r.range_ptr(0, r.len() as u64).expect("range");
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(p, byte, r.len()) };
    }

    #[test]
    fn detach_keeps_the_address_valid_and_lets_the_memfd_go() {
        let table = RegionTable::default();
        let r = table.allocate(3 * 4096 + 100).expect("allocate");
        let addr = r.as_ptr();
        write_all(&r, 0xab);
        // A second descriptor of the same memfd, to see what happens to its pages.
        let peer_fd = r.mapping().expect("owned").dup_fd().expect("dup");
        assert!(r.mapping().expect("owned").is_attached());

        assert!(r.detach().expect("detach"));
        assert!(!r.mapping().expect("owned").is_attached());
        assert_eq!(r.as_ptr(), addr, "same address");
        // The region now reads zeros and takes writes, at the same address.
        assert!(read_all(&r).iter().all(|&b| b == 0));
        write_all(&r, 0x11);
        assert!(read_all(&r).iter().all(|&b| b == 0x11));
        // The memfd no longer backs it: its pages still hold what was written before.
        let other = crate::linux::RemoteMapping::map(peer_fd, r.len()).expect("map");
        // SAFETY: the mapping is `r.len()` bytes long and nothing writes it.
        let seen = unsafe { std::slice::from_raw_parts(other.as_ptr(), r.len()) };
        assert!(seen.iter().all(|&b| b == 0xab));
        // Detached once: no descriptor to hand out, nothing more to do.
        assert_eq!(
            r.mapping().expect("owned").dup_fd().unwrap_err().code(),
            "ERR_FERRY_CLOSED"
        );
        assert!(!r.detach().expect("again"));
    }

    #[test]
    fn detach_owned_reaches_released_regions_that_are_still_held() {
        let table = RegionTable::default();
        let kept = table.allocate(4096).expect("kept");
        let released = table.allocate(4096).expect("released");
        table.release(released.id()).expect("release");
        let dropped = table.allocate(4096).expect("dropped");
        table.release(dropped.id()).expect("release");
        drop(dropped);
        assert_eq!(table.detach_owned(), 2);
        assert!(!kept.mapping().expect("owned").is_attached());
        assert!(!released.mapping().expect("owned").is_attached());
        assert_eq!(table.detach_owned(), 0, "the list was taken");
    }

    #[test]
    fn the_owned_list_is_pruned_as_regions_go() {
        let table = RegionTable::default();
        let live: Vec<_> = (0..10)
            .map(|_| table.allocate(4096).expect("allocate"))
            .collect();
        for _ in 0..1000 {
            let r = table.allocate(4096).expect("allocate");
            table.release(r.id()).expect("release");
        }
        assert!(
            table.owned_tracked() <= PRUNE_MIN.max(2 * live.len()) + 1,
            "{} tracked",
            table.owned_tracked()
        );
        assert_eq!(table.detach_owned(), live.len());
    }

    #[test]
    fn bad_sizes_are_rejected() {
        let table = RegionTable::default();
        assert!(table.allocate(0).is_err());
        assert!(table.allocate(MAX_REGION_BYTES + 1).is_err());
    }
}
