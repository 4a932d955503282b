//! Helpers the tests of the `linux` modules share: memfds with names no other test uses,
//! counts of the descriptors and mappings that name them, socketpairs that time out.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A memfd name no other test (or test run) uses.
pub(super) fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ferry-shm-test-{tag}-{}-{n}", std::process::id())
}

pub(super) fn memfd(name: &str, len: usize) -> OwnedFd {
    let cname = std::ffi::CString::new(name).expect("name");
    // SAFETY: `cname` is a valid C string.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `fd` is our open memfd.
    let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
    assert_eq!(rc, 0, "ftruncate: {}", io::Error::last_os_error());
    fd
}

/// Entries of /proc/self/fd that point at a memfd called `name`. Counting by name
/// rather than in total keeps the check exact while other tests open descriptors.
pub(super) fn fds_named(name: &str) -> usize {
    let needle = format!("/memfd:{name} ");
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with(&needle))
        .count()
}

/// Lines of /proc/self/maps that map a memfd called `name`.
pub(super) fn maps_named(name: &str) -> usize {
    let needle = format!("/memfd:{name} ");
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

pub(super) fn file_len(fd: BorrowedFd<'_>) -> i64 {
    // SAFETY: all-zero is a valid stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is writable.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_size
}

/// A socketpair whose reads time out, so a bug fails a test instead of hanging it.
pub(super) fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    for s in [&a, &b] {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
    }
    (a, b)
}

pub(super) fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
