//! The sender's side: one outbox per peer, an actor that sends on that peer's link (or on
//! a notification connection of its own: `path`). Notifications leave in the order they were handed over and are kept until
//! the target acknowledges them; a connection that breaks is replaced and whatever was not
//! acknowledged is sent again with its sequence number, which the target's inbox uses to
//! take each once. Every notification ends: acknowledged, refused, the peer lost or
//! closed, or its deadline passed.
//!
//! Each notification is bound to the receiver incarnation its data went to (`target`, the
//! engine id of the descriptor its call was planned against). The outbox keeps one session
//! per receiver incarnation (a random token, numbers from 1) and sends a notification only
//! on a connection to that incarnation: when the peer's address answers with another
//! engine id (it restarted), the notifications bound to the old one end refused
//! (`ERR_FERRY_NOTIFY_REFUSED`) instead of reaching an instance that never got their data;
//! the target checks the same (`NotifyOpen` names the incarnation planned for). At most
//! `window::WINDOW` notifications are unacknowledged at once, the window the target accepts.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::outcome::NotifyOutcome;
use super::path::{reach, sleep_until_opt, Path, Wire};
use super::protocol::{restarted, Answer, Open};
use super::sessions::SessionToken;
use super::window::WINDOW;
use crate::error::{Error, Result};
use crate::link_port::Read;
use crate::metrics::NotifyCounters;
use crate::segment::Peer;
use crate::wire::{Header, Op, RejectCode};

/// First and largest pause between failed connects.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// The pause before the next connect after a failure: doubling up to a cap, and back to
/// the first once a connection was accepted, so that a peer that restarts often is not
/// reached later each time.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self { next: BACKOFF.0 }
    }

    /// The pause after a failure.
    fn failed(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(BACKOFF.1);
        pause
    }

    /// A connection was accepted.
    fn succeeded(&mut self) {
        self.next = BACKOFF.0;
    }
}

/// What an outbox needs to know about this engine.
#[derive(Clone)]
pub(crate) struct OutboxConfig {
    pub(crate) engine_id: u64,
    pub(crate) name: String,
    pub(crate) connect_timeout: Duration,
    /// How long a notification may wait for its ack, reconnects included.
    pub(crate) deadline: Duration,
}

/// A notification on its way, and who waits for its outcome.
struct Outgoing {
    /// The receiver incarnation its data went to: no other may take it.
    target: u64,
    /// Its number in the session with `target`, given when first sent (0 before).
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

/// The outboxes of one engine.
pub(crate) struct Notifier {
    config: OutboxConfig,
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
            counters,
            outboxes: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    /// Hands `data` to `peer`'s outbox (started on `rt` if it has none), for receiver
    /// incarnation `target` only; the receiver gets the outcome.
    pub(crate) fn send(
        &self,
        rt: &Handle,
        peer: &Arc<Peer>,
        target: u64,
        data: Arc<[u8]>,
        bytes: u64,
    ) -> oneshot::Receiver<Result<NotifyOutcome>> {
        let (done, outcome) = oneshot::channel();
        let mut boxes = self.outboxes.lock().unwrap_or_else(|p| p.into_inner());
        // Given its deadline under the lock it is queued under: callers on several threads
        // must not queue a deadline below one already queued, or `expire`'s order breaks.
        let mut item = Outgoing {
            target,
            seq: 0,
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
        rt.spawn(run(Outbox {
            peer: peer.clone(),
            cfg: self.config.clone(),
            shutdown: self.shutdown.clone(),
            rx,
            waiting: VecDeque::new(),
            unacked: VecDeque::new(),
            session: None,
            backoff: Backoff::new(),
        }));
        outcome
    }
}

/// Why a connection's loop ended without an error.
enum Stop {
    /// The segment was closed or the engine is closing.
    Cancelled,
    /// The next notification is bound to another incarnation than the one connected, and
    /// nothing is unacknowledged: connect again (at once) to whoever answers now.
    Rebind,
}

/// A session with one receiver incarnation.
struct Session {
    receiver: u64,
    token: SessionToken,
    /// The number of the next notification sent in it.
    next: u64,
}

/// The outbox actor of one peer, and what it holds.
struct Outbox {
    peer: Arc<Peer>,
    cfg: OutboxConfig,
    shutdown: CancellationToken,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    /// Handed over, not sent yet, in order.
    waiting: VecDeque<Outgoing>,
    /// Sent in `session`, not answered yet, in order; at most `WINDOW`.
    unacked: VecDeque<Outgoing>,
    session: Option<Session>,
    backoff: Backoff,
}

async fn run(mut ob: Outbox) {
    let peer = ob.peer.clone();
    let shutdown = ob.shutdown.clone();
    let cancelled = || peer.link_cancel.is_cancelled() || shutdown.is_cancelled();
    loop {
        if ob.waiting.is_empty() && ob.unacked.is_empty() {
            tokio::select! {
                _ = peer.link_cancel.cancelled() => break,
                _ = shutdown.cancelled() => break,
                got = ob.rx.recv() => match got {
                    Some(o) => ob.waiting.push_back(o),
                    None => break,
                },
            }
        }
        if peer.is_lost() {
            ob.fail_all(&peer.lost_error());
            continue;
        }
        let last_error = match ob.connected().await {
            Ok(Stop::Cancelled) => break,
            Ok(Stop::Rebind) => continue,
            Err(e) => e,
        };
        if cancelled() {
            break;
        }
        // The connection failed or broke: wait a little (never past the oldest deadline),
        // then try again with what is still unacknowledged.
        ob.expire(&last_error);
        if let Some(oldest) = ob.oldest_deadline() {
            let until = (Instant::now() + ob.backoff.failed()).min(oldest);
            tokio::select! {
                _ = peer.link_cancel.cancelled() => break,
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(until) => {}
            }
            ob.expire(&last_error);
        }
    }
    let closed = if peer.is_lost() {
        peer.lost_error()
    } else {
        Error::Closed
    };
    ob.rx.close();
    while let Ok(o) = ob.rx.try_recv() {
        ob.waiting.push_back(o);
    }
    ob.fail_all(&closed);
}

impl Outbox {
    /// Connects, opens the session with whichever incarnation answers, sends what is
    /// unacknowledged, then sends and acknowledges until the connection breaks (the
    /// error), the outbox is cancelled, or the next notification is bound elsewhere.
    async fn connected(&mut self) -> Result<Stop> {
        let until = self.oldest_deadline();
        let path = tokio::select! {
            _ = self.peer.link_cancel.cancelled() => return Ok(Stop::Cancelled),
            _ = self.shutdown.cancelled() => return Ok(Stop::Cancelled),
            p = reach(&self.peer, self.cfg.engine_id, self.cfg.connect_timeout, until) => p?,
        };
        let Path {
            receiver,
            wire: mut wr,
            mut answers,
            ..
        } = path;
        self.refuse_other_than(receiver);
        if !self.open(&mut answers, &mut wr, receiver).await? {
            // The target says it is not the incarnation its handshake named: nothing bound
            // to that one may go.
            let why = Error::NotifyRefused(format!(
                "{} refused the session as not being engine {receiver}",
                self.peer.name()
            ));
            self.session = None;
            for o in self.unacked.drain(..) {
                o.end(Err(why.clone()));
            }
            while self.waiting.front().is_some_and(|o| o.target == receiver) {
                if let Some(o) = self.waiting.pop_front() {
                    o.end(Err(why.clone()));
                }
            }
            return Ok(Stop::Rebind);
        }
        self.backoff.succeeded();
        for o in self.unacked.iter() {
            send_one(&mut wr, o).await?;
        }
        loop {
            self.send_waiting(&mut wr, receiver).await?;
            if self.unacked.is_empty() && !self.waiting.is_empty() {
                return Ok(Stop::Rebind);
            }
            let oldest = self.oldest_deadline();
            tokio::select! {
                _ = self.peer.link_cancel.cancelled() => return Ok(Stop::Cancelled),
                _ = self.shutdown.cancelled() => return Ok(Stop::Cancelled),
                got = self.rx.recv() => match got {
                    Some(o) => self.waiting.push_back(o),
                    None => return Ok(Stop::Cancelled),
                },
                got = answers.recv() => self.acknowledge(got)?,
                _ = sleep_until_opt(oldest) => {
                    return Err(Error::Timeout);
                }
            }
        }
    }

    /// Ends, refused, what cannot go to incarnation `receiver`: everything unacknowledged
    /// in a session with another one, and the waiting notifications bound elsewhere at
    /// the front of the queue (later ones get their turn when they reach it).
    fn refuse_other_than(&mut self, receiver: u64) {
        if let Some(s) = self.session.as_ref().filter(|s| s.receiver != receiver) {
            let planned = s.receiver;
            for o in self.unacked.drain(..) {
                o.end(Err(restarted(self.peer.name(), planned, receiver)));
            }
            self.session = None;
        }
        while self.waiting.front().is_some_and(|o| o.target != receiver) {
            if let Some(o) = self.waiting.pop_front() {
                let e = restarted(self.peer.name(), o.target, receiver);
                o.end(Err(e));
            }
        }
    }

    /// Opens (or resumes) the session with `receiver` on a new connection; false if the
    /// target refused it as another incarnation.
    async fn open(
        &mut self,
        answers: &mut mpsc::Receiver<Read>,
        wr: &mut Wire,
        receiver: u64,
    ) -> Result<bool> {
        if self.session.is_none() {
            self.session = Some(Session {
                receiver,
                token: crate::auth::nonce()?,
                next: 1,
            });
        }
        let Some(session) = self.session.as_ref() else {
            return Err(Error::Closed);
        };
        let open = Open {
            receiver,
            token: session.token,
            first: self.unacked.front().map_or(session.next, |o| o.seq),
            name: self.cfg.name.clone(),
        };
        let (head, body) = open.encode();
        let limit = Instant::now() + self.cfg.connect_timeout;
        let exchange = async {
            wr.send(&head, &body, limit).await?;
            answers.recv().await.unwrap_or(Ok(None))
        };
        let answer = tokio::time::timeout_at(limit, exchange)
            .await
            .map_err(|_| Error::Timeout)??;
        let Some((h, _)) = answer else {
            return Err(Error::Io("notification connection closed".into()));
        };
        match (h.op, h.request_id, Answer::from_raw(h.flags)) {
            (Op::NotifyAck, 0, Some(Answer::Taken)) => Ok(true),
            (Op::NotifyAck, 0, Some(Answer::OtherIncarnation)) => Ok(false),
            (op, id, answer) => Err(Error::Protocol(format!(
                "{op:?} {id} ({answer:?}) in answer to NotifyOpen"
            ))),
        }
    }

    /// Sends the waiting notifications bound to `receiver`, as far as the window allows.
    async fn send_waiting(&mut self, wr: &mut Wire, receiver: u64) -> Result<()> {
        let Some(session) = self.session.as_mut() else {
            return Ok(());
        };
        while self.unacked.len() < WINDOW as usize
            && self.waiting.front().is_some_and(|o| o.target == receiver)
        {
            let Some(mut o) = self.waiting.pop_front() else {
                break;
            };
            o.seq = session.next;
            session.next += 1;
            // Kept before it is written: a write that fails leaves it to be resent.
            self.unacked.push_back(o);
            if let Some(o) = self.unacked.back() {
                send_one(wr, o).await?;
            }
        }
        Ok(())
    }

    /// Applies one frame read from the target to the oldest unacknowledged notification.
    fn acknowledge(&mut self, got: Option<Read>) -> Result<()> {
        let (h, body) = match got {
            Some(Ok(Some(frame))) => frame,
            Some(Err(e)) => return Err(e),
            Some(Ok(None)) | None => {
                return Err(Error::Io("notification connection closed".into()))
            }
        };
        let Some(front) = self.unacked.front() else {
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
        let outcome = match (h.op, Answer::from_raw(h.flags)) {
            (Op::NotifyAck, Some(Answer::Taken)) => Ok(NotifyOutcome::Queued),
            (Op::NotifyAck, Some(Answer::Dropped)) => Ok(NotifyOutcome::Dropped),
            (Op::NotifyAck, Some(Answer::OutOfWindow)) => Err(Error::NotifyRefused(format!(
                "{} refused sequence number {} as outside its window",
                self.peer.name(),
                front.seq
            ))),
            (Op::NotifyAck, Some(Answer::OtherIncarnation)) => {
                Err(restarted(self.peer.name(), front.target, h.buffer_id))
            }
            // Only this outbox holds the token: a stale connection of its own. Resent on
            // the next one.
            (Op::NotifyAck, Some(Answer::Superseded)) => {
                return Err(Error::Io("notification session taken over".into()))
            }
            (Op::Error, _) => Err(Error::RemoteRejected(format!(
                "{:?}: {}",
                RejectCode::from_raw(h.flags),
                String::from_utf8_lossy(&body)
            ))),
            (op, answer) => {
                return Err(Error::Protocol(format!(
                    "{op:?} ({answer:?}) on a notification connection"
                )))
            }
        };
        if let Some(o) = self.unacked.pop_front() {
            o.end(outcome);
        }
        Ok(())
    }

    /// The deadline of the oldest notification (handed over first: deadlines only grow).
    fn oldest_deadline(&self) -> Option<Instant> {
        self.unacked
            .front()
            .or(self.waiting.front())
            .map(|o| o.deadline)
    }

    /// Fails the notifications whose deadline passed, oldest first.
    fn expire(&mut self, why: &Error) {
        let now = Instant::now();
        for q in [&mut self.unacked, &mut self.waiting] {
            while q.front().is_some_and(|o| o.deadline <= now) {
                if let Some(o) = q.pop_front() {
                    o.end(Err(why.clone()));
                }
            }
            if !q.is_empty() {
                return;
            }
        }
    }

    fn fail_all(&mut self, why: &Error) {
        for o in self.unacked.drain(..).chain(self.waiting.drain(..)) {
            o.end(Err(why.clone()));
        }
    }
}

async fn send_one(wr: &mut Wire, o: &Outgoing) -> Result<()> {
    let mut h = Header::new(Op::Notify);
    h.request_id = o.seq;
    h.offset = o.bytes;
    h.length = o.data.len() as u64;
    wr.send(&h, &o.data, o.deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_grows_to_its_cap_and_starts_over_after_a_success() {
        let mut b = Backoff::new();
        let pauses: Vec<Duration> = (0..8).map(|_| b.failed()).collect();
        assert_eq!(pauses[0], BACKOFF.0);
        assert_eq!(pauses[1], BACKOFF.0 * 2);
        assert_eq!(pauses[7], BACKOFF.1, "capped");
        b.succeeded();
        assert_eq!(
            b.failed(),
            BACKOFF.0,
            "a peer reached again is retried quickly"
        );
    }
}
