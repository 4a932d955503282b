//! A peer's link shared with its notifications: the control connection that carries the
//! heartbeats also carries the notification session to the incarnation it reached, so that
//! a peer that is only opened, pinged and notified costs one connection.
//!
//! While a link connection is up, the link publishes it here as a `LinkEnd`: the engine id
//! its handshake reached and whether that engine serves notifications on control
//! connections (`HelloAck`'s `ACK_LINK_NOTIFY`; a build without it gets a notification
//! connection of its own, as before). Frames are written by one writer task, whole (a ping
//! and a notification never interleave), pings first, notifications in the order handed
//! over; the link's reader routes the notification answers (`NotifyAck`, `Error`) to
//! whoever attached, and closes that attachment when the connection ends, so the outbox
//! sees the break as it would on its own connection and resends on the next one. An
//! attachment that does not keep up with its answers is closed rather than ever stalling
//! the link's reader.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use crate::error::{Error, Result};
use crate::net::write_frame;
use crate::notify::window::WINDOW;
use crate::sealed_stream::ConnWrite;
use crate::wire::{Header, Op};

/// A frame to write.
pub(crate) type Frame = (Header, Vec<u8>);

/// What an attachment reads: a frame, or why its connection ended.
pub(crate) type Read = Result<Option<Frame>>;

/// Notification frames waiting for the writer.
const QUEUED_FRAMES: usize = 64;

/// Pings waiting for the writer, which takes them before any notification: a burst of
/// notifications never holds a ping back (the answer to one may be what releases failures
/// held until the peer's fate is known).
const QUEUED_PINGS: usize = 4;

/// Answers an attachment may leave unread: every notification of a full window, and then
/// some (its `Error`s and the open's answer).
const QUEUED_ANSWERS: usize = WINDOW as usize + 16;

/// The link connection of one peer, as far as notifications see it.
pub(crate) struct LinkPort {
    now: watch::Sender<Option<LinkEnd>>,
}

impl Default for LinkPort {
    fn default() -> Self {
        Self {
            now: watch::channel(None).0,
        }
    }
}

impl LinkPort {
    /// Watches the connection published: `None` while the link is down.
    pub(crate) fn watch(&self) -> watch::Receiver<Option<LinkEnd>> {
        self.now.subscribe()
    }

    /// Wakes the watchers without a change (e.g. the peer was declared lost).
    pub(crate) fn wake(&self) {
        self.now.send_modify(|_| {});
    }

    /// Publishes an up connection to engine `engine_id`, written by `wr`; it stays
    /// published until the returned `Carrier` is dropped.
    pub(crate) fn carry(
        self: &Arc<Self>,
        wr: ConnWrite,
        engine_id: u64,
        carries_notify: bool,
    ) -> Carrier {
        let (frames, mut queued) = mpsc::channel::<Frame>(QUEUED_FRAMES);
        let (pings, mut ping_queue) = mpsc::channel::<Header>(QUEUED_PINGS);
        let writer = tokio::spawn(async move {
            let mut wr = wr;
            loop {
                let (h, body) = tokio::select! {
                    biased;
                    Some(ping) = ping_queue.recv() => (ping, Vec::new()),
                    frame = queued.recv() => match frame {
                        Some(frame) => frame,
                        None => return,
                    },
                };
                if let Err(e) = write_frame(&mut wr, &h, &body).await {
                    tracing::debug!(error = %e, "link write failed");
                    return;
                }
            }
        });
        let end = LinkEnd {
            engine_id,
            carries_notify,
            frames,
            answers: Arc::new(Mutex::new(None)),
        };
        self.now.send_replace(Some(end.clone()));
        Carrier {
            port: self.clone(),
            end,
            pings,
            writer,
        }
    }
}

/// An up link connection, as published.
#[derive(Clone)]
pub(crate) struct LinkEnd {
    /// The incarnation the connection's handshake reached.
    pub(crate) engine_id: u64,
    /// Whether that incarnation serves notifications on it.
    pub(crate) carries_notify: bool,
    frames: mpsc::Sender<Frame>,
    answers: Arc<Mutex<Option<mpsc::Sender<Read>>>>,
}

impl LinkEnd {
    /// Takes the connection's notification answers from now on (an earlier attachment is
    /// closed); they end with the connection.
    pub(crate) fn attach(&self) -> mpsc::Receiver<Read> {
        let (tx, rx) = mpsc::channel(QUEUED_ANSWERS);
        *lock(&self.answers) = Some(tx);
        rx
    }

    /// Hands a frame to the writer, in order after those handed over before.
    pub(crate) async fn send(&self, frame: Frame) -> Result<()> {
        self.frames
            .send(frame)
            .await
            .map_err(|_| Error::Io("the link connection closed".into()))
    }

    fn same(&self, other: &LinkEnd) -> bool {
        Arc::ptr_eq(&self.answers, &other.answers)
    }
}

/// What sending a ping came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    Sent,
    /// The writer is behind (the peer stopped reading): the ping is not sent.
    Full,
    /// The writer stopped: a write failed.
    Broken,
}

/// The link's side of a published connection: its writer and where answers go.
pub(crate) struct Carrier {
    port: Arc<LinkPort>,
    end: LinkEnd,
    pings: mpsc::Sender<Header>,
    writer: tokio::task::JoinHandle<()>,
}

impl Carrier {
    /// Queues a ping (never waits: the link's clock decides what a slow peer means).
    pub(crate) fn ping(&self, ping: Header) -> Queued {
        match self.pings.try_send(ping) {
            Ok(()) => Queued::Sent,
            Err(mpsc::error::TrySendError::Full(_)) => Queued::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Queued::Broken,
        }
    }

    /// A router for the link's reader.
    pub(crate) fn answers(&self) -> Answers {
        Answers(self.end.answers.clone())
    }
}

impl Drop for Carrier {
    fn drop(&mut self) {
        self.writer.abort();
        self.port.now.send_if_modified(|now| {
            let ours = now.as_ref().is_some_and(|e| e.same(&self.end));
            if ours {
                *now = None;
            }
            ours
        });
        Answers(self.end.answers.clone())
            .close(Err(Error::Io("the link connection closed".into())));
    }
}

/// Routes the notification answers the link's reader reads.
pub(crate) struct Answers(Arc<Mutex<Option<mpsc::Sender<Read>>>>);

impl Answers {
    /// Whether `op` answers a notification (and so goes to the attachment).
    pub(crate) fn routes(op: Op) -> bool {
        matches!(op, Op::NotifyAck | Op::Error)
    }

    /// Hands an answer to the attachment; dropped when none is attached. An attachment
    /// that let its queue fill is closed.
    pub(crate) fn deliver(&self, frame: Frame) {
        let mut slot = lock(&self.0);
        if let Some(tx) = slot.as_ref() {
            if tx.try_send(Ok(Some(frame))).is_err() {
                *slot = None;
            }
        }
    }

    /// Ends the attachment with `why` (the connection ended).
    pub(crate) fn close(&self, why: Read) {
        if let Some(tx) = lock(&self.0).take() {
            let _ = tx.try_send(why);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(op: Op, id: u64) -> Frame {
        let mut h = Header::new(op);
        h.request_id = id;
        (h, Vec::new())
    }

    #[test]
    fn answers_go_to_the_latest_attachment_and_end_with_the_connection() {
        let (frames, _queued) = mpsc::channel(1);
        let end = LinkEnd {
            engine_id: 7,
            carries_notify: true,
            frames,
            answers: Arc::new(Mutex::new(None)),
        };
        let router = Answers(end.answers.clone());
        router.deliver(frame(Op::NotifyAck, 1)); // none attached: dropped
        let mut first = end.attach();
        let mut second = end.attach();
        router.deliver(frame(Op::NotifyAck, 2));
        assert!(first.try_recv().is_err(), "replaced: closed, nothing more");
        let got = second.try_recv().expect("answer").expect("frame");
        assert_eq!(got.map(|(h, _)| h.request_id), Some(2));
        router.close(Ok(None));
        assert!(matches!(second.try_recv(), Ok(Ok(None))));
        assert!(second.try_recv().is_err(), "closed after the end");
    }

    #[test]
    fn an_attachment_that_falls_behind_is_closed_not_waited_for() {
        let (frames, _queued) = mpsc::channel(1);
        let end = LinkEnd {
            engine_id: 7,
            carries_notify: true,
            frames,
            answers: Arc::new(Mutex::new(None)),
        };
        let router = Answers(end.answers.clone());
        let mut rx = end.attach();
        for i in 0..=QUEUED_ANSWERS as u64 {
            router.deliver(frame(Op::NotifyAck, i));
        }
        let mut read = 0;
        while let Ok(Ok(Some(_))) = rx.try_recv() {
            read += 1;
        }
        assert_eq!(read, QUEUED_ANSWERS);
        assert!(lock(&end.answers).is_none(), "detached");
        assert!(Answers::routes(Op::NotifyAck) && Answers::routes(Op::Error));
        assert!(!Answers::routes(Op::Pong) && !Answers::routes(Op::Goodbye));
    }
}
