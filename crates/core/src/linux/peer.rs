//! The process at the other end of a unix socket: its credentials ([`peer_pid`],
//! [`peer_uid`]) and a [`Pidfd`] that notices when it exits, even though its memory stays
//! mapped here.
//!
//! Unsafe contract: `getsockopt` writes into a `ucred` on our stack whose size it is told;
//! `pidfd_open` and `poll` touch no memory of ours beyond one `pollfd`; a fresh pidfd is
//! owned by the [`Pidfd`] alone, and a duplicate of it by the `AsyncFd` that watches it.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::invalid::invalid_input;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::test_support::{current_thread, memfd, pair, unique_name};
    use std::future::Future;
    use std::time::{Duration, Instant};

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
}
