//! One data connection watched by a JS thread's event loop (`event_loop` finds and makes
//! them): the loop's thread writes each request frame itself and, when the loop finds the
//! socket ready, reads the replies into registered memory itself. Reply headers are
//! decoded by `reply::decode`, the decoder the pool's connections use too; this side only
//! gathers the bytes as they arrive. Another thread may break the connection
//! (`break_with`): it fails what is in flight and shuts the socket down.
//!
//! A sealed connection (its handshake derived keys: `encrypt`) seals each request frame as
//! one record, and reads replies through the record reader every sealed stream uses
//! (`sealed_stream::SealedRead`, over the non-blocking socket): only plaintext of records
//! that verified reaches the reply decoder, and a tampered record breaks the connection
//! with `ERR_FERRY_TAMPERED`.

use std::cell::Cell;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::reply::{self, Reply};
use super::request::Slice;
use super::sealed_frames::tamper_notice;
use crate::error::{Error, Result};
use crate::event_loop::watch::{Interest, Watcher};
use crate::integrity::Running;
use crate::lazy_now::LazyNow;
use crate::memory::Window;
use crate::seal::{SealKeys, Sealer};
use crate::sealed_stream::SealedRead;
use crate::segment::Peer;
use crate::wire::{RejectCode, HEADER_LEN};

/// Bytes read from the socket at once.
const RX_BUFFER: usize = 128 << 10;

thread_local! {
    /// Bytes a write of this thread may hand the socket at once (test hook).
    static WRITE_CAP: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Test hook: this thread's loop connections hand the socket at most `cap` bytes per
/// write, and one piece per readiness when flushing, as a socket whose buffer is full
/// would; `None` lifts it. What a write leaves is then sent when the loop finds the
/// socket writable.
pub fn cap_writes_for_tests(cap: Option<usize>) {
    WRITE_CAP.with(|c| c.set(cap.unwrap_or(usize::MAX)));
}

/// Whether a connection takes a request now.
pub(super) enum Readiness {
    Ready,
    /// The rest of a write is waiting for the socket.
    Busy,
    Broken,
}

/// A READ reply's payload or an error text, arriving.
enum Body {
    Read {
        slice: Slice,
        dst: Window,
        got: usize,
        /// The source's CRC32C, when the reply carried one (`verify`).
        checksum: Option<u32>,
        /// The CRC32C of what arrived so far, taken as it is copied in (`verify`).
        landed: Running,
    },
    Error {
        slice: Slice,
        text: Vec<u8>,
        want: usize,
        code: RejectCode,
    },
}

struct State {
    open: bool,
    /// The peer incarnation the connection reached (its handshake's engine id).
    remote_engine: u64,
    next_id: u64,
    inflight: FxHashMap<u64, Slice>,
    /// The rest of frames the socket did not take whole; nothing else is sent meanwhile.
    out: Vec<u8>,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    body: Option<Body>,
    /// A sealed connection's keys: the sealer of its requests, and the record reader its
    /// replies come through.
    sealer: Option<Sealer>,
    sealed_rx: Option<SealedRead<SockRead>>,
}

/// The socket as the reader under a sealed connection's record reader. It is read only
/// when the loop found it readable, and on the loop's thread: "would block" is `Pending`,
/// and the loop, not a waker, comes back when more arrives.
struct SockRead(Arc<std::net::TcpStream>);

impl tokio::io::AsyncRead for SockRead {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            match (&*self.0).read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Reads verified plaintext from `sealed` into `buf`: what a plain socket read gives
/// (0 at the end of the stream, `WouldBlock` when nothing more is there now).
fn read_sealed(sealed: &mut SealedRead<SockRead>, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = tokio::io::ReadBuf::new(buf);
    match tokio::io::AsyncRead::poll_read(Pin::new(sealed), &mut cx, &mut out) {
        Poll::Ready(Ok(())) => Ok(out.filled().len()),
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
    }
}

/// (engine, peer): a thread's loop connections are keyed by both.
pub(super) type Key = (u64, u64);

/// What a connection calls on its loop's thread once it stops being watched (it broke):
/// the thread's table of connections forgets it. Passed in, not imported, so that the
/// table (`event_loop`, which holds connections) stays above the connection.
pub(super) type OnStop = fn(&LoopConn);

/// One loop connection.
pub(super) struct LoopConn {
    key: Key,
    on_stop: OnStop,
    peer: Arc<Peer>,
    sock: Arc<std::net::TcpStream>,
    state: Mutex<State>,
}

/// Tasks to settle once the connection's lock is released (settling may submit again).
#[derive(Default)]
pub(super) struct Settle {
    done: SmallVec<[Slice; 4]>,
    failed: SmallVec<[(Slice, Error); 1]>,
}

impl Settle {
    pub(super) fn settle(self) {
        for s in self.done {
            s.task.slice_done(s.attempt, s.len);
        }
        for (s, e) in self.failed {
            s.task.attempt_failed(s.attempt, e);
        }
    }
}

pub(super) struct Sent {
    pub(super) interest: Interest,
    pub(super) settle: Settle,
}

impl LoopConn {
    pub(super) fn new(
        key: Key,
        on_stop: OnStop,
        peer: Arc<Peer>,
        sock: std::net::TcpStream,
        keys: Option<SealKeys>,
    ) -> Self {
        let sock = Arc::new(sock);
        let (sealer, opener) = keys.map(SealKeys::split).unzip();
        let sealed_rx = opener.map(|o| SealedRead::new(SockRead(sock.clone()), Some(o)));
        Self {
            key,
            on_stop,
            peer,
            sock,
            state: Mutex::new(State {
                open: true,
                remote_engine: 0,
                next_id: 0,
                inflight: FxHashMap::default(),
                out: Vec::new(),
                rx: vec![0u8; RX_BUFFER].into_boxed_slice(),
                rx_start: 0,
                rx_end: 0,
                body: None,
                sealer,
                sealed_rx,
            }),
        }
    }

    /// Records the peer incarnation the connection's handshake reached: only slices
    /// planned against it go on this connection.
    pub(super) fn set_remote_engine(&self, engine_id: u64) {
        self.lock().remote_engine = engine_id;
    }

    /// The (engine, peer) this thread's table keeps it under.
    pub(super) fn key(&self) -> Key {
        self.key
    }

    pub(super) fn peer_handle(&self) -> u64 {
        self.peer.handle()
    }

    /// The socket, for the loop to watch (it stays open as long as `self`).
    pub(super) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn readiness(&self) -> Readiness {
        let st = self.lock();
        match (st.open, st.out.is_empty()) {
            (false, _) => Readiness::Broken,
            (true, false) => Readiness::Busy,
            (true, true) => Readiness::Ready,
        }
    }

    /// Fails everything in flight with `error` and shuts the socket down (from any
    /// thread); the loop then sees the end of the stream and lets go of it.
    pub(super) fn break_with(&self, error: Error) {
        let settle = {
            let mut st = self.lock();
            Self::close(&mut st, &error)
        };
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        settle.settle();
    }

    /// Marks the connection closed and takes every slice in flight, to fail with `error`.
    fn close(st: &mut State, error: &Error) -> Settle {
        st.open = false;
        st.out.clear();
        let mut settle = Settle::default();
        if let Some(body) = st.body.take() {
            let slice = match body {
                Body::Read { slice, .. } | Body::Error { slice, .. } => slice,
            };
            settle.failed.push((slice, error.clone()));
        }
        settle
            .failed
            .extend(st.inflight.drain().map(|(_, s)| (s, error.clone())));
        settle
    }

    fn error_for_break(&self, cause: Error) -> Error {
        if self.peer.is_lost() {
            self.peer.lost_error()
        } else {
            cause
        }
    }

    /// Registers `slice` and writes its frame (on the loop's thread). Hands the slice back
    /// when the connection cannot take it now.
    pub(super) fn send(&self, mut slice: Slice) -> std::result::Result<Sent, Slice> {
        let mut st = self.lock();
        if !st.open || !st.out.is_empty() {
            return Err(slice);
        }
        // Written now, on nothing else's heels: its deadline runs from here.
        slice.going_out(&LazyNow::new());
        let mut settle = Settle::default();
        let payload = match slice
            .check_incarnation(st.remote_engine)
            .and_then(|()| slice.payload())
        {
            Ok(w) => w,
            Err(e) => {
                settle.failed.push((slice, e));
                return Ok(Sent {
                    interest: Interest::Read,
                    settle,
                });
            }
        };
        st.next_id = st.next_id.wrapping_add(1);
        let id = st.next_id;
        let checksum = slice.checksum(&payload);
        let header = slice.header(id, checksum);
        st.inflight.insert(id, slice);
        let body = payload.as_slice();
        if st.sealer.is_some() {
            // One record per frame, sealed whole; what the socket does not take now waits
            // in `out`, as a plaintext frame's rest does.
            let interest = match Self::write_sealed(&self.sock, &mut st, &header, body) {
                Ok(()) if st.out.is_empty() => Interest::Read,
                Ok(()) => Interest::ReadWrite,
                Err(e) => {
                    let error = self.error_for_break(e);
                    settle = Self::close(&mut st, &error);
                    drop(st);
                    let _ = self.sock.shutdown(std::net::Shutdown::Both);
                    Interest::Read
                }
            };
            return Ok(Sent { interest, settle });
        }
        let head_len = header.len();
        let total = head_len + body.len();
        let cap = WRITE_CAP.with(Cell::get);
        let (head_part, body_part) = (
            &header[..head_len.min(cap)],
            &body[..body.len().min(cap.saturating_sub(head_len))],
        );
        let written = match (&*self.sock)
            .write_vectored(&[IoSlice::new(head_part), IoSlice::new(body_part)])
        {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                let error = self.error_for_break(Error::io("send", &e));
                settle = Self::close(&mut st, &error);
                drop(st);
                let _ = self.sock.shutdown(std::net::Shutdown::Both);
                return Ok(Sent {
                    interest: Interest::Read,
                    settle,
                });
            }
        };
        let interest = if written < total {
            // The socket took part of it: the rest is kept, and goes out before anything
            // else, when the loop finds the socket writable.
            let (head, tail) = (written.min(head_len), written.saturating_sub(head_len));
            st.out.extend_from_slice(&header[head..]);
            st.out.extend_from_slice(&body[tail..]);
            Interest::ReadWrite
        } else {
            Interest::Read
        };
        Ok(Sent { interest, settle })
    }

    /// Seals a frame into `out` (empty: nothing else is sent meanwhile) as one record and
    /// writes what the socket takes.
    fn write_sealed(
        sock: &std::net::TcpStream,
        st: &mut State,
        header: &[u8],
        body: &[u8],
    ) -> Result<()> {
        let State { sealer, out, .. } = st;
        if let Some(sealer) = sealer.as_mut() {
            sealer.seal_into(&[header, body], out)?;
        }
        Self::write_out(sock, st)
    }

    /// Writes what `out` holds; `Err` when the connection broke.
    fn flush(&self, st: &mut State) -> Result<()> {
        Self::write_out(&self.sock, st)
    }

    fn write_out(sock: &std::net::TcpStream, st: &mut State) -> Result<()> {
        let cap = WRITE_CAP.with(Cell::get);
        while !st.out.is_empty() {
            let take = st.out.len().min(cap);
            match (&*sock).write(&st.out[..take]) {
                Ok(0) => return Err(Error::Io("send: socket took nothing".into())),
                Ok(n) => {
                    st.out.drain(..n);
                    if cap != usize::MAX {
                        // A capped socket (test hook) takes one piece per readiness.
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Error::io("send", &e)),
            }
        }
        Ok(())
    }

    /// Reads what the socket holds and settles what it completes; `Err` when the connection
    /// broke (the stream ended, or the peer broke the protocol).
    fn receive(&self, st: &mut State, settle: &mut Settle) -> Result<()> {
        loop {
            self.parse(st, settle)?;
            if st.rx_start == st.rx_end {
                st.rx_start = 0;
                st.rx_end = 0;
            } else if st.rx_end == st.rx.len() {
                let (start, end) = (st.rx_start, st.rx_end);
                st.rx.copy_within(start..end, 0);
                st.rx_end = end - start;
                st.rx_start = 0;
            }
            let end = st.rx_end;
            let got = match st.sealed_rx.as_mut() {
                Some(sealed) => read_sealed(sealed, &mut st.rx[end..]),
                None => (&*self.sock).read(&mut st.rx[end..]),
            };
            match got {
                Ok(0) => return Err(Error::Io("connection closed by peer".into())),
                Ok(n) => st.rx_end += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("read", &e)),
            }
        }
    }

    /// Consumes the whole frames (and frame bodies) the buffer holds.
    fn parse(&self, st: &mut State, settle: &mut Settle) -> Result<()> {
        loop {
            let avail = st.rx_end - st.rx_start;
            if let Some(body) = st.body.as_mut() {
                let src = &st.rx[st.rx_start..st.rx_end];
                let (complete, took) = match body {
                    Body::Read {
                        slice,
                        dst,
                        got,
                        landed,
                        ..
                    } => {
                        let dst = dst.as_mut_slice();
                        let take = avail.min(dst.len() - *got);
                        dst[*got..*got + take].copy_from_slice(&src[..take]);
                        if slice.verify() {
                            landed.update(&src[..take]);
                        }
                        *got += take;
                        (*got == dst.len(), take)
                    }
                    Body::Error { text, want, .. } => {
                        let take = avail.min(*want - text.len());
                        text.extend_from_slice(&src[..take]);
                        (text.len() == *want, take)
                    }
                };
                st.rx_start += took;
                if !complete {
                    return Ok(());
                }
                match st.body.take() {
                    Some(Body::Read {
                        slice,
                        checksum,
                        landed,
                        ..
                    }) => match reply::check_read(slice.verify(), checksum, &landed) {
                        Ok(()) => settle.done.push(slice),
                        Err(e) => settle.failed.push((slice, e)),
                    },
                    Some(Body::Error {
                        slice, text, code, ..
                    }) => settle.failed.push((slice, reply::refusal(code, &text))),
                    None => {}
                }
                continue;
            }
            if avail < HEADER_LEN {
                return Ok(());
            }
            if st.sealed_rx.is_some() {
                let mut head = [0u8; HEADER_LEN];
                head.copy_from_slice(&st.rx[st.rx_start..st.rx_start + HEADER_LEN]);
                if let Some(tampered) = tamper_notice(&head) {
                    return Err(tampered);
                }
            }
            let State {
                rx,
                rx_start,
                inflight,
                remote_engine,
                ..
            } = &mut *st;
            let header = &rx[*rx_start..*rx_start + HEADER_LEN];
            let decoded = reply::decode(header, |id| inflight.remove(&id), Slice::asked);
            if decoded.is_ok() {
                self.peer.heard_from(|| *remote_engine);
            }
            st.rx_start += HEADER_LEN;
            match decoded {
                Ok((slice, Reply::Written { checked })) => {
                    match reply::check_written(slice.verify(), checked) {
                        Ok(()) => settle.done.push(slice),
                        Err(e) => settle.failed.push((slice, e)),
                    }
                }
                Ok((slice, Reply::Read { checksum, .. })) => match slice.destination() {
                    Ok(dst) => {
                        st.body = Some(Body::Read {
                            slice,
                            dst,
                            got: 0,
                            checksum,
                            landed: Running::new(),
                        })
                    }
                    Err(e) => {
                        settle.failed.push((slice, e.clone()));
                        return Err(e);
                    }
                },
                Ok((slice, Reply::Refused { code, text_len })) => {
                    st.body = Some(Body::Error {
                        slice,
                        text: Vec::with_capacity(text_len),
                        want: text_len,
                        code,
                    });
                }
                Err(broken) => {
                    let error = Error::from(broken.violation);
                    if let Some(slice) = broken.request {
                        settle.failed.push((slice, error.clone()));
                    }
                    return Err(error);
                }
            }
        }
    }
}

impl Watcher for LoopConn {
    fn on_ready(&self) -> Interest {
        let mut settle = Settle::default();
        let interest = {
            let mut st = self.lock();
            if !st.open {
                Interest::Stop
            } else {
                match self
                    .flush(&mut st)
                    .and_then(|()| self.receive(&mut st, &mut settle))
                {
                    Ok(()) if st.out.is_empty() => Interest::Read,
                    Ok(()) => Interest::ReadWrite,
                    Err(cause) => {
                        if matches!(cause, Error::Protocol(_) | Error::Tampered(_)) {
                            tracing::warn!(peer = self.peer.name(), error = %cause, "dropping loop connection");
                        }
                        let error = self.error_for_break(cause);
                        let failed = Self::close(&mut st, &error);
                        settle.failed.extend(failed.failed);
                        Interest::Stop
                    }
                }
            }
        };
        if interest == Interest::Stop {
            (self.on_stop)(self);
        }
        settle.settle();
        interest
    }
}

#[cfg(test)]
mod tests {
    //! Replies a peer should never send, put straight into a connection's receive buffer:
    //! each breaks the connection with a protocol error, fails what it answered, and
    //! writes no byte of the region the request would have landed in.
    use super::*;
    use crate::kind::Opcode;
    use crate::memory::RegionTable;
    use crate::task::tests::waiting_task;
    use crate::wire::{Header, Op, MAX_ERROR_PAYLOAD};

    const LEN: u64 = 4096;
    /// What the region holds before any reply: a byte no test reply carries.
    const UNTOUCHED: u8 = 0x5a;

    struct Rig {
        conn: LoopConn,
        region: Arc<crate::memory::Region>,
        /// The other end of the connection's socket, kept open.
        _far: std::net::TcpStream,
    }

    fn rig() -> Rig {
        rig_keyed(None)
    }

    fn rig_keyed(keys: Option<crate::seal::SealKeys>) -> Rig {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let near =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (far, _) = listener.accept().expect("accept");
        let peer = Arc::new(Peer::new(
            1,
            "127.0.0.1:1".into(),
            crate::segment::tests::sample_descriptor(),
            Default::default(),
        ));
        let region = RegionTable::default().allocate(2 * LEN).expect("region");
        region
            .range_ptr(0, 2 * LEN)
            .map(|p| {
                // SAFETY: the range was bounds-checked by `range_ptr`; nothing else uses the
                // region yet.
                unsafe { std::ptr::write_bytes(p, UNTOUCHED, 2 * LEN as usize) }
            })
            .expect("range");
        Rig {
            conn: LoopConn::new((1, 1), |_| {}, peer, near, keys),
            region,
            _far: far,
        }
    }

    impl Rig {
        /// A request of `opcode` in flight as id `id`, landing at offset LEN of the region.
        fn in_flight(&self, id: u64, opcode: Opcode) {
            let (task, _) = waiting_task();
            let slice = Slice {
                landing: crate::fence::Landing::new(&task),
                task,
                attempt: 0,
                opcode,
                region: crate::lanes::Lent::new(self.region.clone()),
                local_offset: LEN,
                buffer: 0,
                remote_offset: 0,
                len: LEN,
                token: [0; 16],
                engine_id: 0,
                starts_share: true,
                payload_crc: None,
            };
            self.conn.lock().inflight.insert(id, slice);
        }

        /// Parses `bytes` as if the socket had just delivered them.
        fn deliver(&self, bytes: &[u8]) -> (Result<()>, Settle) {
            let mut st = self.conn.lock();
            let end = st.rx_end;
            st.rx[end..end + bytes.len()].copy_from_slice(bytes);
            st.rx_end += bytes.len();
            let mut settle = Settle::default();
            let result = self.conn.parse(&mut st, &mut settle);
            if let Err(cause) = &result {
                // What `on_ready` does next: the connection closes, failing what it still
                // had in flight.
                let closed = LoopConn::close(&mut st, &self.conn.error_for_break(cause.clone()));
                settle.failed.extend(closed.failed);
            }
            assert!(st.inflight.is_empty() || result.is_ok());
            (result, settle)
        }

        /// The region's bytes.
        fn bytes(&self) -> &[u8] {
            let p = self.region.range_ptr(0, 2 * LEN).expect("range");
            // SAFETY: in bounds (`range_ptr`); the region lives as long as `self`; only
            // `deliver` writes it, and the tests read it after a delivery, never during one.
            unsafe { std::slice::from_raw_parts(p, 2 * LEN as usize) }
        }

        fn region_untouched(&self) -> bool {
            self.bytes().iter().all(|&b| b == UNTOUCHED)
        }

        /// Delivers `bytes` and checks that they broke the connection: a protocol error,
        /// the one request in flight failed, none completed, the region untouched.
        fn assert_breaks(&self, bytes: &[u8], what: &str) {
            let (result, settle) = self.deliver(bytes);
            assert!(
                matches!(result, Err(Error::Protocol(_))),
                "{what}: {result:?}"
            );
            assert_eq!(settle.failed.len(), 1, "{what}");
            assert!(settle.done.is_empty(), "{what}");
            assert!(self.region_untouched(), "{what}");
        }
    }

    fn reply(op: Op, request_id: u64, length: u64) -> Vec<u8> {
        let h = Header {
            op,
            flags: 0,
            request_id,
            buffer_id: 0,
            offset: 0,
            length,
            token: [0; 16],
        };
        h.encode().to_vec()
    }

    #[test]
    fn a_read_reply_of_the_wrong_length_fails_its_request_and_lands_nothing() {
        for length in [LEN - 1, LEN + 1, 0, u64::MAX] {
            let rig = rig();
            rig.in_flight(7, Opcode::Read);
            let mut bytes = reply(Op::ReadResp, 7, length);
            bytes.extend(std::iter::repeat_n(0xee, 2 * LEN as usize));
            rig.assert_breaks(&bytes, &format!("length {length}"));
        }
    }

    #[test]
    fn a_reply_of_the_wrong_kind_or_to_no_request_breaks_the_connection() {
        // A READ's bytes answering a WRITE, a WRITE's ack answering a READ, an ack with
        // a payload, and a request sent back as if it were a reply.
        for (op, asked, length) in [
            (Op::ReadResp, Opcode::Write, LEN),
            (Op::WriteAck, Opcode::Read, 0),
            (Op::WriteAck, Opcode::Write, 1),
            (Op::WriteReq, Opcode::Write, 0),
            (Op::Error, Opcode::Read, MAX_ERROR_PAYLOAD + 1),
        ] {
            let rig = rig();
            rig.in_flight(3, asked);
            let mut bytes = reply(op, 3, length);
            bytes.extend(std::iter::repeat_n(0xee, LEN as usize));
            rig.assert_breaks(&bytes, &format!("{op:?} to {asked:?}"));
        }
        // A reply to an id never sent: what is in flight fails with the connection.
        let rig = rig();
        rig.in_flight(3, Opcode::Read);
        rig.assert_breaks(&reply(Op::ReadResp, 4, LEN), "a reply to an id never sent");
    }

    #[test]
    fn a_header_that_is_not_ours_breaks_the_connection() {
        let rig = rig();
        rig.in_flight(0, Opcode::Read);
        let mut bytes = reply(Op::ReadResp, 0, LEN);
        bytes[0] ^= 0xff; // the magic
        rig.assert_breaks(&bytes, "a header without the magic");
    }

    #[test]
    fn well_formed_replies_complete_and_land_in_place() {
        // The same rig answered properly: the READ's bytes land at its offset only, and an
        // error reply fails its request without breaking the connection.
        let rig = rig();
        rig.in_flight(1, Opcode::Read);
        rig.in_flight(2, Opcode::Write);
        let mut bytes = reply(Op::ReadResp, 1, LEN);
        bytes.extend(std::iter::repeat_n(0xee, LEN as usize));
        bytes.extend(reply(Op::Error, 2, 5));
        bytes.extend(b"nope!");
        let (result, settle) = rig.deliver(&bytes);
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(settle.done.len(), 1);
        assert_eq!(settle.failed.len(), 1);
        assert!(matches!(&settle.failed[0].1, Error::RemoteRejected(m) if m.ends_with("nope!")));
        let bytes = rig.bytes();
        assert!(bytes[..LEN as usize].iter().all(|&b| b == UNTOUCHED));
        assert!(bytes[LEN as usize..].iter().all(|&b| b == 0xee));
    }

    /// A sealed connection (its end's keys) and the target's end of the keys, which seals
    /// what the test sends as replies.
    fn sealed_rig() -> (Rig, crate::seal::Sealer) {
        use crate::seal::{SealKeys, Side};
        let extracted = crate::auth::Secret::new(vec![9u8; 32])
            .expect("secret")
            .extract_key(b"a loop connection's handshake");
        let near = SealKeys::derive(&extracted, Side::Client).expect("keys");
        let (far, _) = SealKeys::derive(&extracted, Side::Server)
            .expect("keys")
            .split();
        let rig = rig_keyed(Some(near));
        rig.conn.sock.set_nonblocking(true).expect("nonblocking");
        (rig, far)
    }

    impl Rig {
        /// Sends `frame` from the target's end as one sealed record, its byte `flip`
        /// flipped on the way; reads until the connection settles something or breaks
        /// (10 s at most).
        fn receive_sealed(
            &mut self,
            far: &mut crate::seal::Sealer,
            frame: &[u8],
            flip: Option<usize>,
        ) -> (Result<()>, Settle) {
            let mut record = Vec::new();
            far.seal_into(&[frame], &mut record).expect("seal");
            if let Some(at) = flip {
                record[at] ^= 0x01;
            }
            (&self._far).write_all(&record).expect("send");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let mut settle = Settle::default();
                let mut st = self.conn.lock();
                let result = self.conn.receive(&mut st, &mut settle);
                if result.is_err() || !settle.done.is_empty() || !settle.failed.is_empty() {
                    if let Err(cause) = &result {
                        let closed = LoopConn::close(&mut st, cause);
                        settle.failed.extend(closed.failed);
                    }
                    return (result, settle);
                }
                drop(st);
                assert!(std::time::Instant::now() < deadline, "nothing settled");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn a_sealed_reply_lands_once_its_record_verified() {
        let (mut rig, mut far) = sealed_rig();
        rig.in_flight(1, Opcode::Read);
        let mut frame = reply(Op::ReadResp, 1, LEN);
        frame.extend(std::iter::repeat_n(0xee, LEN as usize));
        let (result, settle) = rig.receive_sealed(&mut far, &frame, None);
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(settle.done.len(), 1);
        assert!(rig.bytes()[LEN as usize..].iter().all(|&b| b == 0xee));
    }

    #[test]
    fn a_tampered_sealed_reply_breaks_the_connection_as_tampered_and_lands_nothing() {
        // A byte of the payload, of the header, and of the tag.
        let len = HEADER_LEN + LEN as usize;
        for flip in [4 + HEADER_LEN + 100, 4 + 3, 4 + len + 5] {
            let (mut rig, mut far) = sealed_rig();
            rig.in_flight(1, Opcode::Read);
            let mut frame = reply(Op::ReadResp, 1, LEN);
            frame.extend(std::iter::repeat_n(0xee, LEN as usize));
            let (result, settle) = rig.receive_sealed(&mut far, &frame, Some(flip));
            assert!(
                matches!(result, Err(Error::Tampered(_))),
                "{flip}: {result:?}"
            );
            assert!(settle.done.is_empty());
            assert_eq!(settle.failed.len(), 1);
            assert_eq!(settle.failed[0].1.code(), "ERR_FERRY_TAMPERED");
            assert!(rig.region_untouched(), "{flip}: bytes landed");
        }
    }

    #[test]
    fn the_targets_tamper_notice_fails_what_is_in_flight_as_tampered() {
        let (mut rig, mut far) = sealed_rig();
        rig.in_flight(1, Opcode::Write);
        let notice = crate::sealed_stream::tamper_notice().encode();
        let (result, settle) = rig.receive_sealed(&mut far, &notice, None);
        assert!(matches!(result, Err(Error::Tampered(_))), "{result:?}");
        assert_eq!(settle.failed.len(), 1);
        assert_eq!(settle.failed[0].1.code(), "ERR_FERRY_TAMPERED");
    }
}
