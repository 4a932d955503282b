//! The sender's side: one outbox per peer, an actor that owns that peer's notification
//! connection. Notifications leave in the order they were handed over and are kept until
//! the target acknowledges them; a connection that breaks is replaced and whatever was not
//! acknowledged is sent again with its sequence number, which the target's inbox uses to
//! take each once. Every notification ends: acknowledged, refused, the peer lost or
//! closed, or its deadline passed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::inbox::NotifyOutcome;
use crate::error::{Error, Result};
use crate::metrics::NotifyCounters;
use crate::net::{connect, read_frame, write_frame};
use crate::segment::Peer;
use crate::wire::{ConnKind, Header, Op, RejectCode};

/// First and largest pause between failed connects.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// What an outbox needs to know about this engine.
#[derive(Clone)]
pub(crate) struct OutboxConfig {
    pub(crate) engine_id: u64,
    pub(crate) name: String,
    pub(crate) connect_timeout: Duration,
    /// How long a notification may wait for its ack, reconnects included.
    pub(crate) deadline: Duration,
}

/// What the ack reader hands over: a frame, the end of the stream, or why it broke.
type Read = Result<Option<(Header, Vec<u8>)>>;

/// A notification on its way, and who waits for its outcome.
struct Outgoing {
    seq: u64,
    data: Arc<[u8]>,
    /// Bytes of the call it rides on.
    bytes: u64,
    deadline: Instant,
    done: oneshot::Sender<Result<NotifyOutcome>>,
}

impl Outgoing {
    fn end(self, r: Result<NotifyOutcome>) {
        let _ = self.done.send(r);
    }
}

/// The outboxes of one engine, and the sequence numbers they share: one counter for every
/// notification this engine sends, so numbers only grow towards any target, even across a
/// segment closed and opened again.
pub(crate) struct Notifier {
    config: OutboxConfig,
    seq: AtomicU64,
    counters: Arc<NotifyCounters>,
    outboxes: Mutex<HashMap<u64, mpsc::UnboundedSender<Outgoing>>>,
    shutdown: CancellationToken,
}

impl Notifier {
    pub(crate) fn new(
        config: OutboxConfig,
        counters: Arc<NotifyCounters>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            config,
            seq: AtomicU64::new(0),
            counters,
            outboxes: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    /// Hands `data` to `peer`'s outbox (started on `rt` if it has none); the receiver gets
    /// the outcome.
    pub(crate) fn send(
        &self,
        rt: &Handle,
        peer: &Arc<Peer>,
        data: Arc<[u8]>,
        bytes: u64,
    ) -> oneshot::Receiver<Result<NotifyOutcome>> {
        let (done, outcome) = oneshot::channel();
        let mut boxes = self.outboxes.lock().unwrap_or_else(|p| p.into_inner());
        // Numbered (and given its deadline) under the lock it is queued under: callers on
        // several threads must not queue a number below one already queued, or the target
        // takes it for a resend (DUPLICATE, not queued) and `expire`'s deadline order breaks.
        let mut item = Outgoing {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            data,
            bytes,
            deadline: Instant::now() + self.config.deadline,
            done,
        };
        if let Some(tx) = boxes.get(&peer.handle()) {
            match tx.send(item) {
                Ok(()) => {
                    self.counters.sent.fetch_add(1, Ordering::Relaxed);
                    return outcome;
                }
                Err(mpsc::error::SendError(back)) => item = back,
            }
        }
        if peer.link_cancel.is_cancelled() || self.shutdown.is_cancelled() {
            item.end(Err(Error::Closed));
            return outcome;
        }
        // Outboxes of closed segments have ended: forget them here.
        boxes.retain(|_, tx| !tx.is_closed());
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(item);
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        boxes.insert(peer.handle(), tx);
        rt.spawn(run(
            peer.clone(),
            rx,
            self.config.clone(),
            self.shutdown.clone(),
        ));
        outcome
    }
}

/// Why an outbox stopped waiting.
enum Stop {
    /// The segment was closed or the engine is closing.
    Cancelled,
}

/// The outbox actor of one peer.
async fn run(
    peer: Arc<Peer>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    cfg: OutboxConfig,
    shutdown: CancellationToken,
) {
    let mut unacked: VecDeque<Outgoing> = VecDeque::new();
    let mut backoff = BACKOFF.0;
    let cancelled = || peer.link_cancel.is_cancelled() || shutdown.is_cancelled();
    loop {
        if unacked.is_empty() {
            tokio::select! {
                _ = peer.link_cancel.cancelled() => break,
                _ = shutdown.cancelled() => break,
                got = rx.recv() => match got {
                    Some(o) => unacked.push_back(o),
                    None => break,
                },
            }
        }
        if peer.is_lost() {
            fail_all(&mut unacked, &peer.lost_error());
            continue;
        }
        let last_error = match connected(&peer, &cfg, &mut unacked, &mut rx, &shutdown).await {
            Ok(Stop::Cancelled) => break,
            Err(e) => e,
        };
        if cancelled() {
            break;
        }
        // The connection failed or broke: wait a little (never past the oldest deadline),
        // then try again with what is still unacknowledged.
        expire(&mut unacked, &last_error);
        if let Some(front) = unacked.front() {
            let until = (Instant::now() + backoff).min(front.deadline);
            tokio::select! {
                _ = peer.link_cancel.cancelled() => break,
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(until) => {}
            }
            expire(&mut unacked, &last_error);
            backoff = (backoff * 2).min(BACKOFF.1);
        }
    }
    let closed = if peer.is_lost() {
        peer.lost_error()
    } else {
        Error::Closed
    };
    rx.close();
    while let Ok(o) = rx.try_recv() {
        unacked.push_back(o);
    }
    fail_all(&mut unacked, &closed);
}

/// Connects, sends what is unacknowledged, then sends and acknowledges until the
/// connection breaks (the error) or the outbox is cancelled.
async fn connected(
    peer: &Arc<Peer>,
    cfg: &OutboxConfig,
    unacked: &mut VecDeque<Outgoing>,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    shutdown: &CancellationToken,
) -> Result<Stop> {
    let stream = tokio::select! {
        _ = peer.link_cancel.cancelled() => return Ok(Stop::Cancelled),
        _ = shutdown.cancelled() => return Ok(Stop::Cancelled),
        s = open(peer, cfg) => s?,
    };
    let (mut rd, mut wr) = stream.into_split();
    // Acks are read by their own task, so that a send never interrupts a half-read frame.
    let (tx, mut acks) = mpsc::channel::<Read>(64);
    let reader = tokio::spawn(async move {
        loop {
            let got = read_frame(&mut rd).await;
            let end = !matches!(got, Ok(Some(_)));
            if tx.send(got).await.is_err() || end {
                return;
            }
        }
    });
    let _abort = AbortOnDrop(reader);
    for o in unacked.iter() {
        send_one(&mut wr, o).await?;
    }
    loop {
        let front_deadline = unacked.front().map(|o| o.deadline);
        tokio::select! {
            _ = peer.link_cancel.cancelled() => return Ok(Stop::Cancelled),
            _ = shutdown.cancelled() => return Ok(Stop::Cancelled),
            got = rx.recv() => match got {
                Some(o) => {
                    unacked.push_back(o);
                    if let Some(o) = unacked.back() {
                        send_one(&mut wr, o).await?;
                    }
                }
                None => return Ok(Stop::Cancelled),
            },
            got = acks.recv() => acknowledge(unacked, got)?,
            _ = sleep_until_opt(front_deadline) => {
                return Err(Error::Timeout);
            }
        }
    }
}

/// Applies one frame read from the target to the oldest unacknowledged notification.
fn acknowledge(unacked: &mut VecDeque<Outgoing>, got: Option<Read>) -> Result<()> {
    let (h, body) = match got {
        Some(Ok(Some(frame))) => frame,
        Some(Err(e)) => return Err(e),
        Some(Ok(None)) | None => return Err(Error::Io("notification connection closed".into())),
    };
    let Some(front) = unacked.front() else {
        return Err(Error::Protocol(format!(
            "{:?} for notification {} that was not sent",
            h.op, h.request_id
        )));
    };
    if front.seq != h.request_id {
        return Err(Error::Protocol(format!(
            "ack of notification {} while {} was the oldest sent",
            h.request_id, front.seq
        )));
    }
    let outcome = match h.op {
        Op::NotifyAck => Ok(NotifyOutcome::from_raw(h.flags)),
        Op::Error => Err(Error::RemoteRejected(format!(
            "{:?}: {}",
            RejectCode::from_raw(h.flags),
            String::from_utf8_lossy(&body)
        ))),
        other => {
            return Err(Error::Protocol(format!(
                "{other:?} on a notification connection"
            )))
        }
    };
    if let Some(o) = unacked.pop_front() {
        o.end(outcome);
    }
    Ok(())
}

/// A connection to the peer's listener that has named this engine.
async fn open(peer: &Peer, cfg: &OutboxConfig) -> Result<TcpStream> {
    let (mut stream, _) = connect(
        &peer.addr(),
        ConnKind::Notify,
        cfg.engine_id,
        cfg.connect_timeout,
    )
    .await?;
    let mut hello = Header::new(Op::NotifyOpen);
    hello.length = cfg.name.len() as u64;
    write_frame(&mut stream, &hello, cfg.name.as_bytes()).await?;
    Ok(stream)
}

async fn send_one(wr: &mut OwnedWriteHalf, o: &Outgoing) -> Result<()> {
    let mut h = Header::new(Op::Notify);
    h.request_id = o.seq;
    h.offset = o.bytes;
    h.length = o.data.len() as u64;
    // A target that stops reading must not hold the outbox past the deadline.
    tokio::time::timeout_at(o.deadline, write_frame(wr, &h, &o.data))
        .await
        .map_err(|_| Error::Timeout)?
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Fails the notifications whose deadline passed (oldest first: deadlines only grow).
fn expire(unacked: &mut VecDeque<Outgoing>, why: &Error) {
    let now = Instant::now();
    while unacked.front().is_some_and(|o| o.deadline <= now) {
        if let Some(o) = unacked.pop_front() {
            o.end(Err(why.clone()));
        }
    }
}

fn fail_all(unacked: &mut VecDeque<Outgoing>, why: &Error) {
    for o in unacked.drain(..) {
        o.end(Err(why.clone()));
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
