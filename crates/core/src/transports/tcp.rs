//! The TCP transport, initiator side. Per peer, a small pool of data connections; each
//! connection is an actor that connects on demand (with backoff after failures), writes
//! slices straight from registered memory, and reads WRITE acks and READ payloads straight
//! into registered memory. Many slices are in flight per connection. A reset, an EOF or a
//! protocol violation fails every in-flight slice on that connection at once.
//!
//! When the connection is idle, the submitting thread writes a submission's frames itself:
//! non-blocking `writev`s of what the socket takes at once, no thread hand-off. It does so
//! for every polled submission (the batch API, tebench's workers: one op in flight then
//! starts moving without waiting for another thread, which a stolen vCPU would delay), and
//! for small ones of the Promise path (its caller is a JS thread). A request of many slices
//! (a gather of blocks) gives each connection its share as one list, and those frames leave
//! together in as few `writev` calls as the socket allows. Everything else (large Promise
//! frames, frames behind others, the rest of a partial write) goes through the connection's
//! writer task, which keeps frames in submission order and writes what it has queued in
//! batches too.
//!
//! The serving side lives in `server.rs`.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::kind::Opcode;
use crate::kind::TransportKind;
use crate::lanes::Lent;
use crate::memory::{Region, Window};
use crate::net::{connect, read_header};
use crate::segment::Peer;
use crate::task::{Observer, Task};
use crate::transport::{Attempt, Transport, TransportContext, TransportFactory};
use crate::wire::{ConnKind, Header, Op, RejectCode, Token, HEADER_LEN, MAX_DATA_PAYLOAD};

use super::tcp_loop::{self, Lanes, LOOP_MAX};

const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
const IO_BUFFER: usize = 64 << 10;
/// Frames up to this payload size may be written by the submitting thread itself.
const INLINE_MAX: u64 = 64 << 10;
/// A submission's frames for one connection are written inline together up to this many
/// payload bytes (a gather of small blocks: one `writev` instead of one per block).
const INLINE_BATCH_MAX: u64 = 1 << 20;
/// Slices handed to one `writev` at most (two per frame; Linux takes 1024).
const BATCH_IOVECS: usize = 1024;
/// Frames the writer task takes from its queue for one `writev` round, at most.
const WRITER_BATCH: usize = BATCH_IOVECS / 2;
/// Payload bytes the writer task takes from its queue at once, at most (beyond the first
/// frame).
const WRITER_BATCH_BYTES: u64 = 1 << 20;

/// Settings of the TCP transport.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// Data connections per peer.
    pub connections_per_peer: usize,
    /// Requests larger than this are cut into slices of this size.
    pub slice_size: u64,
    /// Connect (and hello) timeout.
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            connections_per_peer: 2,
            // Half a MiB: a 1 MiB request goes out on both connections at once, so both
            // cores copy (one op in flight moved 0.55-0.6x iperf3 with 1 MiB slices,
            // 0.75-0.96x with these, in the same runs).
            slice_size: 512 << 10,
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// One slice of a task, queued or in flight.
pub(super) struct Slice {
    pub(super) task: Arc<Task>,
    pub(super) attempt: u32,
    pub(super) opcode: Opcode,
    pub(super) region: Lent<Region>,
    pub(super) local_offset: u64,
    pub(super) buffer: u64,
    pub(super) remote_offset: u64,
    pub(super) len: u64,
    pub(super) token: Token,
}

impl Slice {
    /// Bytes of payload this slice's request frame carries.
    pub(super) fn payload_len(&self) -> u64 {
        match self.opcode {
            Opcode::Write => self.len,
            Opcode::Read => 0,
        }
    }
}

/// One submission's slices for one connection (most often one slice: inline).
type Slices = SmallVec<[Slice; 1]>;

/// A request frame being written: its header and the payload it points into.
struct Frame {
    header: [u8; HEADER_LEN],
    /// The payload (empty for a READ request), its memory kept mapped by the window.
    payload: Window,
    written: usize,
}

impl Frame {
    fn total(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// The unwritten rest, as at most two slices.
    fn rest(&self) -> [IoSlice<'_>; 2] {
        let payload = self.payload.as_slice();
        if self.written < HEADER_LEN {
            [
                IoSlice::new(&self.header[self.written..]),
                IoSlice::new(payload),
            ]
        } else {
            [
                IoSlice::new(&payload[self.written - HEADER_LEN..]),
                IoSlice::new(&[]),
            ]
        }
    }
}

/// Writes as much of `frames` as the socket takes now, in order, one `writev` per round
/// (at most [`BATCH_IOVECS`] slices), advancing each frame's `written`. Ok once every
/// frame is complete; `WouldBlock` (or the error met) otherwise, with whatever was
/// written kept in the frames ([`complete_prefix`] counts the finished ones).
fn write_frames(half: &OwnedWriteHalf, frames: &mut [Frame]) -> std::io::Result<()> {
    let mut done = complete_prefix(frames);
    while done < frames.len() {
        let bufs: SmallVec<[IoSlice<'_>; 2]> = frames[done..]
            .iter()
            .take(BATCH_IOVECS / 2)
            .flat_map(|f| f.rest())
            .collect();
        let mut n = half.try_write_vectored(&bufs)?;
        drop(bufs);
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        for frame in &mut frames[done..] {
            let step = n.min(frame.total() - frame.written);
            frame.written += step;
            n -= step;
            if n == 0 {
                break;
            }
        }
        done = complete_prefix(frames);
    }
    Ok(())
}

/// How many frames from the front are completely written.
fn complete_prefix(frames: &[Frame]) -> usize {
    frames.iter().take_while(|f| f.written == f.total()).count()
}

enum Queued {
    /// Not yet registered or written.
    Fresh(Slice),
    /// Registered and partly written: it must finish before anything else is written.
    Partial(Frame),
}

#[derive(Default)]
struct Inflight {
    open: bool,
    next_id: u64,
    slices: HashMap<u64, Slice>,
}

#[derive(Default)]
struct WriteState {
    queue: VecDeque<Queued>,
    /// The writer task is writing a frame it took from the queue.
    writer_busy: bool,
    /// A submitting thread is writing its frames itself (`DataConn::send`), outside this
    /// lock: everything else waits in the queue, and the writer task takes nothing.
    inline_busy: bool,
    /// The connected socket's write half; `None` while disconnected.
    half: Option<Arc<OwnedWriteHalf>>,
}

impl WriteState {
    /// The next queued item for the writer task; none while a submitting thread writes
    /// inline (it owns the socket until it hands back).
    fn take_for_writer(&mut self) -> Option<Queued> {
        if self.inline_busy {
            None
        } else {
            self.queue.pop_front()
        }
    }

    /// Ends a submitting thread's inline write on `half`: `partial` (frames it registered
    /// but the socket did not take whole) and then `unregistered` go to the writer task,
    /// in order, ahead of what others queued meanwhile. Partly written frames belong to the
    /// connection they started on: if it broke meanwhile (`half` is no longer the current
    /// one), their slices were registered there and are failed with it (`fail_all`), and
    /// their rest must not reach the next connection, so they are dropped.
    fn hand_back(
        &mut self,
        half: &Arc<OwnedWriteHalf>,
        partial: impl Iterator<Item = Frame>,
        unregistered: impl IntoIterator<Item = Queued>,
    ) {
        self.inline_busy = false;
        let same = self.half.as_ref().is_some_and(|h| Arc::ptr_eq(h, half));
        let partial = partial.filter(|_| same).map(Queued::Partial);
        let rest: SmallVec<[Queued; 1]> = partial.chain(unregistered).collect();
        for q in rest.into_iter().rev() {
            self.queue.push_front(q);
        }
    }
}

struct DataConn {
    peer: Arc<Peer>,
    inflight: Mutex<Inflight>,
    write: Mutex<WriteState>,
    /// Wakes the actor: work was queued.
    work: Notify,
    current: Mutex<CancellationToken>,
}

impl DataConn {
    fn lock(&self) -> MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write_state(&self) -> MutexGuard<'_, WriteState> {
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a slice as in flight and builds its frame; hands the slice back if the
    /// connection is closing.
    fn register(&self, slice: Slice) -> std::result::Result<Frame, Slice> {
        let mut h = Header::new(match slice.opcode {
            Opcode::Write => Op::WriteReq,
            Opcode::Read => Op::ReadReq,
        });
        h.buffer_id = slice.buffer;
        h.offset = slice.remote_offset;
        h.length = slice.len;
        h.token = slice.token;
        let payload = match Window::new(&slice.region, slice.local_offset, slice.payload_len()) {
            Ok(w) => w,
            Err(e) => {
                slice.task.attempt_failed(slice.attempt, e);
                return Err(slice);
            }
        };
        let mut inf = self.lock();
        if !inf.open {
            return Err(slice);
        }
        inf.next_id = inf.next_id.wrapping_add(1);
        let id = inf.next_id;
        inf.slices.insert(id, slice);
        h.request_id = id;
        Ok(Frame {
            header: h.encode(),
            payload,
            written: 0,
        })
    }

    fn take(&self, id: u64) -> Option<Slice> {
        self.lock().slices.remove(&id)
    }

    /// Sends slices of one submission for this connection, in order. When the connection
    /// is idle, this thread registers them and writes what the socket takes at once, in
    /// as few `writev` calls as it allows; the writer task finishes the rest. That is
    /// every submission of a polled task (its caller waits for it anyway, and one op in
    /// flight then waits for no other thread to start moving), and small ones of the
    /// Promise path (whose caller is a JS thread, which a long copy into the socket would
    /// block). Otherwise they are queued for the writer task.
    fn send(&self, slices: Slices) {
        let mut st = self.write_state();
        let idle = !st.writer_busy && !st.inline_busy && st.queue.is_empty();
        let small = slices.iter().all(|s| s.payload_len() <= INLINE_MAX)
            && slices.iter().map(Slice::payload_len).sum::<u64>() <= INLINE_BATCH_MAX;
        let polled = slices
            .first()
            .is_some_and(|s| s.task.observer() == Observer::Poll);
        let half = match &st.half {
            Some(h) if idle && (small || polled) => h.clone(),
            _ => {
                st.queue.extend(slices.into_iter().map(Queued::Fresh));
                drop(st);
                self.work.notify_one();
                return;
            }
        };
        // This thread is the connection's writer until it hands the rest back below; the
        // copy into the socket runs outside the lock, so other submitters queue meanwhile
        // instead of waiting for it.
        st.inline_busy = true;
        drop(st);
        let mut frames: SmallVec<[Frame; 1]> = SmallVec::with_capacity(slices.len());
        let mut unregistered = VecDeque::new();
        let mut rest = slices.into_iter();
        while let Some(slice) = rest.next() {
            match self.register(slice) {
                Ok(f) => frames.push(f),
                Err(slice) => {
                    // Closing: the actor decides for this one and the rest (reconnect or
                    // fail); the registered ones are failed with the connection.
                    unregistered.push_back(Queued::Fresh(slice));
                    unregistered.extend(rest.by_ref().map(Queued::Fresh));
                }
            }
        }
        let _ = write_frames(&half, &mut frames);
        let written = complete_prefix(&frames);
        let mut st = self.write_state();
        st.hand_back(&half, frames.into_iter().skip(written), unregistered);
        if st.queue.is_empty() {
            return;
        }
        drop(st);
        self.work.notify_one();
    }

    /// Closes the connection's books and fails everything in flight with `error`.
    fn fail_all(&self, error: &Error) {
        let drained: Vec<Slice> = {
            let mut inf = self.lock();
            inf.open = false;
            inf.slices.drain().map(|(_, s)| s).collect()
        };
        for s in drained {
            s.task.attempt_failed(s.attempt, error.clone());
        }
    }

    /// Fails every slice still queued.
    fn fail_queued(&self, error: &Error) {
        let queued: Vec<Queued> = self.write_state().queue.drain(..).collect();
        for q in queued {
            if let Queued::Fresh(s) = q {
                s.task.attempt_failed(s.attempt, error.clone());
            }
        }
    }

    fn error_for_break(&self, cause: Error) -> Error {
        if self.peer.is_lost() {
            self.peer.lost_error()
        } else {
            cause
        }
    }
}

struct PeerPool {
    conns: Vec<Arc<DataConn>>,
    next: AtomicUsize,
}

/// Builds the TCP transport.
#[derive(Debug, Clone, Copy)]
pub struct TcpFactory(pub TcpConfig);

impl TransportFactory for TcpFactory {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>> {
        Ok(Arc::new(TcpTransport::new(
            context.handle,
            context.engine_id,
            self.0,
            context.shutdown,
        )))
    }
}

/// The TCP transport.
pub struct TcpTransport {
    rt: Handle,
    local_engine_id: u64,
    config: TcpConfig,
    pools: Mutex<FxHashMap<u64, Arc<PeerPool>>>,
    shutdown: CancellationToken,
    /// Set by `shutdown`: what a submit checks (`CancellationToken::is_cancelled` takes a
    /// mutex, which threads submitting side by side queue on).
    closed: AtomicBool,
    /// Connections watched by submitting threads' event loops (`tcp_loop`).
    lanes: Lanes,
}

impl TcpTransport {
    /// A transport whose connection actors run on `rt`.
    pub fn new(
        rt: Handle,
        local_engine_id: u64,
        config: TcpConfig,
        shutdown: CancellationToken,
    ) -> Self {
        let mut config = config;
        config.connections_per_peer = config.connections_per_peer.clamp(1, 64);
        config.slice_size = config.slice_size.clamp(4096, MAX_DATA_PAYLOAD);
        let lanes = Lanes {
            rt: rt.clone(),
            engine_id: local_engine_id,
            connect_timeout: config.connect_timeout,
            registry: Arc::default(),
        };
        Self {
            rt,
            local_engine_id,
            config,
            pools: Mutex::new(FxHashMap::default()),
            shutdown,
            closed: AtomicBool::new(false),
            lanes,
        }
    }

    fn pool(&self, peer: &Arc<Peer>) -> Arc<PeerPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(peer.handle())
            .or_insert_with(|| {
                let conns = (0..self.config.connections_per_peer)
                    .map(|_| {
                        let conn = Arc::new(DataConn {
                            peer: peer.clone(),
                            inflight: Mutex::new(Inflight::default()),
                            write: Mutex::new(WriteState::default()),
                            work: Notify::new(),
                            current: Mutex::new(CancellationToken::new()),
                        });
                        self.rt.spawn(conn_actor(
                            conn.clone(),
                            self.shutdown.clone(),
                            self.local_engine_id,
                            self.config.connect_timeout,
                        ));
                        conn
                    })
                    .collect();
                Arc::new(PeerPool {
                    conns,
                    next: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    fn submit_attempt(&self, a: &Attempt) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let task = &a.task;
        let req = task.request();
        if req.peer.is_lost() {
            return Err(req.peer.lost_error());
        }
        let token = req.descriptor.token_bytes()?;
        let pool = self.pool(&req.peer);
        let slice_size = self.config.slice_size;
        let count = u32::try_from(req.slice_count(slice_size)).map_err(|_| {
            Error::InvalidArgument(format!(
                "request of {} bytes has too many slices",
                req.length
            ))
        })?;
        task.expect_slices(a.attempt, count);
        let slice_of = |piece: crate::request::Span| Slice {
            task: task.clone(),
            attempt: a.attempt,
            opcode: req.opcode,
            region: req.local.clone(),
            local_offset: piece.local_offset,
            buffer: req.remote_buffer,
            remote_offset: piece.remote_offset,
            len: piece.length,
            token,
        };
        let conns = pool.conns.len();
        if count == 1 && task.observer() == Observer::Progress && req.length <= LOOP_MAX {
            // A small awaited request from a thread with an event loop: that loop watches
            // the reply (`tcp_loop`), when its connection is ready.
            let piece = req.slices(slice_size).next();
            if let Some(piece) = piece {
                if let Err(slice) = tcp_loop::try_send(&self.lanes, &req.peer, slice_of(piece)) {
                    let first = pool.next.fetch_add(1, Ordering::Relaxed);
                    pool.conns[first % conns].send(smallvec::smallvec![slice]);
                }
                return Ok(());
            }
        }
        // Round robin from where the pool stands; with many slices (a gather, or a large
        // request) each connection gets its share as one list, written together.
        let first = pool.next.fetch_add(count as usize, Ordering::Relaxed);
        let ways = conns.min(count as usize);
        let mut shares: SmallVec<[Slices; 2]> = (0..ways).map(|_| Slices::new()).collect();
        for (i, piece) in req.slices(slice_size).enumerate() {
            shares[i % ways].push(slice_of(piece));
        }
        for (i, share) in shares.into_iter().enumerate() {
            pool.conns[(first + i) % conns].send(share);
        }
        Ok(())
    }

    fn pools(&self) -> Vec<Arc<PeerPool>> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.values().cloned().collect()
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>> {
        attempts.iter().map(|a| self.submit_attempt(a)).collect()
    }

    fn submit_one(&self, attempt: &Attempt) -> Result<()> {
        self.submit_attempt(attempt)
    }

    fn fail_peer(&self, peer: &Peer, error: Error) {
        let pool = {
            let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            pools.get(&peer.handle()).cloned()
        };
        self.lanes.registry.break_all(Some(peer.handle()), &error);
        if let Some(pool) = pool {
            for conn in &pool.conns {
                conn.fail_all(&error);
                conn.fail_queued(&error);
                conn.current
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cancel();
            }
        }
    }

    fn forget_peer(&self, peer: &Peer, error: Error) {
        self.fail_peer(peer, error);
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer.handle());
    }

    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.shutdown.cancel();
        self.lanes.registry.break_all(None, &Error::Closed);
        for pool in self.pools() {
            for conn in &pool.conns {
                conn.fail_all(&Error::Closed);
                conn.fail_queued(&Error::Closed);
            }
        }
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Owns one data connection's life: connect on demand, run, fail what was in flight when
/// it breaks, and start again when more work arrives.
async fn conn_actor(
    conn: Arc<DataConn>,
    shutdown: CancellationToken,
    local_engine_id: u64,
    connect_timeout: Duration,
) {
    let mut backoff = BACKOFF_START;
    let mut retry_at: Option<(Instant, Error)> = None;
    loop {
        // Wait for queued work.
        while conn.write_state().queue.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = conn.work.notified() => {}
            }
        }
        if conn.peer.is_lost() {
            conn.fail_queued(&conn.peer.lost_error());
            continue;
        }
        if let Some((at, err)) = &retry_at {
            if Instant::now() < *at {
                conn.fail_queued(err);
                continue;
            }
        }
        let addr = conn.peer.descriptor().tcp_addr.clone();
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = connect(&addr, ConnKind::Data, local_engine_id, connect_timeout) => c,
        };
        let stream = match connected {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(peer = conn.peer.name(), error = %e, "data connect failed");
                conn.fail_queued(&e);
                retry_at = Some((Instant::now() + backoff, e));
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_START;
        retry_at = None;
        let cancel = shutdown.child_token();
        *conn.current.lock().unwrap_or_else(|p| p.into_inner()) = cancel.clone();
        let (rd, wr) = stream.into_split();
        let half = Arc::new(wr);
        conn.lock().open = true;
        conn.write_state().half = Some(half.clone());
        let cause = tokio::select! {
            _ = cancel.cancelled() => Error::Closed,
            e = read_loop(&conn, BufReader::with_capacity(IO_BUFFER, rd)) => e,
            e = write_loop(&conn, &half) => e,
        };
        let error = conn.error_for_break(cause);
        tracing::debug!(peer = conn.peer.name(), error = %error, "data connection ended");
        {
            let mut st = conn.write_state();
            st.half = None;
            st.writer_busy = false;
            // Partly written frames are registered: `fail_all` below fails them.
            st.queue.retain(|q| matches!(q, Queued::Fresh(_)));
        }
        conn.fail_all(&error);
    }
}

/// Takes the next frames to write from the queue: the front item and, behind it, more
/// up to [`WRITER_BATCH`] frames and [`WRITER_BATCH_BYTES`] of payload, so that a queue
/// of small frames leaves in one `writev`. Marks the writer busy while it holds any.
fn next_batch(conn: &DataConn) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut bytes = 0u64;
    loop {
        let next = {
            let mut st = conn.write_state();
            let full = frames.len() >= WRITER_BATCH || bytes >= WRITER_BATCH_BYTES;
            let next = if full { None } else { st.take_for_writer() };
            st.writer_busy = next.is_some() || !frames.is_empty();
            next
        };
        let frame = match next {
            None => return frames,
            Some(Queued::Partial(frame)) => frame,
            Some(Queued::Fresh(slice)) => {
                if slice.task.status().is_terminal() || slice.task.attempt() != slice.attempt {
                    continue; // canceled, failed or failed over: do not spend bandwidth on it
                }
                match conn.register(slice) {
                    Ok(frame) => frame,
                    Err(slice) => {
                        let error = conn.error_for_break(Error::Io("connection closing".into()));
                        slice.task.attempt_failed(slice.attempt, error);
                        continue;
                    }
                }
            }
        };
        bytes += (frame.total() - frame.written) as u64;
        frames.push(frame);
    }
}

/// Writes queued frames in order until the connection fails.
async fn write_loop(conn: &DataConn, half: &OwnedWriteHalf) -> Error {
    loop {
        let mut frames = next_batch(conn);
        if frames.is_empty() {
            conn.work.notified().await;
            continue;
        }
        loop {
            match write_frames(half, &mut frames) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Err(e) = half.writable().await {
                        return Error::io("send", &e);
                    }
                }
                Err(e) => return Error::io("send", &e),
            }
        }
    }
}

async fn read_loop(conn: &DataConn, mut r: BufReader<OwnedReadHalf>) -> Error {
    loop {
        let h = match read_header(&mut r).await {
            Ok(Some(h)) => h,
            Ok(None) => return Error::Io("connection closed by peer".into()),
            Err(e) => {
                if matches!(e, Error::Protocol(_)) {
                    tracing::warn!(peer = conn.peer.name(), error = %e, "dropping data connection");
                }
                return e;
            }
        };
        let Some(slice) = conn.take(h.request_id) else {
            return Error::Protocol(format!("reply to unknown request {}", h.request_id));
        };
        match (h.op, slice.opcode) {
            (Op::WriteAck, Opcode::Write) => slice.task.slice_done(slice.attempt, slice.len),
            (Op::ReadResp, Opcode::Read) if h.length == slice.len => {
                let mut dst = match Window::new(&slice.region, slice.local_offset, slice.len) {
                    Ok(w) => w,
                    Err(e) => {
                        slice.task.attempt_failed(slice.attempt, e.clone());
                        return e;
                    }
                };
                if let Err(e) = r.read_exact(dst.as_mut_slice()).await {
                    let err = Error::io("receive READ payload", &e);
                    slice.task.attempt_failed(slice.attempt, err.clone());
                    return err;
                }
                slice.task.slice_done(slice.attempt, slice.len);
            }
            (Op::Error, _) => {
                let mut text = vec![0u8; h.length.min(HEADER_LEN as u64 * 100) as usize];
                if let Err(e) = r.read_exact(&mut text).await {
                    let err = Error::io("receive error text", &e);
                    slice.task.attempt_failed(slice.attempt, err.clone());
                    return err;
                }
                let code = RejectCode::from_raw(h.flags);
                slice.task.attempt_failed(
                    slice.attempt,
                    Error::RemoteRejected(format!("{code:?}: {}", String::from_utf8_lossy(&text))),
                );
            }
            (op, expected) => {
                let err = Error::Protocol(format!(
                    "{op:?} (len {}) in reply to a {expected:?}",
                    h.length
                ));
                slice.task.attempt_failed(slice.attempt, err.clone());
                return err;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::RegionTable;
    use tokio::io::AsyncReadExt;

    /// Frames of `region`: frame `i` has a header whose offset field is `i` and the
    /// `len`-byte payload at `i * len`.
    fn frames(region: &Arc<Region>, count: u64, len: u64) -> Vec<Frame> {
        (0..count)
            .map(|i| {
                let mut h = Header::new(Op::WriteReq);
                h.offset = i;
                h.length = len;
                Frame {
                    header: h.encode(),
                    payload: Window::new(region, i * len, len).expect("window"),
                    written: 0,
                }
            })
            .collect()
    }

    /// Runs `f` on a current-thread runtime with I/O and time.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// `n` connected sockets' write halves, and their other ends (kept open by the caller).
    async fn write_halves(n: usize) -> (Vec<Arc<OwnedWriteHalf>>, Vec<tokio::net::TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (mut halves, mut ends) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            ends.push(listener.accept().await.expect("accept").0);
            halves.push(Arc::new(client.into_split().1));
        }
        (halves, ends)
    }

    /// The header offsets of the queued frames (fresh slices read as `u64::MAX`).
    fn queued(st: &WriteState) -> Vec<u64> {
        st.queue
            .iter()
            .map(|q| match q {
                Queued::Partial(f) => Header::decode(&f.header).expect("header").offset,
                Queued::Fresh(_) => u64::MAX,
            })
            .collect()
    }

    #[test]
    fn an_inline_write_owns_the_socket_then_hands_its_rest_back_first() {
        block_on(async {
            let (halves, _ends) = write_halves(1).await;
            let table = RegionTable::default();
            let region = table.allocate(16 * 4096).expect("region");
            let mut ours = frames(&region, 2, 4096).into_iter();
            let theirs = frames(&region, 10, 4096).pop().expect("frame 9");
            let mut st = WriteState {
                half: Some(halves[0].clone()),
                inline_busy: true,
                ..WriteState::default()
            };
            // Another submitter queued behind the inline write: the writer takes nothing.
            st.queue.push_back(Queued::Partial(theirs));
            assert!(st.take_for_writer().is_none());
            // Frame 0 went out whole; frame 1 was cut short.
            ours.next();
            st.hand_back(&halves[0], ours, std::iter::empty());
            assert!(!st.inline_busy);
            assert_eq!(queued(&st), vec![1, 9], "the inline write's rest first");
            assert!(matches!(st.take_for_writer(), Some(Queued::Partial(_))));
        });
    }

    #[test]
    fn the_rest_of_an_inline_write_never_reaches_another_connection() {
        block_on(async {
            let (halves, _ends) = write_halves(2).await;
            let table = RegionTable::default();
            let region = table.allocate(16 * 4096).expect("region");
            let fresh = || {
                Queued::Fresh(Slice {
                    task: crate::task::tests::waiting_task().0,
                    attempt: 1,
                    opcode: Opcode::Write,
                    region: Lent::new(region.clone()),
                    local_offset: 0,
                    buffer: 0,
                    remote_offset: 0,
                    len: 4096,
                    token: [0; 16],
                })
            };
            // The connection the write started on broke (none now), or broke and another
            // took its place: its partly written frame is dropped (its slice fails with the
            // connection it was registered on); what was never registered is kept.
            for now in [None, Some(halves[1].clone())] {
                let mut st = WriteState {
                    half: now,
                    inline_busy: true,
                    ..WriteState::default()
                };
                st.hand_back(&halves[0], frames(&region, 1, 4096).into_iter(), [fresh()]);
                assert!(!st.inline_busy);
                assert_eq!(queued(&st), vec![u64::MAX]);
            }
        });
    }

    #[test]
    fn frames_written_together_arrive_whole_and_in_order_through_partial_writes() {
        block_on(async {
            let table = RegionTable::default();
            const COUNT: u64 = 700; // more frames than one writev takes
            const LEN: u64 = 4096;
            let region = table.allocate(COUNT * LEN).expect("region");
            let mut whole = Window::new(&region, 0, COUNT * LEN).expect("window");
            for (i, b) in whole.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let bytes = whole.as_slice();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            // A small send buffer: the writes are cut short and wait for room many times.
            socket.set_send_buffer_size(8192).expect("sndbuf");
            let client = socket.connect(addr).await.expect("connect");
            let (mut server, _) = listener.accept().await.expect("accept");
            let (_rd, wr) = client.into_split();
            let mut all = frames(&region, COUNT, LEN);
            let reader = tokio::spawn(async move {
                let mut got = vec![0u8; (COUNT * (HEADER_LEN as u64 + LEN)) as usize];
                server.read_exact(&mut got).await.expect("read");
                got
            });
            let mut blocked = 0;
            loop {
                match write_frames(&wr, &mut all) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        blocked += 1;
                        wr.writable().await.expect("writable");
                    }
                    Err(e) => panic!("write: {e}"),
                }
            }
            assert!(
                blocked > 0,
                "the small buffer never filled: test proves nothing"
            );
            assert_eq!(complete_prefix(&all), all.len());
            let got = reader.await.expect("reader");
            for (i, frame) in got.chunks(HEADER_LEN + LEN as usize).enumerate() {
                let h = Header::decode(&frame[..HEADER_LEN]).expect("header");
                assert_eq!((h.op, h.offset, h.length), (Op::WriteReq, i as u64, LEN));
                let at = i * LEN as usize;
                assert_eq!(
                    &frame[HEADER_LEN..],
                    &bytes[at..at + LEN as usize],
                    "frame {i}"
                );
            }
        });
    }
}
