//! The TCP transport, initiator side. Per peer, a small pool of data connections; each
//! connection is an actor that connects on demand (with backoff after failures), writes
//! slices straight from registered memory, and reads WRITE acks and READ payloads straight
//! into registered memory. Many slices are in flight per connection. A reset, an EOF or a
//! protocol violation fails every in-flight slice on that connection at once.
//!
//! The serving side lives in `server.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::memory::Region;
use crate::net::{connect, read_header, write_all_pair};
use crate::request::Opcode;
use crate::segment::Peer;
use crate::task::Task;
use crate::transport::{Transport, TransportKind};
use crate::wire::{ConnKind, Header, Op, RejectCode, Token, HEADER_LEN, MAX_DATA_PAYLOAD};

const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
const IO_BUFFER: usize = 64 << 10;

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
            slice_size: 1 << 20,
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// One slice of a task, in a connection's queue or in flight.
struct Slice {
    task: Arc<Task>,
    opcode: Opcode,
    region: Arc<Region>,
    local_offset: u64,
    buffer: u64,
    remote_offset: u64,
    len: u64,
    token: Token,
}

#[derive(Default)]
struct Inflight {
    open: bool,
    next_id: u64,
    slices: HashMap<u64, Slice>,
}

struct DataConn {
    peer: Arc<Peer>,
    tx: mpsc::UnboundedSender<Slice>,
    inflight: Mutex<Inflight>,
    current: Mutex<CancellationToken>,
}

impl DataConn {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a slice for sending; hands it back if the connection is closing.
    fn register(&self, slice: Slice) -> std::result::Result<u64, Slice> {
        let mut inf = self.lock();
        if !inf.open {
            return Err(slice);
        }
        inf.next_id = inf.next_id.wrapping_add(1);
        let id = inf.next_id;
        inf.slices.insert(id, slice);
        Ok(id)
    }

    fn take(&self, id: u64) -> Option<Slice> {
        self.lock().slices.remove(&id)
    }

    /// Closes the connection's books and fails everything in flight with `error`.
    fn fail_all(&self, error: &Error) {
        let drained: Vec<Slice> = {
            let mut inf = self.lock();
            inf.open = false;
            inf.slices.drain().map(|(_, s)| s).collect()
        };
        for s in drained {
            s.task.fail(error.clone());
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

/// The TCP transport.
pub struct TcpTransport {
    rt: Handle,
    local_engine_id: u64,
    config: TcpConfig,
    pools: Mutex<HashMap<u64, Arc<PeerPool>>>,
    shutdown: CancellationToken,
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
        Self {
            rt,
            local_engine_id,
            config,
            pools: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    fn pool(&self, peer: &Arc<Peer>) -> Arc<PeerPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(peer.handle())
            .or_insert_with(|| {
                let conns = (0..self.config.connections_per_peer)
                    .map(|_| {
                        let (tx, rx) = mpsc::unbounded_channel();
                        let conn = Arc::new(DataConn {
                            peer: peer.clone(),
                            tx,
                            inflight: Mutex::new(Inflight::default()),
                            current: Mutex::new(CancellationToken::new()),
                        });
                        let actor = conn_actor(
                            conn.clone(),
                            rx,
                            self.shutdown.clone(),
                            self.local_engine_id,
                            self.config.connect_timeout,
                        );
                        self.rt.spawn(actor);
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

    fn submit_one(&self, task: &Arc<Task>) -> Result<()> {
        if self.shutdown.is_cancelled() {
            return Err(Error::Closed);
        }
        let req = task.request();
        if req.peer.is_lost() {
            return Err(req.peer.lost_error());
        }
        let token = req.descriptor.token_bytes()?;
        let pool = self.pool(&req.peer);
        let slice_size = self.config.slice_size;
        let count = req.length.div_ceil(slice_size);
        let count = u32::try_from(count).map_err(|_| {
            Error::InvalidArgument(format!(
                "request of {} bytes has too many slices",
                req.length
            ))
        })?;
        if !task.begin_attempt(TransportKind::Tcp, count) {
            return Ok(()); // already terminal (canceled): nothing to send
        }
        let mut offset = 0;
        while offset < req.length {
            let len = slice_size.min(req.length - offset);
            let slice = Slice {
                task: task.clone(),
                opcode: req.opcode,
                region: req.local.clone(),
                local_offset: req.local_offset + offset,
                buffer: req.remote_buffer,
                remote_offset: req.remote_offset + offset,
                len,
                token,
            };
            let n = pool.next.fetch_add(1, Ordering::Relaxed) % pool.conns.len();
            if let Err(mpsc::error::SendError(slice)) = pool.conns[n].tx.send(slice) {
                slice.task.fail(Error::Closed);
                break;
            }
            offset += len;
        }
        Ok(())
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn submit(&self, tasks: &[Arc<Task>]) -> Vec<Result<()>> {
        tasks.iter().map(|t| self.submit_one(t)).collect()
    }

    fn fail_peer(&self, peer: &Peer, error: Error) {
        let pool = {
            let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            pools.get(&peer.handle()).cloned()
        };
        if let Some(pool) = pool {
            for conn in &pool.conns {
                conn.fail_all(&error);
                conn.current
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cancel();
            }
        }
    }

    fn shutdown(&self) {
        self.shutdown.cancel();
        let pools: Vec<_> = {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            pools.drain().map(|(_, p)| p).collect()
        };
        for pool in pools {
            for conn in &pool.conns {
                conn.fail_all(&Error::Closed);
            }
        }
    }
}

impl TcpTransport {
    /// Drops the pool of a closed segment, failing its in-flight work.
    pub fn forget_peer(&self, peer: &Peer, error: Error) {
        self.fail_peer(peer, error);
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = pools.remove(&peer.handle()) {
            for conn in &pool.conns {
                conn.current
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cancel();
            }
        }
    }
}

fn fail_queued(rx: &mut mpsc::UnboundedReceiver<Slice>, first: Slice, error: &Error) {
    first.task.fail(error.clone());
    while let Ok(s) = rx.try_recv() {
        s.task.fail(error.clone());
    }
}

/// Owns one data connection's life: connect on demand, run, fail what was in flight when
/// it breaks, and start again for the next slice.
async fn conn_actor(
    conn: Arc<DataConn>,
    mut rx: mpsc::UnboundedReceiver<Slice>,
    shutdown: CancellationToken,
    local_engine_id: u64,
    connect_timeout: Duration,
) {
    let mut backoff = BACKOFF_START;
    let mut retry_at: Option<(Instant, Error)> = None;
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            s = rx.recv() => match s { Some(s) => s, None => return },
        };
        if conn.peer.is_lost() {
            fail_queued(&mut rx, first, &conn.peer.lost_error());
            continue;
        }
        if let Some((at, err)) = &retry_at {
            if Instant::now() < *at {
                fail_queued(&mut rx, first, err);
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
                fail_queued(&mut rx, first, &e);
                retry_at = Some((Instant::now() + backoff, e));
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_START;
        retry_at = None;
        let cancel = shutdown.child_token();
        *conn.current.lock().unwrap_or_else(|p| p.into_inner()) = cancel.clone();
        conn.lock().open = true;
        let (rd, wr) = stream.into_split();
        let cause = tokio::select! {
            _ = cancel.cancelled() => Error::Closed,
            e = read_loop(&conn, BufReader::with_capacity(IO_BUFFER, rd)) => e,
            e = write_loop(&conn, BufWriter::with_capacity(IO_BUFFER, wr), first, &mut rx) => e,
        };
        let error = conn.error_for_break(cause);
        tracing::debug!(peer = conn.peer.name(), error = %error, "data connection ended");
        conn.fail_all(&error);
    }
}

async fn write_loop(
    conn: &DataConn,
    mut w: BufWriter<OwnedWriteHalf>,
    first: Slice,
    rx: &mut mpsc::UnboundedReceiver<Slice>,
) -> Error {
    let mut next = Some(first);
    loop {
        let slice = match next.take() {
            Some(s) => s,
            None => match rx.try_recv() {
                Ok(s) => s,
                Err(mpsc::error::TryRecvError::Empty) => {
                    if let Err(e) = w.flush().await {
                        return Error::io("send", &e);
                    }
                    match rx.recv().await {
                        Some(s) => s,
                        None => return Error::Closed,
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return Error::Closed,
            },
        };
        if slice.task.status().is_terminal() {
            continue; // canceled or failed elsewhere: do not spend bandwidth on it
        }
        let mut h = Header::new(match slice.opcode {
            Opcode::Write => Op::WriteReq,
            Opcode::Read => Op::ReadReq,
        });
        h.buffer_id = slice.buffer;
        h.offset = slice.remote_offset;
        h.length = slice.len;
        h.token = slice.token;
        // Keep the region alive locally: a misbehaving peer could ack before we finish.
        let region = slice.region.clone();
        let (opcode, local_offset, len) = (slice.opcode, slice.local_offset, slice.len);
        let id = match conn.register(slice) {
            Ok(id) => id,
            Err(slice) => {
                slice
                    .task
                    .fail(conn.error_for_break(Error::Io("connection closing".into())));
                continue;
            }
        };
        h.request_id = id;
        let payload: &[u8] = if opcode == Opcode::Write {
            let ptr = match region.range_ptr(local_offset, len) {
                Ok(p) => p,
                Err(e) => return e,
            };
            // SAFETY: the range was validated against this region at submit and again by
            // `range_ptr`; `region` (held above) keeps the memory mapped across the await.
            unsafe { std::slice::from_raw_parts(ptr, len as usize) }
        } else {
            &[]
        };
        if let Err(e) = write_all_pair(&mut w, &h.encode(), payload).await {
            return Error::io("send", &e);
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
            (Op::WriteAck, Opcode::Write) => slice.task.slice_done(slice.len),
            (Op::ReadResp, Opcode::Read) if h.length == slice.len => {
                let ptr = match slice.region.range_ptr(slice.local_offset, slice.len) {
                    Ok(p) => p,
                    Err(e) => {
                        slice.task.fail(e.clone());
                        return e;
                    }
                };
                // SAFETY: the destination range was validated inside `slice.region`, which
                // the slice keeps alive; the length equals the slice length (checked above).
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr, slice.len as usize) };
                if let Err(e) = r.read_exact(dst).await {
                    let err = Error::io("receive READ payload", &e);
                    slice.task.fail(err.clone());
                    return err;
                }
                slice.task.slice_done(slice.len);
            }
            (Op::Error, _) => {
                let mut text = vec![0u8; h.length.min(HEADER_LEN as u64 * 100) as usize];
                if let Err(e) = r.read_exact(&mut text).await {
                    let err = Error::io("receive error text", &e);
                    slice.task.fail(err.clone());
                    return err;
                }
                let code = RejectCode::from_raw(h.flags);
                slice.task.fail(Error::RemoteRejected(format!(
                    "{code:?}: {}",
                    String::from_utf8_lossy(&text)
                )));
            }
            (op, expected) => {
                let err = Error::Protocol(format!(
                    "{op:?} (len {}) in reply to a {expected:?}",
                    h.length
                ));
                slice.task.fail(err.clone());
                return err;
            }
        }
    }
}
