//! Where shared mappings are placed in our address space, so that two mappings made in turn
//! never lie a multiple of [`ALIAS_SPAN`] apart.
//!
//! Unsafe contract: `mmap`/`munmap` only ever touch address ranges this module reserved
//! itself (an anonymous `PROT_NONE` reservation that no one else knows of), or ranges the
//! kernel picks; the mapped descriptor is borrowed from the caller and open for the call.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// Mappings are placed at addresses that differ in the bits below this span (256 MiB).
///
/// On the AMD EPYC cores of the machines Ferry is measured on, a copy whose source and
/// destination lie a multiple of 256 MiB apart runs at two thirds of the speed it has
/// otherwise: `memcpy` of 128 KiB–1 MiB blocks at 22–30 GB/s against 33–41 GB/s a few MiB
/// off (the L1's linear-address tags take the address bits below 2^28, so such lines keep
/// evicting each other). The kernel places big mappings next to each other, so two regions
/// of 256 MiB, or of 1 GiB, always were that far apart, and every block copied between
/// them at the same offset — tebench's stripes, a KV cache's pages — paid for it.
pub const ALIAS_SPAN: usize = 1 << 28;

/// The step between the placements mappings are given in turn (4 MiB: still 2 MiB-aligned,
/// so huge pages stay possible; 64 placements before the first comes round again).
const PLACEMENT_STEP: usize = 4 << 20;

/// The placement the next mapping gets, in `0..ALIAS_SPAN / PLACEMENT_STEP`.
static NEXT_PLACEMENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The offset in `[reserved, reserved + ALIAS_SPAN)` where a mapping of placement
/// `placement` starts: the first address whose remainder modulo [`ALIAS_SPAN`] is
/// `placement × PLACEMENT_STEP`.
fn placed_at(reserved: usize, placement: usize) -> usize {
    let want = (placement * PLACEMENT_STEP) % ALIAS_SPAN;
    (want + ALIAS_SPAN - reserved % ALIAS_SPAN) % ALIAS_SPAN
}

/// Maps `len` bytes of `fd` shared and read-write, at an address of the next placement
/// ([`ALIAS_SPAN`]): two mappings made in turn never lie a multiple of 256 MiB apart.
/// `extra_flags` are added to `MAP_SHARED` (`MAP_POPULATE`). Where the address space for
/// the placement cannot be reserved, the kernel places the mapping.
///
/// # Errors
/// The OS error of `mmap`.
pub fn map_shared(
    fd: BorrowedFd<'_>,
    len: usize,
    extra_flags: libc::c_int,
) -> io::Result<NonNull<u8>> {
    let placement = NEXT_PLACEMENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    map_shared_placed(fd, len, extra_flags, placement)
}

/// [`map_shared`] with the placement given.
fn map_shared_placed(
    fd: BorrowedFd<'_>,
    len: usize,
    extra_flags: libc::c_int,
    placement: usize,
) -> io::Result<NonNull<u8>> {
    // The reservation, when it could be made: its start and length.
    let reservation = len.checked_add(ALIAS_SPAN).and_then(|span| {
        // SAFETY: an anonymous, inaccessible, unreserved mapping at an address the kernel
        // picks: it replaces nothing and commits no memory; it only holds the address range.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some((p as usize, span))
    });
    // Inside the reservation at the placement, or wherever the kernel puts it.
    let (at, fixed) = match reservation {
        Some((start, _)) => (start + placed_at(start, placement), libc::MAP_FIXED),
        None => (0, 0),
    };
    // SAFETY: a shared mapping of a descriptor the caller holds open. With MAP_FIXED,
    // `[at, at + len)` lies inside the reservation just made (`placed_at` < ALIAS_SPAN, so
    // it ends before `start + span`), which this thread alone knows of: only that
    // reservation's pages are replaced. Without it, the kernel picks the address and
    // replaces nothing.
    let ptr = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | extra_flags | fixed,
            fd.as_raw_fd(),
            0,
        )
    };
    let failed = ptr == libc::MAP_FAILED;
    let error = io::Error::last_os_error();
    if let Some((start, span)) = reservation {
        // What is left of the reservation goes: all of it when the mapping failed,
        // otherwise what lies before and after the mapping.
        let unreserve = |from: usize, to: usize| {
            if to > from {
                // SAFETY: `[from, to)` is part of the reservation made above and holds no
                // mapping of anyone else's; unmapping it returns the address range.
                unsafe { libc::munmap(from as *mut libc::c_void, to - from) };
            }
        };
        if failed {
            unreserve(start, start + span);
        } else {
            unreserve(start, at);
            unreserve(at + len.next_multiple_of(page_size()), start + span);
        }
    }
    if failed {
        return Err(error);
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    #[test]
    fn a_placement_is_the_first_address_of_its_remainder() {
        for reserved in [
            0,
            4096,
            ALIAS_SPAN - 4096,
            ALIAS_SPAN,
            3 * ALIAS_SPAN + (5 << 20),
        ] {
            for placement in [0, 1, 63, 64, 65] {
                let head = placed_at(reserved, placement);
                assert!(head < ALIAS_SPAN);
                assert_eq!(
                    (reserved + head) % ALIAS_SPAN,
                    (placement * PLACEMENT_STEP) % ALIAS_SPAN,
                    "{reserved:#x} {placement}"
                );
            }
        }
    }

    #[test]
    fn mappings_made_in_turn_never_lie_a_multiple_of_the_alias_span_apart() {
        // Two regions of 256 MiB each: the kernel alone would put them exactly 256 MiB
        // apart. Nothing is touched beyond a page, so no memory is committed.
        let len = ALIAS_SPAN;
        let a = memfd_of(len);
        let b = memfd_of(len);
        // Placements given, not drawn: other tests map memory meanwhile.
        let pa = map_shared_placed(a.as_fd(), len, 0, 7).expect("map a");
        let pb = map_shared_placed(b.as_fd(), len, 0, 8).expect("map b");
        let distance = (pa.as_ptr() as usize).abs_diff(pb.as_ptr() as usize);
        assert_ne!(distance % ALIAS_SPAN, 0, "{pa:?} {pb:?}");
        assert_eq!(distance % PLACEMENT_STEP, 0);
        for p in [pa, pb] {
            // SAFETY: both mappings are `len` bytes long, readable and writable.
            unsafe {
                p.as_ptr().write(7);
                p.as_ptr().add(len - 1).write(9);
                assert_eq!((p.as_ptr().read(), p.as_ptr().add(len - 1).read()), (7, 9));
                libc::munmap(p.as_ptr().cast(), len);
            }
        }
    }

    fn memfd_of(len: usize) -> OwnedFd {
        // SAFETY: a NUL-terminated name; memfd_create has no other inputs.
        let raw = unsafe { libc::memfd_create(c"ferry-placement".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0, "memfd_create");
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: truncating our own memfd.
        let truncated = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
        assert_eq!(truncated, 0, "ftruncate");
        fd
    }
}
