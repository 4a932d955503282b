//! Descriptors passed over a unix stream socket with `SCM_RIGHTS`: [`send_fds`] /
//! [`recv_fds`] and the tokio forms [`send_fds_async`] / [`recv_fds_async`].
//!
//! Unsafe contract: the `msghdr` handed to `sendmsg`/`recvmsg` points only at buffers that
//! live on this stack frame for the call (the payload, and a `u64` control buffer sized by
//! `CMSG_SPACE` and aligned for `cmsghdr`); the `CMSG_*` walks stay inside the control
//! length the kernel reports. Every descriptor the kernel installs becomes an `OwnedFd` at
//! once, so none leaks on any error path.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use tokio::io::Interest;

use super::invalid::invalid_input;

/// Most descriptors one message may carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// `SCM_PIDFD` (Linux 6.5, `include/linux/socket.h`, the same on every architecture); libc
/// does not export it. It only arrives if someone set `SO_PASSPIDFD` on the socket, but it
/// installs a descriptor in our table, so [`recv_fds`] must close it too.
const SCM_PIDFD: libc::c_int = 0x04;

/// Control buffers are `u64` arrays; this proves that is aligned enough for `cmsghdr`.
const _: () = assert!(std::mem::align_of::<libc::cmsghdr>() <= std::mem::align_of::<u64>());

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::test_support::{
        current_thread, fds_named, file_len, memfd, pair, unique_name,
    };

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
}
