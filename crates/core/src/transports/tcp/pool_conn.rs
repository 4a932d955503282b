//! A connection of a peer's pool, run by the I/O threads. Each connection is an actor that
//! connects when its first work arrives (with backoff after failures), writes slices straight from
//! registered memory, and reads WRITE acks and READ payloads straight into registered
//! memory. Many slices are in flight per connection. A reset, an EOF or a protocol
//! violation fails every in-flight slice on that connection at once.
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
//! Replies are decoded by `reply::decode`, the same decoder the loop connections use.
//!
//! Deadlines: the first slice of each share reports, as its frame is registered to go
//! out, that its attempt started moving (`Task::started`), so an attempt is timed from
//! there, not while it waits in the queue. A frame is registered only while the
//! connection's in-flight window has room (`window`): work beyond it stays queued, not
//! started, so a written frame waits for its answer behind at most a window's worth of
//! work, however long the list. What bounds the queue's wait is `Stall`: a connection
//! with frames unanswered for the attempt deadline is broken, and everything it holds,
//! its queue too, fails with TIMEOUT.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::outgoing::{complete_prefix, write_frames, Frame, Queued, WriteState, BATCH_IOVECS};
use super::reply::{self, Reply};
use super::request::Slice;
use super::sealed_frames::{tamper_notice, write_sealed};
use super::stall::Stall;
use super::window::Window;
use crate::checksummed_read::read_checksummed;
use crate::error::Error;
use crate::integrity::Running;
use crate::lazy_now::LazyNow;
use crate::net::{connect_data, read_header_bytes};
use crate::seal::{SealKeys, Sealer};
use crate::sealed_stream::SealedRead;
use crate::segment::Peer;
use crate::task::Observer;
use crate::transport::AnsweredHook;

const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
const IO_BUFFER: usize = 64 << 10;
/// Frames up to this payload size may be written by the submitting thread itself.
const INLINE_MAX: u64 = 64 << 10;
/// A submission's frames for one connection are written inline together up to this many
/// payload bytes (a gather of small blocks: one `writev` instead of one per block).
const INLINE_BATCH_MAX: u64 = 1 << 20;
/// Frames the writer task takes from its queue for one `writev` round, at most.
const WRITER_BATCH: usize = BATCH_IOVECS / 2;
/// Payload bytes the writer task takes from its queue at once, at most (beyond the first
/// frame).
const WRITER_BATCH_BYTES: u64 = 1 << 20;

/// One submission's slices for one connection (most often one slice: inline).
pub(super) type Slices = SmallVec<[Slice; 1]>;

/// What registering a slice came to.
enum Registered {
    /// In flight: its frame, to be written.
    Frame(Frame),
    /// Not yet: the window is full.
    Held(Slice),
    /// Not on this connection: it is closing, or the slice failed.
    Refused(Slice),
}

struct Inflight {
    open: bool,
    /// The peer incarnation the open connection reached (its handshake's engine id).
    remote_engine: u64,
    next_id: u64,
    slices: HashMap<u64, Slice>,
    /// Replies read (for `Stall`: a connection that answers is not stuck).
    replies: u64,
    /// What of `slices` is written and unanswered, and whether more may be written.
    window: Window,
}

impl Inflight {
    fn new(window: u64) -> Self {
        Self {
            open: false,
            remote_engine: 0,
            next_id: 0,
            slices: HashMap::new(),
            replies: 0,
            window: Window::new(window),
        }
    }
}

/// One connection of a peer's pool.
pub(super) struct PoolConn {
    peer: Arc<Peer>,
    inflight: Mutex<Inflight>,
    write: Mutex<WriteState>,
    /// Wakes the actor: work was queued.
    work: Notify,
    current: Mutex<CancellationToken>,
    /// Hears which incarnation of the peer each connection reached.
    answered: Option<AnsweredHook>,
}

impl PoolConn {
    /// A connection to `peer`, its actor spawned on `rt`: it connects when work arrives.
    /// With `timeouts.stuck_after`, a connection whose frames go unanswered that long is
    /// broken, and what it holds fails (`Stall`). At most `window` charged bytes are
    /// written and unanswered at a time (`window::size`).
    pub(super) fn start(
        peer: &Arc<Peer>,
        rt: &Handle,
        shutdown: CancellationToken,
        local_engine_id: u64,
        answered: Option<AnsweredHook>,
        timeouts: Timeouts,
        window: u64,
    ) -> Arc<Self> {
        let conn = Arc::new(Self {
            peer: peer.clone(),
            answered,
            inflight: Mutex::new(Inflight::new(window)),
            write: Mutex::new(WriteState::default()),
            work: Notify::new(),
            current: Mutex::new(CancellationToken::new()),
        });
        rt.spawn(conn_actor(
            conn.clone(),
            shutdown,
            local_engine_id,
            timeouts,
        ));
        conn
    }

    /// Breaks the connection now (its actor fails what was in flight); the next work
    /// connects again.
    pub(super) fn cancel(&self) {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cancel();
    }

    fn lock(&self) -> MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write_state(&self) -> MutexGuard<'_, WriteState> {
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a slice as in flight and builds its frame, to be written at `now`, if
    /// the window has room for it (else it is held back, and the writer woken once there
    /// is room: `take`); refuses it if the connection is closing, or fails it when it
    /// cannot go on it (a payload outside its region, or a connection to another
    /// incarnation of the peer than it was planned for).
    fn register(&self, mut slice: Slice, now: &LazyNow) -> Registered {
        let payload = match slice.payload() {
            Ok(w) => w,
            Err(e) => {
                slice.task.attempt_failed(slice.attempt, e);
                return Registered::Refused(slice);
            }
        };
        let checksum = slice.checksum(&payload);
        let mut inf = self.lock();
        if !inf.open {
            return Registered::Refused(slice);
        }
        if let Err(e) = slice.check_incarnation(inf.remote_engine) {
            drop(inf);
            slice.task.attempt_failed(slice.attempt, e);
            return Registered::Refused(slice);
        }
        if !inf.window.admit(slice.len) {
            return Registered::Held(slice);
        }
        // Nothing is queued ahead of it on this connection any more.
        slice.going_out(now);
        inf.window.wrote(slice.len);
        inf.next_id = inf.next_id.wrapping_add(1);
        let id = inf.next_id;
        let header = slice.header(id, checksum);
        inf.slices.insert(id, slice);
        Registered::Frame(Frame {
            header,
            payload,
            written: 0,
        })
    }

    fn take(&self, id: u64) -> Option<Slice> {
        let mut inf = self.lock();
        inf.replies = inf.replies.wrapping_add(1);
        let slice = inf.slices.remove(&id);
        let wake = slice.as_ref().is_some_and(|s| inf.window.answered(s.len));
        drop(inf);
        if wake {
            self.work.notify_one();
        }
        slice
    }

    /// Sends slices of one submission for this connection, in order. When the connection
    /// is idle, this thread registers them and writes what the socket takes at once, in
    /// as few `writev` calls as it allows; the writer task finishes the rest. That is
    /// every submission of a polled task (its caller waits for it anyway, and one op in
    /// flight then waits for no other thread to start moving), and small ones of the
    /// Promise path (whose caller is a JS thread, which a long copy into the socket would
    /// block). Otherwise they are queued for the writer task.
    ///
    /// Only what the window has room for is written; the rest is queued for the writer
    /// task, which writes it as answers make room.
    ///
    /// Returns whether they had to wait behind others' frames (queued, still going out,
    /// or filling the window): the pool grows on that (`PeerPool::send_one`). A first
    /// request waiting only for the connection to be made is no such demand.
    pub(super) fn send(&self, slices: Slices) -> bool {
        let mut st = self.write_state();
        let idle = !st.writer_busy && !st.inline_busy && st.queue.is_empty() && !st.sealed;
        let mut waited = !idle;
        let small = slices.iter().all(|s| s.payload_len() <= INLINE_MAX)
            && slices.iter().map(Slice::payload_len).sum::<u64>() <= INLINE_BATCH_MAX;
        let polled = slices
            .first()
            .is_some_and(|s| s.task.observer() == Observer::Poll);
        let half = match &st.half {
            Some(h) if idle && (small || polled) => h.clone(),
            _ => {
                // A verified WRITE's checksum is taken by whoever writes its frame, right
                // before the copy into the socket, which then reads the payload from that
                // core's cache: taken here, on another core, it is a pass of its own.
                st.queue.extend(slices.into_iter().map(Queued::Fresh));
                drop(st);
                self.work.notify_one();
                return waited;
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
        let now = LazyNow::new();
        while let Some(slice) = rest.next() {
            match self.register(slice, &now) {
                Registered::Frame(f) => frames.push(f),
                Registered::Held(slice) => {
                    // The window is full: this one and the rest wait for answers to make
                    // room, written by the writer task.
                    waited = true;
                    unregistered.push_back(Queued::Fresh(slice));
                    unregistered.extend(rest.by_ref().map(Queued::Fresh));
                }
                Registered::Refused(slice) => {
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
            return waited;
        }
        drop(st);
        self.work.notify_one();
        waited
    }

    /// Shuts the open connection's socket down both ways: nothing more is written or
    /// answered on it. Done before what it holds is failed, so that work settles only
    /// once its connection is torn down (`fence`), as a loop connection's break does.
    pub(super) fn tear_down(&self) {
        if let Some(half) = &self.write_state().half {
            shut_down_both(half);
        }
    }

    /// Closes the connection's books and fails everything in flight with `error`.
    pub(super) fn fail_all(&self, error: &Error) {
        let drained: Vec<Slice> = {
            let mut inf = self.lock();
            inf.open = false;
            inf.window.clear();
            inf.slices.drain().map(|(_, s)| s).collect()
        };
        for s in drained {
            s.task.attempt_failed(s.attempt, error.clone());
        }
    }

    /// Fails every slice still queued.
    pub(super) fn fail_queued(&self, error: &Error) {
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

/// Shuts the socket under `half` down both ways (its descriptor stays open until the
/// halves drop).
fn shut_down_both(half: &OwnedWriteHalf) {
    let stream: &tokio::net::TcpStream = half.as_ref();
    // Fails only on a socket no longer connected: nothing is carried on it then either.
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Both);
}

/// Owns one data connection's life: connect on demand, run, fail what was in flight when
/// it breaks, and start again when more work arrives.
async fn conn_actor(
    conn: Arc<PoolConn>,
    shutdown: CancellationToken,
    local_engine_id: u64,
    timeouts: Timeouts,
) {
    let Timeouts {
        connect: connect_timeout,
        stuck_after,
    } = timeouts;
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
            c = connect_data(&addr, local_engine_id, connect_timeout) => c,
        };
        let (stream, remote_engine, keys) = match connected {
            Ok(connected) => connected,
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
        // Another incarnation than the one known: the peer restarted, and this connection
        // is the first to see it. Its slices fail as restarted (`register`), and the
        // engine moves the segment to the new incarnation.
        if let Some(answered) = &conn.answered {
            answered(&conn.peer, remote_engine);
        }
        let cancel = shutdown.child_token();
        *conn.current.lock().unwrap_or_else(|p| p.into_inner()) = cancel.clone();
        let (rd, wr) = stream.into_split();
        let half = Arc::new(wr);
        let (sealer, opener) = keys.map(SealKeys::split).unzip();
        let rd = SealedRead::new(BufReader::with_capacity(IO_BUFFER, rd), opener);
        {
            let mut inf = conn.lock();
            inf.open = true;
            inf.remote_engine = remote_engine;
        }
        {
            let mut st = conn.write_state();
            st.half = Some(half.clone());
            st.sealed = sealer.is_some();
        }
        let mut receiving = None;
        let (cause, stuck) = tokio::select! {
            _ = cancel.cancelled() => (Error::Closed, false),
            e = read_loop(&conn, rd, &mut receiving) => (e, false),
            e = write_loop(&conn, &half, sealer) => (e, false),
            e = watch_stall(&conn, stuck_after) => (e, true),
        };
        let error = conn.error_for_break(cause);
        tracing::debug!(peer = conn.peer.name(), error = %error, stuck, "data connection ended");
        // Torn down before what it holds fails: work settles only once its connection
        // can carry nothing more (`fence`).
        shut_down_both(&half);
        // The reader has stopped (its future is gone): the reply it was taking in, off the
        // books, fails with the connection now, not at its attempt deadline.
        if let Some(slice) = receiving.take() {
            slice.task.attempt_failed(slice.attempt, error.clone());
        }
        {
            let mut st = conn.write_state();
            st.half = None;
            st.writer_busy = false;
            // Partly written frames are registered: `fail_all` below fails them.
            st.queue.retain(|q| matches!(q, Queued::Fresh(_)));
        }
        conn.fail_all(&error);
        if stuck {
            // What waited behind a stuck connection has waited the deadline too: it
            // fails (and fails over) now rather than on a connection made afresh.
            conn.fail_queued(&error);
        }
    }
}

/// The deadlines a pool connection keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    /// Of connecting and the handshake.
    pub(super) connect: Duration,
    /// The attempt deadline: frames unanswered this long mean the connection is stuck.
    pub(super) stuck_after: Option<Duration>,
}

/// Ends (with `Timeout`) when the connection is stuck: frames outstanding and no reply for
/// `stuck_after` (`Stall`). Never, without it.
async fn watch_stall(conn: &PoolConn, stuck_after: Option<Duration>) -> Error {
    let Some(limit) = stuck_after else {
        return std::future::pending().await;
    };
    let mut stall = Stall::new(limit);
    let mut samples = tokio::time::interval(stall.period());
    samples.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        samples.tick().await;
        let (outstanding, replies) = {
            let inf = conn.lock();
            (!inf.slices.is_empty(), inf.replies)
        };
        if stall.sample(std::time::Instant::now(), outstanding, replies) {
            tracing::info!(
                peer = conn.peer.name(),
                limit_ms = limit.as_millis() as u64,
                "data connection stuck: no reply within the attempt deadline; failing what it holds"
            );
            return Error::Timeout;
        }
    }
}

/// Takes the next frames to write from the queue: the front item and, behind it, more
/// up to [`WRITER_BATCH`] frames and [`WRITER_BATCH_BYTES`] of payload, so that a queue
/// of small frames leaves in one `writev`; a frame not yet registered only while the
/// window has room. Marks the writer busy while it holds any.
fn next_batch(conn: &PoolConn) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut bytes = 0u64;
    let now = LazyNow::new();
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
                match conn.register(slice, &now) {
                    Registered::Frame(frame) => frame,
                    Registered::Held(slice) => {
                        // The window is full: it stays first in the queue (the writer is
                        // busy, so nothing went ahead of it) until answers make room.
                        let mut st = conn.write_state();
                        st.queue.push_front(Queued::Fresh(slice));
                        st.writer_busy = !frames.is_empty();
                        return frames;
                    }
                    Registered::Refused(slice) => {
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

/// Writes queued frames in order until the connection fails; sealed with `sealer` when
/// the connection is sealed.
async fn write_loop(conn: &PoolConn, half: &OwnedWriteHalf, mut sealer: Option<Sealer>) -> Error {
    let mut sealed = Vec::new();
    loop {
        let mut frames = next_batch(conn);
        if frames.is_empty() {
            conn.work.notified().await;
            continue;
        }
        if let Some(sealer) = sealer.as_mut() {
            if let Err(e) = write_sealed(half, sealer, &mut frames, &mut sealed).await {
                return e;
            }
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
        // A socket that keeps taking a long queue would keep this loop from waiting, and
        // with it the replies this task also reads: their tasks would look stuck (their
        // deadlines running, `Stall` seeing no reply) while their bytes had landed. One
        // turn after each batch lets the reader (and the stall watch) run.
        tokio::task::yield_now().await;
    }
}

/// Reads replies until the connection fails. A reply whose payload (or error text) is
/// still coming keeps its slice in `receiving`, off the connection's books (`fail_all`
/// no longer sees it, and must not: bytes may still land in it): when the connection
/// breaks and this future is dropped mid-reply, the actor fails that slice.
async fn read_loop(
    conn: &PoolConn,
    mut r: SealedRead<BufReader<OwnedReadHalf>>,
    receiving: &mut Option<Slice>,
) -> Error {
    loop {
        let header = match read_header_bytes(&mut r).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Error::Io("connection closed by peer".into()),
            Err(e) => {
                if matches!(e, Error::Protocol(_)) {
                    tracing::warn!(peer = conn.peer.name(), error = %e, "dropping data connection");
                }
                return e;
            }
        };
        if r.is_sealed() {
            if let Some(tampered) = tamper_notice(&header) {
                tracing::warn!(peer = conn.peer.name(), error = %tampered, "dropping data connection");
                return tampered;
            }
        }
        let (slice, reply) = match reply::decode(&header, |id| conn.take(id), Slice::asked) {
            Ok(decoded) => {
                conn.peer.heard_from(|| conn.lock().remote_engine);
                decoded
            }
            Err(broken) => {
                let error = Error::from(broken.violation);
                tracing::warn!(peer = conn.peer.name(), error = %error, "dropping data connection");
                if let Some(slice) = broken.request {
                    slice.task.attempt_failed(slice.attempt, error.clone());
                }
                return error;
            }
        };
        let slice = match reply {
            Reply::Written { checked } => {
                match reply::check_written(slice.verify(), checked) {
                    Ok(()) => slice.task.slice_done(slice.attempt, slice.len),
                    Err(e) => slice.task.attempt_failed(slice.attempt, e),
                }
                continue;
            }
            Reply::Read { .. } | Reply::Refused { .. } => receiving.insert(slice),
        };
        // Until the payload is in, the slice stays in `receiving`: `Ok(None)` when it
        // landed, `Ok(Some(refusal))` when the target refused it, `Err` when the
        // connection failed under it.
        let outcome = match reply {
            Reply::Written { .. } => Ok(None),
            Reply::Read { checksum, .. } => match slice.destination() {
                Err(e) => Err(e),
                Ok(mut dst) => match receive_read(&mut r, dst.as_mut_slice(), slice.verify()).await
                {
                    Ok(landed) => Ok(reply::check_read(slice.verify(), checksum, &landed).err()),
                    Err(e) => Err(Error::io("receive READ payload", &e)),
                },
            },
            Reply::Refused { code, text_len } => {
                let mut text = vec![0u8; text_len];
                match r.read_exact(&mut text).await {
                    Ok(_) => Ok(Some(reply::refusal(code, &text))),
                    Err(e) => Err(Error::io("receive error text", &e)),
                }
            }
        };
        let Some(slice) = receiving.take() else {
            continue;
        };
        match outcome {
            Ok(None) => slice.task.slice_done(slice.attempt, slice.len),
            Ok(Some(refusal)) => slice.task.attempt_failed(slice.attempt, refusal),
            Err(e) => {
                slice.task.attempt_failed(slice.attempt, e.clone());
                return e;
            }
        }
    }
}

/// Reads a READ reply's payload into `dst`, the slice's destination, and the CRC32C of
/// what landed when it is `verified` (taken as it arrives: `read_checksummed`).
async fn receive_read<R: AsyncReadExt + Unpin>(
    r: &mut R,
    dst: &mut [u8],
    verified: bool,
) -> std::io::Result<Running> {
    if verified {
        return read_checksummed(r, dst).await;
    }
    r.read_exact(dst).await?;
    Ok(Running::new())
}
