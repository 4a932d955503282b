//! Data connections watched by the submitting thread's event loop (`event_loop`): one per
//! peer and thread, for small requests of the Promise path from a JS thread.
//!
//! On a connection of the pool (`tcp.rs`) a reply wakes an I/O thread, which reads it and
//! then wakes the JS thread: two sleeps and wake-ups on this side of a round trip. Here the
//! JS thread writes the request and its own event loop watches the socket, so the reply
//! wakes the thread that waits for it, which reads it into registered memory itself: one.
//! On a busy machine each wake-up costs a context switch or a preemption, which is most of a
//! 4 KiB request's time. Large requests, polled ones and threads without a loop keep to
//! the pool, whose I/O threads keep the copying off the JS thread.
//!
//! The connection is made and authenticated by an I/O thread (the same handshake as the
//! pool's); until it is ready, and while it backs off after a failure, requests take the
//! pool. Only the loop's thread reads and writes the socket. Another thread may break the
//! connection (`fail_peer`, `shutdown`): it fails what is in flight and shuts the socket
//! down, and the loop, woken by the end of the stream, lets go of it.

use std::cell::{Cell, RefCell};
use std::io::{IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use tokio::runtime::Handle;

use super::tcp::Slice;
use crate::error::{Error, Result};
use crate::event_loop::watch::{self as event_loop, Interest, Watch, Watcher};
use crate::kind::Opcode;
use crate::memory::Window;
use crate::net::connect;
use crate::segment::Peer;
use crate::wire::{ConnKind, Header, Op, RejectCode, HEADER_LEN};

/// Largest payload (either way) a request may have to take a loop connection: the JS
/// thread copies it.
pub(crate) const LOOP_MAX: u64 = 64 << 10;
/// Bytes read from the socket at once.
const RX_BUFFER: usize = 128 << 10;
/// Longest error text a reply may carry.
const MAX_ERROR_TEXT: u64 = 4096;
/// How long requests take the pool after a connection failed or broke.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Loop connections of one transport, on any thread: what `fail_peer` and `shutdown`
/// reach them through.
#[derive(Default)]
pub(crate) struct Registry {
    conns: Mutex<Vec<Weak<LoopConn>>>,
    /// Connections being made: a stream that lands after the transport closed, or that
    /// no thread picks up before it closes, is dropped here, not left open in a table.
    landing: Mutex<Vec<Weak<Landing>>>,
    closed: std::sync::atomic::AtomicBool,
}

/// Where an I/O thread puts the stream it connected (or why it could not).
type Landing = Mutex<Option<Result<std::net::TcpStream>>>;

impl Registry {
    fn add(&self, conn: &Arc<LoopConn>) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(conn));
    }

    /// Breaks the connections to `peer` (every connection when `None`) with `error`.
    pub(crate) fn break_all(&self, peer: Option<u64>, error: &Error) {
        let conns: Vec<Arc<LoopConn>> = {
            let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            conns.iter().filter_map(Weak::upgrade).collect()
        };
        for c in conns {
            if peer.is_none_or(|p| c.peer.handle() == p) {
                c.break_with(error.clone());
            }
        }
        if peer.is_none() {
            self.closed
                .store(true, std::sync::atomic::Ordering::Release);
            let landing: Vec<Arc<Landing>> = {
                let l = self.landing.lock().unwrap_or_else(|p| p.into_inner());
                l.iter().filter_map(Weak::upgrade).collect()
            };
            for slot in landing {
                slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            }
        }
    }

    fn track(&self, slot: &Arc<Landing>) {
        let mut l = self.landing.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|s| s.strong_count() > 0);
        l.push(Arc::downgrade(slot));
    }
}

/// What a transport lends its loop connections.
pub(crate) struct Lanes {
    pub rt: Handle,
    pub engine_id: u64,
    pub connect_timeout: Duration,
    pub registry: Arc<Registry>,
}

/// (engine, peer): a thread's loop connections are keyed by both.
type Key = (u64, u64);

/// A thread's connection to one peer, in whatever state it is.
#[derive(Default)]
struct Entry {
    conn: Option<(Arc<LoopConn>, Box<dyn Watch>)>,
    /// An I/O thread is connecting; the stream (or why not) lands here.
    connecting: Option<Arc<Landing>>,
    /// Requests take the pool until then.
    retry_at: Option<Instant>,
}

/// A thread's entries. When the thread ends with entries left (its loop was never
/// uninstalled, as at process exit), their watches are leaked, not dropped: the loop they
/// belong to may be gone, and dropping one calls into it.
#[derive(Default)]
struct Table(FxHashMap<Key, Entry>);

impl Drop for Table {
    fn drop(&mut self) {
        for (_, entry) in self.0.drain() {
            if let Some((_, watch)) = entry.conn {
                std::mem::forget(watch);
            }
        }
    }
}

thread_local! {
    /// Bytes a write of this thread may hand the socket at once (test hook).
    static WRITE_CAP: Cell<usize> = const { Cell::new(usize::MAX) };
    static ENTRIES: RefCell<Table> = RefCell::new(Table::default());
}

/// Sends `slice` on this thread's loop connection to its peer, when the thread has a loop
/// and the connection is ready; otherwise hands it back for the pool.
pub(super) fn try_send(
    lanes: &Lanes,
    peer: &Arc<Peer>,
    slice: Slice,
) -> std::result::Result<(), Slice> {
    let Some(event_loop) = event_loop::current() else {
        return Err(slice);
    };
    let key = (lanes.engine_id, peer.handle());
    let conn = ENTRIES.with(|entries| {
        let mut entries = entries.borrow_mut();
        let entry = entries.0.entry(key).or_default();
        if let Some((conn, _)) = &entry.conn {
            match conn.readiness() {
                Readiness::Ready => return Some(conn.clone()),
                // The rest of a write is still going out: the pool takes this one.
                Readiness::Busy => return None,
                Readiness::Broken => {
                    entry.conn = None;
                    entry.retry_at = Some(Instant::now() + RETRY_AFTER);
                }
            }
        }
        if let Some(slot) = &entry.connecting {
            let landed = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            match landed {
                None => return None,
                Some(Ok(stream)) => {
                    entry.connecting = None;
                    let conn = Arc::new(LoopConn::new(key, peer.clone(), stream));
                    match event_loop.watch(conn.sock.as_raw_fd(), conn.clone()) {
                        Ok(watch) => {
                            lanes.registry.add(&conn);
                            entry.conn = Some((conn.clone(), watch));
                            return Some(conn);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "event loop refused the connection");
                            entry.retry_at = Some(Instant::now() + RETRY_AFTER);
                            return None;
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(peer = peer.name(), error = %e, "loop connection failed");
                    entry.connecting = None;
                    entry.retry_at = Some(Instant::now() + RETRY_AFTER);
                    return None;
                }
            }
        }
        if entry.retry_at.is_some_and(|at| Instant::now() < at) {
            return None;
        }
        entry.retry_at = None;
        entry.connecting = Some(start_connect(lanes, peer));
        None
    });
    let Some(conn) = conn else {
        return Err(slice);
    };
    let sent = conn.send(slice)?;
    if sent.interest == Interest::ReadWrite {
        ENTRIES.with(|entries| {
            if let Some((c, watch)) = entries.borrow().0.get(&key).and_then(|e| e.conn.as_ref()) {
                if Arc::ptr_eq(c, &conn) {
                    watch.set_interest(Interest::ReadWrite);
                }
            }
        });
    }
    sent.settle.settle();
    Ok(())
}

/// Test hook: this thread's loop connections hand the socket at most `cap` bytes per
/// write, and one piece per readiness when flushing, as a socket whose buffer is full
/// would; `None` lifts it. What a write leaves is then sent when the loop finds the
/// socket writable.
pub fn cap_writes_for_tests(cap: Option<usize>) {
    WRITE_CAP.with(|c| c.set(cap.unwrap_or(usize::MAX)));
}

/// Connects and authenticates on an I/O thread; the stream lands in the returned slot.
fn start_connect(lanes: &Lanes, peer: &Arc<Peer>) -> Arc<Landing> {
    let slot: Arc<Landing> = Arc::new(Mutex::new(None));
    lanes.registry.track(&slot);
    let registry = lanes.registry.clone();
    let (addr, engine_id, timeout) = (
        peer.descriptor().tcp_addr.clone(),
        lanes.engine_id,
        lanes.connect_timeout,
    );
    let landed = slot.clone();
    lanes.rt.spawn(async move {
        let stream = connect(&addr, ConnKind::Data, engine_id, timeout)
            .await
            .and_then(|(s, _)| s.into_std().map_err(|e| Error::io("loop connection", &e)))
            .and_then(|s| {
                s.set_nonblocking(true)
                    .map_err(|e| Error::io("loop connection", &e))?;
                Ok(s)
            });
        let mut landed = landed.lock().unwrap_or_else(|p| p.into_inner());
        // Under the slot's lock: `break_all` either sees the stream and drops it, or has
        // marked the registry closed before this looks.
        if !registry.closed.load(std::sync::atomic::Ordering::Acquire) {
            *landed = Some(stream);
        }
    });
    slot
}

/// Breaks every loop connection of this thread and forgets them (its loop is going away).
pub(crate) fn break_this_thread() {
    let entries: Vec<Entry> = ENTRIES.with(|e| e.borrow_mut().0.drain().map(|(_, v)| v).collect());
    for entry in entries {
        if let Some((conn, watch)) = entry.conn {
            conn.break_with(Error::Closed);
            drop(watch);
        }
    }
}

/// Forgets this thread's entry for `conn` (it broke; the loop stops watching it).
fn forget(conn: &LoopConn) {
    // `try_with`: at thread exit the table may already be gone.
    let _ = ENTRIES.try_with(|entries| {
        let mut entries = entries.borrow_mut();
        if let Some(entry) = entries.0.get_mut(&conn.key) {
            if entry
                .conn
                .as_ref()
                .is_some_and(|(c, _)| std::ptr::eq(Arc::as_ptr(c), conn))
            {
                entry.conn = None;
                entry.retry_at = Some(Instant::now() + RETRY_AFTER);
            }
        }
    });
}

/// Whether a connection takes a request now.
enum Readiness {
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
    next_id: u64,
    inflight: FxHashMap<u64, Slice>,
    /// The rest of frames the socket did not take whole; nothing else is sent meanwhile.
    out: Vec<u8>,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    body: Option<Body>,
}

/// One loop connection.
pub(crate) struct LoopConn {
    key: Key,
    peer: Arc<Peer>,
    sock: std::net::TcpStream,
    state: Mutex<State>,
}

/// Tasks to settle once the connection's lock is released (settling may submit again).
#[derive(Default)]
struct Settle {
    done: SmallVec<[Slice; 4]>,
    failed: SmallVec<[(Slice, Error); 1]>,
}

impl Settle {
    fn settle(self) {
        for s in self.done {
            s.task.slice_done(s.attempt, s.len);
        }
        for (s, e) in self.failed {
            s.task.attempt_failed(s.attempt, e);
        }
    }
}

struct Sent {
    interest: Interest,
    settle: Settle,
}

impl LoopConn {
    fn new(key: Key, peer: Arc<Peer>, sock: std::net::TcpStream) -> Self {
        Self {
            key,
            peer,
            sock,
            state: Mutex::new(State {
                open: true,
                next_id: 0,
                inflight: FxHashMap::default(),
                out: Vec::new(),
                rx: vec![0u8; RX_BUFFER].into_boxed_slice(),
                rx_start: 0,
                rx_end: 0,
                body: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn readiness(&self) -> Readiness {
        let st = self.lock();
        match (st.open, st.out.is_empty()) {
            (false, _) => Readiness::Broken,
            (true, false) => Readiness::Busy,
            (true, true) => Readiness::Ready,
        }
    }

    /// Fails everything in flight with `error` and shuts the socket down (from any
    /// thread); the loop then sees the end of the stream and lets go of it.
    pub(crate) fn break_with(&self, error: Error) {
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
    fn send(&self, slice: Slice) -> std::result::Result<Sent, Slice> {
        let mut st = self.lock();
        if !st.open || !st.out.is_empty() {
            return Err(slice);
        }
        let mut settle = Settle::default();
        let payload = match Window::new(&slice.region, slice.local_offset, slice.payload_len()) {
            Ok(w) => w,
            Err(e) => {
                settle.failed.push((slice, e));
                return Ok(Sent {
                    interest: Interest::Read,
                    settle,
                });
            }
        };
        let mut h = Header::new(match slice.opcode {
            Opcode::Write => Op::WriteReq,
            Opcode::Read => Op::ReadReq,
        });
        st.next_id = st.next_id.wrapping_add(1);
        h.request_id = st.next_id;
        h.buffer_id = slice.buffer;
        h.offset = slice.remote_offset;
        h.length = slice.len;
        h.token = slice.token;
        let header = h.encode();
        st.inflight.insert(h.request_id, slice);
        let body = payload.as_slice();
        let total = HEADER_LEN + body.len();
        let cap = WRITE_CAP.with(Cell::get);
        let (head_part, body_part) = (
            &header[..HEADER_LEN.min(cap)],
            &body[..body.len().min(cap.saturating_sub(HEADER_LEN))],
        );
        let written = match (&self.sock)
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
            let (head, tail) = (written.min(HEADER_LEN), written.saturating_sub(HEADER_LEN));
            st.out.extend_from_slice(&header[head..]);
            st.out.extend_from_slice(&body[tail..]);
            Interest::ReadWrite
        } else {
            Interest::Read
        };
        Ok(Sent { interest, settle })
    }

    /// Writes what `out` holds; `Err` when the connection broke.
    fn flush(&self, st: &mut State) -> Result<()> {
        let cap = WRITE_CAP.with(Cell::get);
        while !st.out.is_empty() {
            let take = st.out.len().min(cap);
            match (&self.sock).write(&st.out[..take]) {
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
            match (&self.sock).read(&mut st.rx[end..]) {
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
                    Body::Read { dst, got, .. } => {
                        let dst = dst.as_mut_slice();
                        let take = avail.min(dst.len() - *got);
                        dst[*got..*got + take].copy_from_slice(&src[..take]);
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
                    Some(Body::Read { slice, .. }) => settle.done.push(slice),
                    Some(Body::Error {
                        slice, text, code, ..
                    }) => {
                        let error = Error::RemoteRejected(format!(
                            "{code:?}: {}",
                            String::from_utf8_lossy(&text)
                        ));
                        settle.failed.push((slice, error));
                    }
                    None => {}
                }
                continue;
            }
            if avail < HEADER_LEN {
                return Ok(());
            }
            let h = Header::decode(&st.rx[st.rx_start..st.rx_start + HEADER_LEN])
                .map_err(|e| Error::Protocol(e.to_string()))?;
            st.rx_start += HEADER_LEN;
            let Some(slice) = st.inflight.remove(&h.request_id) else {
                return Err(Error::Protocol(format!(
                    "reply to unknown request {}",
                    h.request_id
                )));
            };
            match (h.op, slice.opcode) {
                (Op::WriteAck, Opcode::Write) if h.length == 0 => settle.done.push(slice),
                (Op::ReadResp, Opcode::Read) if h.length == slice.len => {
                    match Window::new(&slice.region, slice.local_offset, slice.len) {
                        Ok(dst) => st.body = Some(Body::Read { slice, dst, got: 0 }),
                        Err(e) => {
                            settle.failed.push((slice, e.clone()));
                            return Err(e);
                        }
                    }
                }
                (Op::Error, _) if h.length <= MAX_ERROR_TEXT => {
                    st.body = Some(Body::Error {
                        slice,
                        text: Vec::new(),
                        want: h.length as usize,
                        code: RejectCode::from_raw(h.flags),
                    });
                }
                (op, expected) => {
                    let error = Error::Protocol(format!(
                        "{op:?} (len {}) in reply to a {expected:?}",
                        h.length
                    ));
                    settle.failed.push((slice, error.clone()));
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
                        if matches!(cause, Error::Protocol(_)) {
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
            forget(self);
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
    use crate::memory::RegionTable;
    use crate::task::tests::waiting_task;

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
            conn: LoopConn::new((1, 1), peer, near),
            region,
            _far: far,
        }
    }

    impl Rig {
        /// A request of `opcode` in flight as id `id`, landing at offset LEN of the region.
        fn in_flight(&self, id: u64, opcode: Opcode) {
            let (task, _) = waiting_task();
            let slice = Slice {
                task,
                attempt: 0,
                opcode,
                region: crate::lanes::Lent::new(self.region.clone()),
                local_offset: LEN,
                buffer: 0,
                remote_offset: 0,
                len: LEN,
                token: [0; 16],
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
            (Op::Error, Opcode::Read, MAX_ERROR_TEXT + 1),
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
}
