//! Linux primitives for same-host memory (the shared-memory transport and regions):
//!
//! - [`send_fds`] / [`recv_fds`] (and the tokio forms [`send_fds_async`] /
//!   [`recv_fds_async`]) pass descriptors over a unix stream socket with `SCM_RIGHTS`;
//! - [`peer_pid`] names the process at the other end of such a socket;
//! - [`Pidfd`] watches that process, so a dead target is noticed even though its memory
//!   stays mapped here;
//! - [`RemoteMapping`] maps a peer's memfd after checking that the file really is as long as
//!   the peer claims, and copies in and out of it with bounds checks.
//!
//! Thread safety: every type here is `Send + Sync`; the functions take shared references.
//! Resources: received descriptors are `OwnedFd`s from the moment they arrive, so none is
//! leaked on any error path; a `Pidfd` closes its descriptor and a `RemoteMapping` unmaps
//! and closes on drop.
#![cfg(target_os = "linux")]

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Largest peer mapping whose pages are populated when mapped (1 GiB).
pub const POPULATE_LIMIT: u64 = 1 << 30;

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

/// Most descriptors one message may carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// `SCM_PIDFD` (Linux 6.5, `include/linux/socket.h`, the same on every architecture); libc
/// does not export it. It only arrives if someone set `SO_PASSPIDFD` on the socket, but it
/// installs a descriptor in our table, so [`recv_fds`] must close it too.
const SCM_PIDFD: libc::c_int = 0x04;

/// Control buffers are `u64` arrays; this proves that is aligned enough for `cmsghdr`.
const _: () = assert!(std::mem::align_of::<libc::cmsghdr>() <= std::mem::align_of::<u64>());

fn invalid_input(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Bytes of control buffer needed for `n` descriptors (`n <= MAX_FDS_PER_MESSAGE`).
fn cmsg_space(n: usize) -> io::Result<usize> {
    let data =
        u32::try_from(n * size_of::<RawFd>()).map_err(|_| invalid_input("too many descriptors"))?;
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(data) };
    usize::try_from(space).map_err(|_| invalid_input("too many descriptors"))
}

/// One `sendmsg` call (retried on EINTR): the bytes of `payload` that fit, with `fds`
/// attached to the first of them. Returns how many payload bytes went out.
fn sendmsg_once(sock: BorrowedFd<'_>, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if payload.is_empty() {
        // A stream socket carries ancillary data only together with data, and an empty
        // message would be indistinguishable from EOF on the other side.
        return Err(invalid_input("payload must not be empty"));
    }
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(invalid_input("more than 253 descriptors in one message"));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let space = if raw.is_empty() {
        0
    } else {
        cmsg_space(raw.len())?
    };
    let mut control = vec![0u64; space.div_ceil(size_of::<u64>())];

    let mut iov = libc::iovec {
        iov_base: payload.as_ptr().cast_mut().cast(),
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is a C struct of integers and raw pointers, for which all-zero (null
    // pointers, zero lengths) is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if space > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points at a control buffer of `space` bytes, aligned for cmsghdr (see
        // the assertion above); CMSG_FIRSTHDR only reads those two fields.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        if cmsg.is_null() {
            return Err(io::Error::other("control buffer too small for a cmsghdr"));
        }
        let data_len = raw.len() * size_of::<RawFd>();
        // SAFETY: `cmsg` is the first header inside `control`, which has CMSG_SPACE(data_len)
        // bytes: room for the header and `data_len` bytes of data after CMSG_DATA. The copy
        // is bytewise, so the data's alignment does not matter, and `raw` does not overlap
        // `control`.
        unsafe {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                data_len,
            );
        }
    }
    loop {
        // SAFETY: `msg` points at `iov` (which points at `payload`) and at `control`, all
        // alive for the call; the kernel only reads them. MSG_NOSIGNAL turns a closed peer
        // into EPIPE rather than SIGPIPE.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n.unsigned_abs());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One `recvmsg` call (retried on EINTR) that accepts at most `max_fds` descriptors.
fn recvmsg_once(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    if buf.is_empty() {
        // A zero-byte read would look like EOF.
        return Err(invalid_input("receive buffer must not be empty"));
    }
    // Beyond SCM_MAX_FD the kernel never sends more, so a larger buffer would be waste.
    let room = max_fds.min(MAX_FDS_PER_MESSAGE);
    let space = if room == 0 { 0 } else { cmsg_space(room)? };
    let mut control = vec![0u64; space.div_ceil(size_of::<u64>())];

    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in `sendmsg_once`, all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if space > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
    }
    let n = loop {
        // SAFETY: `msg` points at `iov` (which points at `buf`, writable for its length) and
        // at `control`, writable for `space` bytes; both outlive the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n.unsigned_abs();
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            // A failed recvmsg installs no descriptors.
            return Err(err);
        }
    };

    // Take ownership of every descriptor that arrived before judging the message, so each
    // early return below closes them.
    let mut fds = Vec::new();
    let header_len = {
        // SAFETY: CMSG_LEN is pure arithmetic on its argument.
        let len = unsafe { libc::CMSG_LEN(0) };
        len as usize
    };
    if space > 0 {
        // SAFETY: the kernel set `msg_controllen` to the bytes it wrote into `control`;
        // CMSG_FIRSTHDR/CMSG_NXTHDR stay within that and return null at its end.
        let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !cmsg.is_null() {
            // SAFETY: `cmsg` is a non-null header inside `control` (aligned, see above).
            let (level, kind, len) = unsafe {
                (
                    (*cmsg).cmsg_level,
                    (*cmsg).cmsg_type,
                    (*cmsg).cmsg_len as usize,
                )
            };
            if level == libc::SOL_SOCKET && (kind == libc::SCM_RIGHTS || kind == SCM_PIDFD) {
                let count = len.saturating_sub(header_len) / size_of::<RawFd>();
                // SAFETY: the kernel wrote `count` descriptors after CMSG_DATA(cmsg), within
                // `cmsg_len`, which lies inside `control`.
                let data = unsafe { libc::CMSG_DATA(cmsg) };
                for i in 0..count {
                    // SAFETY: `i < count`, so the read is in bounds; it is unaligned-safe.
                    let raw = unsafe {
                        std::ptr::read_unaligned(data.add(i * size_of::<RawFd>()).cast::<RawFd>())
                    };
                    // SAFETY: the kernel just installed `raw` in our table for us; nothing
                    // else knows of it, so this is its only owner.
                    fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
            // SAFETY: `msg` and `cmsg` are as above; CMSG_NXTHDR returns null past the end.
            cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > max_fds {
        let arrived = fds.len();
        drop(fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "peer sent more descriptors than the {max_fds} allowed; closed the {arrived} \
                 that arrived (the message's {n} bytes were consumed)"
            ),
        ));
    }
    Ok((n, fds))
}

/// Sends all of `payload` over a blocking unix stream socket, with `fds` attached to its
/// first byte (`SCM_RIGHTS`). The descriptors stay open here; the peer gets duplicates.
///
/// # Errors
/// `InvalidInput` for an empty payload or more than [`MAX_FDS_PER_MESSAGE`] descriptors;
/// otherwise the OS error of `sendmsg` (`EPIPE` when the peer has gone, never `SIGPIPE`).
/// After an error part of the payload may have been sent: treat the connection as broken.
/// On a non-blocking socket `WouldBlock` can arrive mid-message; use [`send_fds_async`].
pub fn send_fds(sock: &UnixStream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut sent = sendmsg_once(sock.as_fd(), payload, fds)?;
    while sent < payload.len() {
        match sendmsg_once(sock.as_fd(), &payload[sent..], &[])? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => sent += n,
        }
    }
    Ok(())
}

/// Receives bytes into `buf` with at most `max_fds` descriptors (close-on-exec) from a
/// unix stream socket. Returns the byte count (0 at EOF) and the descriptors.
///
/// Stream semantics apply: the bytes may be only part of what the peer sent, and the
/// descriptors arrive with the read that returns the first byte they were sent with.
///
/// # Errors
/// `InvalidInput` for an empty `buf`. `InvalidData` if the peer sent more than `max_fds`
/// descriptors (or the kernel truncated the control data): every descriptor that did
/// arrive has been closed, but the bytes were consumed, so treat the connection as broken.
/// Otherwise the OS error of `recvmsg` (`WouldBlock` on a non-blocking socket).
pub fn recv_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    recvmsg_once(sock.as_fd(), buf, max_fds)
}

/// [`send_fds`] for a tokio socket: waits for writability instead of blocking.
///
/// Not cancel safe: dropping the future after the first bytes went out leaves a partial
/// message on the connection, which must then be closed.
///
/// # Errors
/// As [`send_fds`].
pub async fn send_fds_async(
    sock: &tokio::net::UnixStream,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut sent = sock
        .async_io(Interest::WRITABLE, || {
            sendmsg_once(sock.as_fd(), payload, fds)
        })
        .await?;
    while sent < payload.len() {
        let rest = &payload[sent..];
        match sock
            .async_io(Interest::WRITABLE, || sendmsg_once(sock.as_fd(), rest, &[]))
            .await?
        {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => sent += n,
        }
    }
    Ok(())
}

/// [`recv_fds`] for a tokio socket: waits for readability instead of blocking.
///
/// Cancel safe: bytes and descriptors are taken off the socket only by the `recvmsg` whose
/// result this future returns.
///
/// # Errors
/// As [`recv_fds`].
pub async fn recv_fds_async(
    sock: &tokio::net::UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    sock.async_io(Interest::READABLE, || {
        recvmsg_once(sock.as_fd(), buf, max_fds)
    })
    .await
}

/// The pid of the process at the other end of a unix socket (`SO_PEERCRED`), as seen in our
/// pid namespace. For a connected socket that is the process that called `connect` (or
/// `listen`); for a socketpair, the one that created it.
///
/// # Errors
/// The OS error of `getsockopt` (e.g. `ENOTCONN`, or `ENOPROTOOPT` for a non-unix socket);
/// `NotFound` if the peer's pid is not visible in our pid namespace.
pub fn peer_pid(sock: &impl AsFd) -> io::Result<u32> {
    let cred = peer_cred(sock)?;
    match u32::try_from(cred.pid) {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(io::Error::new(
            io::ErrorKind::NotFound,
            "peer's pid is not visible in this pid namespace",
        )),
    }
}

/// The uid of the process at the other end of a unix socket (`SO_PEERCRED`).
///
/// # Errors
/// As [`peer_pid`], without the pid namespace case.
pub fn peer_uid(sock: &impl AsFd) -> io::Result<u32> {
    Ok(peer_cred(sock)?.uid)
}

fn peer_cred(sock: &impl AsFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` holds its size; the kernel writes at most
    // `len` bytes and stores the written length back into `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::other("SO_PEERCRED returned a short ucred"));
    }
    Ok(cred)
}

/// A process file descriptor (`pidfd_open`): a handle on one process that, unlike a pid,
/// cannot come to name another process after this one dies. Readable once it has exited.
/// Closed on drop.
#[derive(Debug)]
#[must_use]
pub struct Pidfd {
    fd: OwnedFd,
    pid: u32,
}

impl Pidfd {
    /// Opens a pidfd for process `pid` (as seen in our pid namespace).
    ///
    /// A pid from [`peer_pid`] may already belong to another process if the peer died in
    /// between; the control connection's EOF is the second signal that covers that.
    ///
    /// # Errors
    /// `InvalidInput` for pid 0 or one beyond `pid_t`; otherwise the OS error of
    /// `pidfd_open`: `ESRCH` if no such process, `ENOSYS` before Linux 5.3.
    pub fn open(pid: u32) -> io::Result<Self> {
        let raw_pid = libc::pid_t::try_from(pid)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| invalid_input("pid must be in 1..=i32::MAX"))?;
        // SAFETY: pidfd_open takes a pid and flags (0) and returns a new descriptor or -1;
        // it touches no memory of ours.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = RawFd::try_from(ret).map_err(|_| io::Error::other("pidfd_open: bad fd"))?;
        // SAFETY: `raw` is a fresh descriptor (close-on-exec, as pidfds always are) that
        // nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd, pid })
    }

    /// The pid this handle was opened for.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still running (it has not exited, reaped or not).
    ///
    /// Never blocks. An unexpected `poll` failure counts as exited: a transport must not
    /// keep writing into a peer it cannot vouch for.
    pub fn is_alive(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: `pfd` is one valid pollfd for our open descriptor; timeout 0 never
            // blocks.
            let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
            match rc {
                0 => return true,
                n if n > 0 => return false,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                _ => return false,
            }
        }
    }

    /// Resolves when the process exits (at once if it already has).
    ///
    /// Must be polled inside a tokio runtime with IO enabled (tokio itself panics if the
    /// runtime was built without IO). Cancel safe: dropping the future deregisters the
    /// descriptor it watched (a duplicate, so several waiters may run at once).
    ///
    /// # Errors
    /// `Other` outside a tokio runtime; the OS error if the descriptor cannot be duplicated
    /// or registered with the reactor.
    pub async fn exited(&self) -> io::Result<()> {
        if !self.is_alive() {
            return Ok(());
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "Pidfd::exited must run inside a tokio runtime",
            ));
        }
        // A duplicate, because one descriptor can be registered with the reactor only once
        // and other waiters may be watching this process too.
        let dup = self.fd.try_clone()?;
        // SAFETY: `dup` is an OwnedFd moved into the AsyncFd, which owns it until it drops:
        // the descriptor stays open and names the same pidfd for the AsyncFd's lifetime.
        let watched = unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }?;
        loop {
            let mut guard = watched.readable().await?;
            if !self.is_alive() {
                return Ok(());
            }
            guard.clear_ready();
        }
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

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
    use crate::memory::RegionTable;
    use std::future::Future;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    /// A memfd name no other test (or test run) uses.
    fn unique_name(tag: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("ferry-shm-test-{tag}-{}-{n}", std::process::id())
    }

    fn memfd(name: &str, len: usize) -> OwnedFd {
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
    fn fds_named(name: &str) -> usize {
        let needle = format!("/memfd:{name} ");
        std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with(&needle))
            .count()
    }

    /// Lines of /proc/self/maps that map a memfd called `name`.
    fn maps_named(name: &str) -> usize {
        let needle = format!("/memfd:{name} ");
        std::fs::read_to_string("/proc/self/maps")
            .expect("/proc/self/maps")
            .lines()
            .filter(|l| l.contains(&needle))
            .count()
    }

    fn file_len(fd: BorrowedFd<'_>) -> i64 {
        // SAFETY: all-zero is a valid stat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `st` is writable.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_size
    }

    /// A socketpair whose reads time out, so a bug fails a test instead of hanging it.
    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
        }
        (a, b)
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

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
    fn three_fds_in_one_message_arrive_in_order_and_cloexec() {
        let name = unique_name("three");
        let sent: Vec<OwnedFd> = (1..=3).map(|i| memfd(&name, i * 4096)).collect();
        let borrowed: Vec<BorrowedFd<'_>> = sent.iter().map(AsFd::as_fd).collect();
        let (a, b) = pair();
        send_fds(&a, &[7u8; 10], &borrowed).expect("send");

        let mut buf = [0u8; 10];
        let (n, fds) = recv_fds(&b, &mut buf, 8).expect("recv");
        assert_eq!(n, 10);
        assert_eq!(fds.len(), 3);
        assert_eq!(fds_named(&name), 6);
        for (i, fd) in fds.iter().enumerate() {
            assert_eq!(file_len(fd.as_fd()), (i as i64 + 1) * 4096);
            // SAFETY: F_GETFD only reads the descriptor's flags.
            let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
            assert!(flags & libc::FD_CLOEXEC != 0, "received fd {i} not CLOEXEC");
        }
        drop(fds);
        assert_eq!(fds_named(&name), 3);
    }

    #[test]
    fn too_many_fds_is_an_error_and_leaks_nothing() {
        // (sent, allowed): (2, 1) fits the control buffer's padding, so only the count check
        // catches it; the others are truncated by the kernel (MSG_CTRUNC).
        for (count, max_fds) in [(3, 1), (3, 0), (2, 1), (3, 2)] {
            let name = unique_name("toomany");
            let sent: Vec<OwnedFd> = (0..count).map(|_| memfd(&name, 4096)).collect();
            let borrowed: Vec<BorrowedFd<'_>> = sent.iter().map(AsFd::as_fd).collect();
            let before = fds_named(&name);
            assert_eq!(before, count);

            let (a, b) = pair();
            send_fds(&a, b"x", &borrowed).expect("send");
            let mut buf = [0u8; 8];
            let err = recv_fds(&b, &mut buf, max_fds).expect_err("too many fds");
            assert_eq!(
                err.kind(),
                io::ErrorKind::InvalidData,
                "{count}/{max_fds}: {err}"
            );
            assert_eq!(fds_named(&name), before, "{count}/{max_fds} leaked");
            drop(sent);
            assert_eq!(fds_named(&name), 0);
        }
    }

    #[test]
    fn bad_send_and_recv_arguments_are_rejected() {
        let (a, b) = pair();
        let kind = |r: io::Result<()>| r.expect_err("must fail").kind();
        assert_eq!(kind(send_fds(&a, b"", &[])), io::ErrorKind::InvalidInput);
        let many = vec![a.as_fd(); MAX_FDS_PER_MESSAGE + 1];
        assert_eq!(kind(send_fds(&a, b"x", &many)), io::ErrorKind::InvalidInput);
        let err = recv_fds(&b, &mut [], 1).expect_err("empty buf");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);

        // The most the kernel allows goes through (the same descriptor 253 times).
        let most = vec![a.as_fd(); MAX_FDS_PER_MESSAGE];
        send_fds(&a, b"y", &most).expect("253 fds");
        let (n, fds) = recv_fds(&b, &mut [0u8; 4], MAX_FDS_PER_MESSAGE).expect("recv");
        assert_eq!((n, fds.len()), (1, MAX_FDS_PER_MESSAGE));
        // They are duplicates of `a`: close them, or `a` never reaches EOF below.
        drop(fds);

        // A plain message carries no descriptors; EOF reads as 0 bytes.
        send_fds(&a, b"plain", &[]).expect("send");
        let (n, fds) = recv_fds(&b, &mut [0u8; 8], 4).expect("recv");
        assert_eq!((n, fds.len()), (5, 0));
        drop(a);
        let (n, fds) = recv_fds(&b, &mut [0u8; 8], 4).expect("eof");
        assert_eq!((n, fds.len()), (0, 0));
    }

    #[test]
    fn async_fd_passing_survives_partial_writes() {
        let name = unique_name("async");
        let fd = memfd(&name, 4096);
        // Far more than a socket buffer, so the send is split and the fd rides on the first
        // chunk only.
        let payload: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        current_thread().block_on(async {
            let (a, b) = tokio::net::UnixStream::pair().expect("socketpair");
            let fds = [fd.as_fd()];
            let send = send_fds_async(&a, &payload, &fds);
            let recv = async {
                let mut got = Vec::new();
                let mut fds = Vec::new();
                let mut buf = vec![0u8; 64 << 10];
                while got.len() < payload.len() {
                    let (n, mut more) = recv_fds_async(&b, &mut buf, 1).await.expect("recv");
                    assert!(n > 0, "early EOF");
                    got.extend_from_slice(&buf[..n]);
                    fds.append(&mut more);
                }
                (got, fds)
            };
            let (sent, (got, fds)) = tokio::join!(send, recv);
            sent.expect("send");
            assert!(got == payload, "payload corrupted");
            assert_eq!(fds.len(), 1);
            assert_eq!(fds_named(&name), 2);
        });
        assert_eq!(fds_named(&name), 1);
    }

    #[test]
    fn peer_pid_is_our_pid_on_a_socketpair() {
        let (a, b) = pair();
        assert_eq!(peer_pid(&a).expect("peer_pid"), std::process::id());
        assert_eq!(peer_pid(&b).expect("peer_pid"), std::process::id());
        let pidfd = Pidfd::open(peer_pid(&a).expect("peer_pid")).expect("pidfd of self");
        assert_eq!(pidfd.pid(), std::process::id());
        assert!(pidfd.is_alive());
        // Not a socket at all.
        let file = memfd(&unique_name("notsock"), 1);
        assert!(peer_pid(&file).is_err());
    }

    #[test]
    fn pidfd_open_rejects_bad_pids() {
        assert_eq!(
            Pidfd::open(0).expect_err("pid 0").kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            Pidfd::open(u32::MAX).expect_err("pid beyond pid_t").kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn pidfd_sees_a_child_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        let pidfd = Pidfd::open(child.id()).expect("pidfd");
        assert!(pidfd.is_alive());
        // Exit is visible before the child is reaped.
        let deadline = Instant::now() + Duration::from_secs(5);
        while pidfd.is_alive() {
            assert!(Instant::now() < deadline, "child still alive after 5 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().expect("reap");
        assert!(!pidfd.is_alive());
    }

    #[test]
    fn pidfd_exited_resolves_when_the_child_exits() {
        let rt = current_thread();
        // A running child: exited() stays pending, then resolves once it is killed.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pidfd = Pidfd::open(child.id()).expect("pidfd");
        rt.block_on(async {
            let early = tokio::time::timeout(Duration::from_millis(100), pidfd.exited()).await;
            assert!(early.is_err(), "exited() resolved for a live child");
            child.kill().expect("kill");
            tokio::time::timeout(Duration::from_secs(5), pidfd.exited())
                .await
                .expect("exited() within 5 s")
                .expect("exited()");
        });
        child.wait().expect("reap");

        // A child that exits on its own, with two waiters at once.
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        let pidfd = Pidfd::open(child.id()).expect("pidfd");
        rt.block_on(async {
            let both = async { tokio::join!(pidfd.exited(), pidfd.exited()) };
            let (x, y) = tokio::time::timeout(Duration::from_secs(5), both)
                .await
                .expect("exited() within 5 s");
            x.expect("first waiter");
            y.expect("second waiter");
        });
        assert!(!pidfd.is_alive());
        child.wait().expect("reap");
        // Already exited: resolves at once, even outside a runtime.
        let mut fut = std::pin::pin!(pidfd.exited());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(matches!(
            fut.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Ok(()))
        ));
    }

    #[test]
    fn pidfd_exited_outside_a_runtime_is_an_error() {
        let pidfd = Pidfd::open(std::process::id()).expect("pidfd of self");
        let mut fut = std::pin::pin!(pidfd.exited());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::Other),
            other => panic!("expected an error, got {other:?}"),
        }
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
