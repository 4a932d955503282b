//! Data connections watched by the submitting thread's event loop (`crate::event_loop`):
//! one per peer and thread, for small requests of the Promise path from a JS thread.
//!
//! On a connection of the pool (`pool_conn`) a reply wakes an I/O thread, which reads it and
//! then wakes the JS thread: two sleeps and wake-ups on this side of a round trip. Here the
//! JS thread writes the request and its own event loop watches the socket, so the reply
//! wakes the thread that waits for it, which reads it into registered memory itself: one.
//! On a busy machine each wake-up costs a context switch or a preemption, which is most of a
//! 4 KiB request's time. Large requests, polled ones and threads without a loop keep to
//! the pool, whose I/O threads keep the copying off the JS thread.
//!
//! A thread connects to a peer once it has sent it a few small requests through the pool
//! (`LOOP_AFTER`): one that asks a peer now and then costs no connection of its own.
//! The connection is made and authenticated by an I/O thread (the same handshake as the
//! pool's); until it is ready, and while it backs off after a failure, requests take the
//! pool. Only the loop's thread reads and writes the socket. Another thread may break the
//! connection (`fail_peer`, `shutdown`): it fails what is in flight and shuts the socket
//! down, and the loop, woken by the end of the stream, lets go of it.
//!
//! This module is the thread's side: which connection a request takes, connecting one,
//! and the registry other threads break them through. One connection is `loop_conn`.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::runtime::Handle;

use super::loop_conn::{Key, LoopConn, Readiness};
use super::request::Slice;
use crate::error::{Error, Result};
use crate::event_loop::watch::{self as event_loop, Interest, Watch};
use crate::net::connect_data;
use crate::seal::SealKeys;
use crate::segment::Peer;
use crate::transport::AnsweredHook;

/// Largest payload (either way) a request may have to take a loop connection: the JS
/// thread copies it.
pub(super) const LOOP_MAX: u64 = 64 << 10;
/// How long requests take the pool after a connection failed or broke.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Small awaited requests a thread sends a peer through the pool before it makes a loop
/// connection of its own: a thread that talks to a peer now and then (as each of many
/// engines opening each other does) costs that peer no descriptor on either side.
const LOOP_AFTER: u32 = 4;

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

/// Where an I/O thread puts the stream it connected (or why it could not): a connection
/// made for the loop, with the peer incarnation it reached and its keys when sealed.
type Landing = Mutex<Option<Result<(std::net::TcpStream, u64, Option<SealKeys>)>>>;

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
            if peer.is_none_or(|p| c.peer_handle() == p) {
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
    /// Hears which incarnation of the peer each connection reached (`None` for a
    /// transport built outside an engine).
    pub answered: Option<AnsweredHook>,
}

/// A thread's connection to one peer, in whatever state it is.
#[derive(Default)]
struct Entry {
    conn: Option<(Arc<LoopConn>, Box<dyn Watch>)>,
    /// An I/O thread is connecting; the stream (or why not) lands here.
    connecting: Option<Arc<Landing>>,
    /// Requests take the pool until then.
    retry_at: Option<Instant>,
    /// Requests this thread sent the peer through the pool before connecting
    /// (up to [`LOOP_AFTER`]).
    pooled: u32,
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
                Some(Ok((stream, remote_engine, keys))) => {
                    entry.connecting = None;
                    let conn = Arc::new(LoopConn::new(key, forget, peer.clone(), stream, keys));
                    conn.set_remote_engine(remote_engine);
                    match event_loop.watch(conn.fd(), conn.clone()) {
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
        if entry.pooled < LOOP_AFTER {
            entry.pooled += 1;
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
    let (answered, peer) = (lanes.answered.clone(), peer.clone());
    lanes.rt.spawn(async move {
        // Sealed by the rule every connection follows (`connect_data`): to a peer that
        // requires it, this thread's requests go sealed, as on the pool.
        let stream = connect_data(&addr, engine_id, timeout)
            .await
            .inspect(|(_, remote, _)| {
                if let Some(answered) = &answered {
                    answered(&peer, *remote);
                }
            })
            .and_then(|(s, remote, keys)| {
                let s = s.into_std().map_err(|e| Error::io("loop connection", &e))?;
                s.set_nonblocking(true)
                    .map_err(|e| Error::io("loop connection", &e))?;
                Ok((s, remote, keys))
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
        if let Some(entry) = entries.0.get_mut(&conn.key()) {
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
