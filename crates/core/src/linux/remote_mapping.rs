//! [`RemoteMapping`]: a peer's memfd mapped here, after checking that the file really is as
//! long as the peer claims, with bounds-checked copies in and out of it.
//!
//! Unsafe contract: a `RemoteMapping` owns its mapping from `map` to drop; every access goes
//! through raw copies of ranges checked against the mapped length, never through Rust
//! references, because the peer may write the memory at any time. The length is never
//! beyond the file's size when mapped; a peer that shrinks the file afterwards can only be
//! excluded by `F_SEAL_SHRINK` ([`RemoteMapping::is_shrink_sealed`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use super::invalid::invalid_input;
use super::placement::map_shared;

/// Largest peer mapping whose pages are populated when mapped (1 GiB).
pub const POPULATE_LIMIT: u64 = 1 << 30;

/// A bounds check that failed on a [`RemoteMapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range [{offset}, {offset}+{len}) outside a mapping of {size} bytes")]
pub struct RangeError {
    /// Requested start.
    pub offset: u64,
    /// Requested length.
    pub len: u64,
    /// Mapping length.
    pub size: u64,
}

impl From<RangeError> for crate::error::Error {
    fn from(e: RangeError) -> Self {
        Self::OutOfRange(e.to_string())
    }
}

/// A peer's memfd mapped shared, read-write, here. Unmapped and closed on drop.
///
/// The memory is shared with another process, which may change it at any time; reads and
/// writes go through raw copies, never through Rust references into the mapping.
#[derive(Debug)]
#[must_use]
pub struct RemoteMapping {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    shrink_sealed: bool,
}

// SAFETY: the mapping is plain shared memory owned by this value and valid until drop.
// Moving the address between threads is sound, and every access is a raw copy; concurrent
// access to the bytes is the contract of a transfer engine, as for `memory::Mapping`.
unsafe impl Send for RemoteMapping {}
// SAFETY: as above; `&RemoteMapping` allows only raw copies and exposes the address, length
// and fd.
unsafe impl Sync for RemoteMapping {}

impl RemoteMapping {
    /// Maps the first `len` bytes of `fd`, a memfd received from a peer.
    ///
    /// Checks first that `fd` is a regular file of at least `len` bytes, so a peer cannot
    /// make us map past the end of the file, where every access would raise SIGBUS. The
    /// check cannot stop a peer that shrinks the file later; memfds sealed with
    /// `F_SEAL_SHRINK` are immune to that, see [`RemoteMapping::is_shrink_sealed`].
    ///
    /// # Errors
    /// `InvalidInput` for `len == 0`, a file that is not regular, or a file shorter than
    /// `len`; otherwise the OS error of `fstat` or `mmap`. `fd` is closed on every error.
    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(invalid_input("cannot map 0 bytes"));
        }
        // SAFETY: all-zero is a valid `stat` (a C struct of integers).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is a writable stat buffer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(invalid_input("descriptor is not a regular file (memfd)"));
        }
        let file_len = u64::try_from(st.st_size).unwrap_or(0);
        if file_len < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("file is {file_len} bytes, cannot map {len}"),
            ));
        }
        // SAFETY: F_GET_SEALS only reads the descriptor's seals; files without sealing
        // support answer EINVAL, which counts as unsealed.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let shrink_sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
        // Populate the page tables now, once per mapping: otherwise every first touch of a
        // 4 KiB page during a transfer is a fault, which halves the throughput of the first
        // pass over a buffer. Not beyond POPULATE_LIMIT: populating a memfd allocates every
        // page of it (a 16 GiB region would cost 16 GiB of memory the moment a peer opens
        // it, and hold the process's memory map lock for a minute); larger regions stay
        // lazily touched.
        let populate = if len as u64 <= POPULATE_LIMIT {
            libc::MAP_POPULATE
        } else {
            0
        };
        // No longer than the file (checked above), at a placement of its own.
        let ptr = map_shared(fd.as_fd(), len, populate)?;
        Ok(Self {
            ptr,
            len,
            fd,
            shrink_sealed,
        })
    }

    /// Mapped length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: `map` refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapped memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether the file was sealed against shrinking when mapped, so that no access within
    /// [`RemoteMapping::len`] can fault.
    pub fn is_shrink_sealed(&self) -> bool {
        self.shrink_sealed
    }

    /// `offset` as an index if `[offset, offset + len)` lies inside the mapping.
    fn check(&self, offset: u64, len: u64) -> Result<usize, RangeError> {
        let size = self.len as u64;
        let err = RangeError { offset, len, size };
        match offset.checked_add(len) {
            Some(end) if end <= size => usize::try_from(offset).map_err(|_| err),
            _ => Err(err),
        }
    }

    /// The address of `[offset, offset + len)`, or `None` if that range leaves the mapping
    /// (an empty range at `offset == len()` is inside).
    pub fn range_ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let start = self.check(offset, len).ok()?;
        // `start <= self.len` was just checked, so this stays within the mapping or one
        // past its end.
        Some(self.ptr.as_ptr().wrapping_add(start))
    }

    /// Copies `src` into the mapping at `offset`.
    ///
    /// # Errors
    /// [`RangeError`] if the range leaves the mapping; nothing is copied then.
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> Result<(), RangeError> {
        let start = self.check(offset, src.len() as u64)?;
        // SAFETY: `[start, start + src.len())` lies inside the live mapping (checked), which
        // is writable; `copy` tolerates `src` overlapping it. Concurrent writers are the
        // engine's contract (see the `Sync` impl).
        unsafe {
            std::ptr::copy(src.as_ptr(), self.ptr.as_ptr().add(start), src.len());
        }
        Ok(())
    }

    /// Copies from the mapping at `offset` into `dst`.
    ///
    /// # Errors
    /// [`RangeError`] if the range leaves the mapping; `dst` is untouched then.
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<(), RangeError> {
        let start = self.check(offset, dst.len() as u64)?;
        // SAFETY: `[start, start + dst.len())` lies inside the live, readable mapping
        // (checked); `dst` is writable for its length; `copy` tolerates overlap.
        unsafe {
            std::ptr::copy(self.ptr.as_ptr().add(start), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }
}

impl Drop for RemoteMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and nothing borrowed from this
        // value can outlive it (raw pointers from `as_ptr`/`range_ptr` are the caller's to
        // stop using). The fd closes after this, as a field.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::test_support::{fds_named, maps_named, memfd, pair, unique_name};
    use crate::linux::{recv_fds, send_fds};
    use crate::memory::RegionTable;
    use std::os::fd::FromRawFd;

    #[test]
    fn fd_passing_maps_the_same_memory() {
        let table = RegionTable::default();
        let region = table.allocate(8192).expect("allocate");
        let memfd = region.mapping().expect("owned").dup_fd().expect("dup");
        let (a, b) = pair();

        send_fds(&a, b"region", &[memfd.as_fd()]).expect("send");
        let mut buf = [0u8; 64];
        let (n, mut fds) = recv_fds(&b, &mut buf, 4).expect("recv");
        assert_eq!(&buf[..n], b"region");
        assert_eq!(fds.len(), 1);
        let remote = RemoteMapping::map(fds.remove(0), 8192).expect("map");
        assert_eq!(remote.len(), 8192);
        assert!(!remote.is_empty());

        // Written through the remote mapping, read through the region's.
        remote.copy_in(100, b"hello").expect("copy_in");
        let p = region.range_ptr(100, 5).expect("range");
        // SAFETY: the range belongs to the region we hold; nobody writes it concurrently.
        assert_eq!(unsafe { std::slice::from_raw_parts(p, 5) }, b"hello");

        // And the other way.
        let p = region.range_ptr(8000, 3).expect("range");
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(b"abc".as_ptr(), p, 3) };
        let mut out = [0u8; 3];
        remote.copy_out(8000, &mut out).expect("copy_out");
        assert_eq!(&out, b"abc");
        let rp = remote.range_ptr(8000, 3).expect("remote range");
        // SAFETY: inside the remote mapping; nobody writes it concurrently.
        assert_eq!(unsafe { std::slice::from_raw_parts(rp, 3) }, b"abc");
    }

    #[test]
    fn remote_mapping_rejects_lengths_beyond_the_file() {
        let name = unique_name("short");
        let fd = memfd(&name, 4096);
        let dup = fd.try_clone().expect("dup");
        let err = RemoteMapping::map(dup, 4097).expect_err("longer than the file");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let dup = fd.try_clone().expect("dup");
        let err = RemoteMapping::map(dup, 0).expect_err("zero length");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        // The rejected descriptors were closed, and nothing was mapped.
        assert_eq!(fds_named(&name), 1);
        assert_eq!(maps_named(&name), 0);

        // Not a regular file.
        let (a, _b) = pair();
        let err = RemoteMapping::map(OwnedFd::from(a), 1).expect_err("a socket");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);

        // Shorter than the file is fine; an unsealed memfd reports so.
        let m = RemoteMapping::map(fd, 100).expect("map a prefix");
        assert_eq!(m.len(), 100);
        assert!(!m.is_shrink_sealed());
    }

    #[test]
    fn remote_mapping_sees_shrink_seals() {
        let cname = std::ffi::CString::new(unique_name("sealed")).expect("name");
        // SAFETY: `cname` is a valid C string.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is our open memfd; these calls take integers only.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), 4096), 0);
            assert_eq!(
                libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
                0
            );
        }
        let m = RemoteMapping::map(fd, 4096).expect("map");
        assert!(m.is_shrink_sealed());
    }

    #[test]
    fn copy_bounds_are_checked_without_overflow() {
        let m = RemoteMapping::map(memfd(&unique_name("bounds"), 4096), 4096).expect("map");
        let size = 4096u64;
        m.copy_in(4090, &[1; 6]).expect("last bytes");
        m.copy_in(4096, &[]).expect("empty at the end");
        m.copy_in(0, &[2; 4096]).expect("whole mapping");
        let mut out = [0u8; 6];
        m.copy_out(4090, &mut out).expect("last bytes");
        assert_eq!(out, [2; 6]);

        let cases: [(u64, usize); 5] = [
            (4090, 7),
            (4096, 1),
            (4097, 0),
            (u64::MAX, 1),
            (u64::MAX - 1, 4),
        ];
        for (offset, len) in cases {
            let want = RangeError {
                offset,
                len: len as u64,
                size,
            };
            assert_eq!(m.copy_in(offset, &vec![9; len]), Err(want));
            let mut dst = vec![5u8; len];
            assert_eq!(m.copy_out(offset, &mut dst), Err(want));
            assert!(dst.iter().all(|&b| b == 5), "dst touched on error");
            assert!(m.range_ptr(offset, len as u64).is_none());
        }
        assert!(m.range_ptr(1, u64::MAX).is_none());
        assert!(m.range_ptr(u64::MAX, u64::MAX).is_none());
        assert_eq!(m.range_ptr(0, size), Some(m.as_ptr()));
        assert_eq!(m.range_ptr(size, 0), Some(m.as_ptr().wrapping_add(4096)));
        // Nothing was written by the failed copies.
        let mut all = vec![0u8; 4096];
        m.copy_out(0, &mut all).expect("whole mapping");
        assert!(all.iter().all(|&b| b == 2));

        let err: crate::Error = RangeError {
            offset: 1,
            len: 2,
            size: 3,
        }
        .into();
        assert_eq!(err.code(), "ERR_FERRY_OUT_OF_RANGE");
    }

    #[test]
    fn drop_unmaps_and_closes() {
        let name = unique_name("drop");
        let (a, b) = pair();
        {
            let original = memfd(&name, 8192);
            send_fds(&a, b"m", &[original.as_fd()]).expect("send");
        }
        assert_eq!(fds_named(&name), 0, "only the socket holds the memfd now");
        let (_, mut fds) = recv_fds(&b, &mut [0u8; 1], 1).expect("recv");
        let m = RemoteMapping::map(fds.remove(0), 8192).expect("map");
        m.copy_in(0, b"x").expect("touch");
        assert_eq!(fds_named(&name), 1);
        assert!(maps_named(&name) >= 1);
        drop(m);
        assert_eq!(fds_named(&name), 0);
        assert_eq!(maps_named(&name), 0);
    }
}
