//! A word in shared memory that says whether a process still runs, read without a syscall.
//!
//! The shm transport checks after every copy that its target still runs (a copy that ends
//! after the target exited must not complete). Asking the kernel (a `poll` of the pidfd)
//! costs a syscall per copy, a quarter of a 4 KiB copy's whole cost. Instead each process
//! that serves shm keeps one *life word* in a one-page memfd it hands to its peers: a
//! thread of its own holds it, as a robust futex (the kernel's robust-futex ABI,
//! Documentation/locking/robust-futex-ABI.rst), with its thread id as the word's value.
//! When that thread ends, however the process ends (SIGKILL included) and before the
//! process counts as exited, the kernel walks the thread's robust list and replaces the
//! word by `FUTEX_OWNER_DIED`. A peer reads the word through its own read-only mapping of
//! the page: a load, not a syscall.
//!
//! The holder thread's robust list is replaced by one naming only the life word; the
//! thread runs nothing else, so no robust mutex of the C library's is on that list.
//! Mapping someone's life word checks what the shm buffers check: a regular file, large
//! enough, sealed against shrinking (so a read can never fault).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::memory::Mapping;

/// The kernel's bit for "the owner died" in a robust futex word.
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The thread-id bits of a futex word.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;
/// Size of the memfd (one page; the word is at offset 0).
const PAGE: usize = 4096;

/// `struct robust_list` of the kernel ABI.
#[repr(C)]
struct RobustList {
    next: *mut RobustList,
}

/// `struct robust_list_head` of the kernel ABI.
#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *mut RobustList,
}

/// This process's life word, held by a thread of its own for as long as the process
/// runs. Made on first use; `Err` (kept) where it cannot be (no memfd, no robust futexes):
/// peers then ask the kernel instead.
fn process_word() -> &'static io::Result<Holder> {
    static WORD: OnceLock<io::Result<Holder>> = OnceLock::new();
    WORD.get_or_init(|| {
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        // Never sent and never dropped: the holder waits for as long as the process runs.
        std::mem::forget(stop);
        Holder::spawn(wait)
    })
}

/// A new descriptor of this process's life word, to hand to a same-host peer.
///
/// # Errors
/// Why this process has no life word (made once, on the first call), or the OS error of
/// `dup`.
pub(crate) fn share() -> io::Result<OwnedFd> {
    match process_word() {
        Ok(Holder {
            page: Some(page), ..
        }) => page.dup_fd().map_err(io::Error::other),
        Ok(_) => Err(io::Error::other("the life word was released")),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// A life word and the thread that holds it.
struct Holder {
    /// The memfd and our mapping of it (the kernel writes the death through it); `None`
    /// only inside `drop`.
    page: Option<Mapping>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Holder {
    /// Makes the memfd (one page, sealed against any change of size), maps it, and starts
    /// the thread that holds its word until `wait` yields (or its sender goes away).
    fn spawn(wait: std::sync::mpsc::Receiver<()>) -> io::Result<Self> {
        let page = Mapping::new_memfd(PAGE, "ferry-life").map_err(io::Error::other)?;
        // The address crosses to the holder thread as an integer (raw pointers are not
        // Send); the mapping outlives the thread (it is never unmapped while held).
        let word_addr = page.as_ptr() as usize;
        let (ready_tx, ready) = std::sync::mpsc::channel::<io::Result<()>>();
        let thread = std::thread::Builder::new()
            .name("ferry-life".into())
            .spawn(move || {
                let registered = hold(word_addr);
                let ok = registered.is_ok();
                let _ = ready_tx.send(registered);
                if ok {
                    let _ = wait.recv();
                }
            })?;
        let holder = Self {
            page: Some(page),
            thread: Some(thread),
        };
        match ready.recv() {
            Ok(Ok(())) => Ok(holder),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::other("life word holder ended before it started")),
        }
    }

    /// The word, as our mapping shows it.
    #[cfg(test)]
    fn word(&self) -> &AtomicU32 {
        let page = self.page.as_ref().expect("held");
        // SAFETY: the mapping is PAGE bytes, page aligned (so aligned for u32), and lives
        // as long as `self`; every access to the word is atomic (ours and the kernel's).
        unsafe { &*page.as_ptr().cast::<AtomicU32>() }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Only a holder whose thread ended may unmap: the kernel writes through this
        // mapping when the thread exits. Production holders are never dropped.
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                // The thread's end is unknown: keep the page mapped for good.
                std::mem::forget(self.page.take());
            }
        }
    }
}

/// Runs on the holder thread: puts our thread id in the word and registers a robust list
/// naming only it. The list's head and entry are leaked: the kernel reads them when the
/// thread exits, so they must outlive it.
fn hold(word_addr: usize) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let tid = u32::try_from(tid).map_err(|_| io::Error::other("gettid"))?;
    // SAFETY: `word_addr` is the start of a live PAGE-byte shared mapping (see `spawn`),
    // aligned for u32, accessed only atomically.
    let word = unsafe { &*(word_addr as *const AtomicU32) };
    word.store(tid & FUTEX_TID_MASK, Ordering::Release);
    let entry: &'static mut RobustList = Box::leak(Box::new(RobustList {
        next: std::ptr::null_mut(),
    }));
    let entry_addr = std::ptr::from_mut(entry) as usize;
    let futex_offset = libc::c_long::try_from(word_addr.wrapping_sub(entry_addr) as isize)
        .map_err(|_| io::Error::other("life word offset"))?;
    let head: &'static mut RobustListHead = Box::leak(Box::new(RobustListHead {
        list: RobustList {
            next: std::ptr::null_mut(),
        },
        futex_offset,
        list_op_pending: std::ptr::null_mut(),
    }));
    // The list is circular: head -> entry -> head.
    head.list.next = std::ptr::from_mut(entry);
    entry.next = std::ptr::from_mut(&mut head.list);
    // SAFETY: `head` points at a valid robust_list_head of the size passed, leaked so it
    // lives past this thread; its one entry lies `futex_offset` bytes before the word,
    // which stays mapped for as long as the thread runs. The call only records the
    // pointer for this thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_robust_list,
            std::ptr::from_mut(head),
            std::mem::size_of::<RobustListHead>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A peer's life word, mapped read-only.
pub(crate) struct PeerLifeWord {
    map: NonNull<u8>,
}

// SAFETY: the mapping is read-only, valid until Drop, and read only through atomics.
unsafe impl Send for PeerLifeWord {}
// SAFETY: as above.
unsafe impl Sync for PeerLifeWord {}

impl PeerLifeWord {
    /// Maps the life word a peer sent.
    ///
    /// # Errors
    /// `InvalidInput` when `fd` is not a regular file of at least a page sealed against
    /// shrinking (reading a truncated page would fault); otherwise the OS error of `fstat`,
    /// `fcntl` or `mmap`.
    pub(crate) fn map(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: all-zero is a valid `stat` (a C struct of integers).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is a writable stat buffer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let bad =
            |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("life word: {why}"));
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size < PAGE as libc::off_t {
            return Err(bad("not a one-page file"));
        }
        // SAFETY: F_GET_SEALS only reads the descriptor's seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("not sealed against shrinking"));
        }
        // SAFETY: a fresh read-only shared mapping of a page the file has (checked above)
        // and can never lose (sealed); the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Self { map })
    }

    /// Whether the holder thread (hence the peer's process) still runs: its thread id is
    /// in the word, not the kernel's death mark. One atomic load.
    pub(crate) fn is_alive(&self) -> bool {
        // SAFETY: the mapping is PAGE bytes, page aligned, lives as long as `self`, and is
        // written only atomically (by the holder, then by the kernel).
        let word = unsafe { &*self.map.as_ptr().cast::<AtomicU32>() };
        let w = word.load(Ordering::Acquire);
        w & FUTEX_OWNER_DIED == 0 && w & FUTEX_TID_MASK != 0
    }
}

impl Drop for PeerLifeWord {
    fn drop(&mut self) {
        // SAFETY: `map` is exactly the PAGE-byte mapping made in `map`; no reference into
        // it outlives `self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), PAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    #[test]
    fn the_word_reads_alive_while_its_thread_runs_and_dead_once_it_ends() {
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        let mut holder = Holder::spawn(wait).expect("holder");
        let peer = PeerLifeWord::map(holder.page.as_ref().expect("held").dup_fd().expect("dup"))
            .expect("map");
        assert!(peer.is_alive());
        assert_ne!(holder.word().load(Ordering::Acquire) & FUTEX_TID_MASK, 0);
        // The thread ends: the kernel marks the word on its way out (before join returns).
        stop.send(()).expect("stop");
        holder.thread.take().expect("thread").join().expect("join");
        assert!(
            !peer.is_alive(),
            "word {:#x}",
            holder.word().load(Ordering::Acquire)
        );
        assert_eq!(
            holder.word().load(Ordering::Acquire) & FUTEX_OWNER_DIED,
            FUTEX_OWNER_DIED
        );
    }

    #[test]
    fn the_process_word_is_shared_and_alive() {
        let peer = PeerLifeWord::map(share().expect("share")).expect("map");
        assert!(peer.is_alive());
        // The same word every time.
        let again = PeerLifeWord::map(share().expect("share")).expect("map");
        assert!(again.is_alive());
    }

    #[test]
    fn a_file_that_could_shrink_or_is_too_small_is_refused() {
        // SAFETY: valid name, no other inputs.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: our memfd.
        let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) };
        assert_eq!(sized, 0);
        let unsealed = PeerLifeWord::map(fd).err().expect("refused");
        assert_eq!(unsealed.kind(), io::ErrorKind::InvalidInput);
        // SAFETY: valid name, no other inputs.
        let raw = unsafe { libc::memfd_create(c"y".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: fresh descriptor, owned here.
        let empty = unsafe { OwnedFd::from_raw_fd(raw) };
        assert!(PeerLifeWord::map(empty).is_err());
    }
}
