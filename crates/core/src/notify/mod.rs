//! Notifications riding on transfers: a small payload the target receives once every byte
//! of a request (or of a whole submission) is visible in its memory.
//!
//! The sender attaches the payload to the call, not to a transport: it is sent once, when
//! the call's tasks have all completed — every byte acknowledged by whichever transport
//! served it, after any failover — and never for a call that did not complete. It travels
//! on the sender's link to that peer (the authenticated control connection `openSegment`
//! made, which also carries the heartbeats: `link_port`), or, to a target that does not
//! serve notifications there, on a connection of kind `Notify` of its own (`path`); one
//! per (sender, target), so notifications from one sender arrive in the order their calls
//! completed, whatever transports carried the data. The target queues it in a bounded inbox (`inbox`) and
//! acknowledges it; a resend after a broken connection is recognised by its sequence number
//! and taken once.
//!
//! A notification is bound to the incarnation of the target that its call was planned
//! against (the descriptor's engine id when the call was made): only that incarnation
//! takes it. If the peer restarted meanwhile, the notification ends refused
//! (`ERR_FERRY_NOTIFY_REFUSED`) — the new instance never got the data. Sequence numbers
//! count per session, one per (sender incarnation, receiver incarnation), owned by the
//! connection that holds the session's token; the target accepts them only within a window
//! of the last one taken, so a connection claiming another engine's id can neither take
//! over its numbers nor silence it. A notification the target does not queue is never
//! reported as queued: `notify` answers `Dropped`, a call's notification fails.
//!
//! Modules: `inbox` (the receive queue, pure), `sessions` and `window` (the senders'
//! sessions and their sequence numbers, pure), `outcome` (what the target did with one),
//! `protocol` (the connection's messages), `path` (the link or a connection of its own),
//! `outbox` (the sender's per-peer actor), `serve` (the target's side of the connection).

pub(crate) mod inbox;
pub(crate) mod outbox;
pub(crate) mod outcome;
mod path;
pub(crate) mod protocol;
pub(crate) mod serve;
pub(crate) mod sessions;
pub(crate) mod window;

use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use crate::config::notify::NotifyConfig;
pub use crate::metrics::NotifyCounters;
pub use inbox::{InboxSignal, InboxWaker, Notification};
pub use outcome::NotifyOutcome;

use crate::block_submit::BlockSubmission;
use crate::blocks::{BlockOutcome, Blocks, Gathered};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::inner::Inner;
use crate::request::{Request, Validate};
use crate::status::TransferStatus;
use crate::task::{Task, TaskSnapshot};

/// Checks a payload against this engine's cap.
fn check_size(data: &[u8], max: usize) -> Result<()> {
    if data.len() > max {
        return Err(Error::NotifyTooLarge {
            len: data.len(),
            max,
        });
    }
    Ok(())
}

/// The one segment a notifying call's requests go to.
fn single_target<R: Validate>(requests: &[R]) -> Result<u64> {
    let first = requests
        .first()
        .ok_or_else(|| Error::InvalidArgument("no requests given".into()))?
        .segment();
    if let Some(i) = requests.iter().position(|r| r.segment() != first) {
        return Err(Error::InvalidArgument(format!(
            "request {i}: a call with a notification must go to one segment (request 0's)"
        )));
    }
    Ok(first)
}

/// Calls `on_done` exactly once: with the outcome, or — if the engine's runtime drops the
/// future that would have — with `Closed`.
struct Once<F: FnOnce(Vec<TaskSnapshot>, Option<Error>)> {
    on_done: Option<F>,
    snaps: Vec<TaskSnapshot>,
}

impl<F: FnOnce(Vec<TaskSnapshot>, Option<Error>)> Once<F> {
    fn finish(mut self, error: Option<Error>) {
        if let Some(f) = self.on_done.take() {
            f(std::mem::take(&mut self.snaps), error);
        }
    }
}

impl<F: FnOnce(Vec<TaskSnapshot>, Option<Error>)> Drop for Once<F> {
    fn drop(&mut self) {
        if let Some(f) = self.on_done.take() {
            f(std::mem::take(&mut self.snaps), Some(Error::Closed));
        }
    }
}

impl Inner {
    /// The incarnation of segment `handle`'s peer as known now: a call planned now goes to
    /// it, and so may its notification.
    fn incarnation(&self, handle: u64) -> Result<u64> {
        Ok(self.segments.get(handle)?.descriptor().engine_id)
    }

    /// Sends `data` to segment `handle` now, for its incarnation `target` only (`None`:
    /// the one known now); the future ends with the target's answer.
    fn notify_peer(
        &self,
        handle: u64,
        target: Option<u64>,
        data: Arc<[u8]>,
        bytes: u64,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<NotifyOutcome>>> {
        let peer = self.segments.get(handle)?;
        let target = target.unwrap_or_else(|| peer.descriptor().engine_id);
        Ok(self.notifier.send(&self.handle, &peer, target, data, bytes))
    }

    /// Counts a failed delivery and passes the outcome on.
    fn delivered(&self, got: Option<Result<NotifyOutcome>>) -> Result<NotifyOutcome> {
        let r = got.unwrap_or(Err(Error::Closed));
        let counter = match r {
            Ok(_) => &self.stats.notify.delivered,
            Err(_) => &self.stats.notify.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        r
    }
}

/// The error a call reports for its notification's outcome: none when queued. A refusal
/// (the peer restarted, its queue was full) says so in its own code; anything else is
/// NOTIFY_FAILED with the cause.
fn call_error(got: Result<NotifyOutcome>) -> Option<Error> {
    match got {
        Ok(NotifyOutcome::Queued) => None,
        Ok(NotifyOutcome::Dropped) => Some(Error::NotifyRefused(
            "the target's receive queue (notifyQueueSize) was full: dropped".into(),
        )),
        Err(e @ Error::NotifyRefused(_)) => Some(e),
        Err(e) => Some(Error::NotifyFailed(format!("{e} ({})", e.code()))),
    }
}

impl Engine {
    /// Sends a notification without data to segment `segment`. It is handed to the
    /// peer's outbox now, so notifications leave in the order of these calls; the future
    /// ends when the target took it (`Queued`, or `Dropped` if its queue was full) or with
    /// why it could not.
    pub fn notify(
        &self,
        segment: u64,
        data: &[u8],
    ) -> impl std::future::Future<Output = Result<NotifyOutcome>> + Send + 'static {
        let sent = self.live().and_then(|live| {
            check_size(data, live.config.notify.max_bytes)?;
            let rx = live.notify_peer(segment, None, data.into(), 0)?;
            Ok((Arc::downgrade(&live), rx))
        });
        async move {
            let (weak, rx) = sent?;
            let got = rx.await.ok();
            match weak.upgrade() {
                Some(live) => live.delivered(got),
                None => got.unwrap_or(Err(Error::Closed)),
            }
        }
    }

    /// `notify` for synchronous callers; must not be called from the engine's threads.
    pub fn notify_blocking(&self, segment: u64, data: &[u8]) -> Result<NotifyOutcome> {
        let (tx, rx) = std::sync::mpsc::channel();
        let sent = self.notify(segment, data);
        self.spawn(async move {
            let _ = tx.send(sent.await);
        })?;
        rx.recv().unwrap_or(Err(Error::Closed))
    }

    /// `transfer` with a notification: when every task completed, `notify` is sent to the
    /// requests' segment (they must share one) and `on_done` runs once the target answered,
    /// with the delivery error if it was not queued: `NotifyRefused` when the target is not
    /// the incarnation the call was planned against (it restarted) or dropped it,
    /// `NotifyFailed` otherwise. A call that did not complete sends nothing and `on_done`
    /// gets no error of its own (the tasks carry theirs).
    pub fn transfer_notify<F>(
        &self,
        requests: &[Request],
        notify: Vec<u8>,
        on_done: F,
    ) -> Result<u64>
    where
        F: FnOnce(Vec<TaskSnapshot>, Option<Error>) + Send + 'static,
    {
        self.transfer_notify_of(requests, notify, on_done)
    }

    /// `transfer_notify` of requests or a block list's units.
    fn transfer_notify_of<R, F>(&self, requests: &[R], notify: Vec<u8>, on_done: F) -> Result<u64>
    where
        R: Validate,
        F: FnOnce(Vec<TaskSnapshot>, Option<Error>) + Send + 'static,
    {
        let live = self.live()?;
        check_size(&notify, live.config.notify.max_bytes)?;
        let segment = single_target(requests)?;
        // Read before the call is planned: its data goes to this incarnation or a later
        // one, and a later one refuses the notification rather than take it blind.
        let target = live.incarnation(segment)?;
        let weak = Arc::downgrade(&live);
        let data: Arc<[u8]> = notify.into();
        live.transfer(requests, move |snaps| {
            let once = Once {
                on_done: Some(on_done),
                snaps,
            };
            let completed = once
                .snaps
                .iter()
                .all(|s| s.status == TransferStatus::Completed);
            let Some(inner) = weak.upgrade().filter(|_| completed) else {
                return once.finish(None);
            };
            let bytes = once.snaps.iter().map(|s| s.transferred).sum();
            let rx = match inner.notify_peer(segment, Some(target), data, bytes) {
                Ok(rx) => rx,
                Err(e) => {
                    inner.stats.notify.failed.fetch_add(1, Ordering::Relaxed);
                    return once.finish(call_error(Err(e)));
                }
            };
            let handle = inner.handle.clone();
            drop(inner);
            handle.spawn(async move {
                let got = rx.await.ok();
                let got = match weak.upgrade() {
                    Some(inner) => inner.delivered(got),
                    None => got.unwrap_or(Err(Error::Closed)),
                };
                once.finish(call_error(got));
            });
        })
    }

    /// `transfer_blocks` with a notification: sent once every block completed (the list's
    /// tasks are one call of `transfer_notify`, so exactly once, after all their bytes).
    pub fn transfer_blocks_notify<F>(
        &self,
        blocks: &Blocks,
        notify: Vec<u8>,
        on_done: F,
    ) -> Result<(u64, usize)>
    where
        F: FnOnce(BlockOutcome, Option<Error>) + Send + 'static,
    {
        let Gathered { units, map } = self.live()?.gather_blocks(blocks)?;
        let count = units.len();
        let op = self.transfer_notify_of(&units, notify, move |snaps, err| {
            on_done(map.outcome(&snaps), err)
        })?;
        Ok((op, count))
    }

    /// `submit_blocks` with a notification, sent when every task of this list completed.
    pub fn submit_blocks_notify(
        &self,
        batch: u64,
        blocks: &Blocks,
        notify: Vec<u8>,
    ) -> Result<BlockSubmission> {
        let Gathered { units, map } = self.live()?.gather_blocks(blocks)?;
        let first_task = self.submit_transfer_notify_of(batch, &units, notify)?;
        Ok(BlockSubmission { first_task, map })
    }

    /// `submit_transfer` with a notification, sent when every task of this submission
    /// completed, to the incarnation the submission was planned against; a failed delivery
    /// is counted (`ferry_notifications_failed_total`) and logged, since no one awaits a
    /// batch.
    pub fn submit_transfer_notify(
        &self,
        batch: u64,
        requests: &[Request],
        notify: Vec<u8>,
    ) -> Result<usize> {
        self.submit_transfer_notify_of(batch, requests, notify)
    }

    /// `submit_transfer_notify` of requests or a block list's units.
    fn submit_transfer_notify_of<R: Validate>(
        &self,
        batch: u64,
        requests: &[R],
        notify: Vec<u8>,
    ) -> Result<usize> {
        let live = self.live()?;
        check_size(&notify, live.config.notify.max_bytes)?;
        let segment = single_target(requests)?;
        let target = live.incarnation(segment)?;
        let weak = Arc::downgrade(&live);
        let data: Arc<[u8]> = notify.into();
        let then = move |tasks: &[Arc<Task>]| {
            let completed = tasks
                .iter()
                .all(|t| t.status() == TransferStatus::Completed);
            let Some(inner) = weak.upgrade().filter(|_| completed) else {
                return;
            };
            let bytes = tasks.iter().map(|t| t.request().length).sum();
            match inner.notify_peer(segment, Some(target), data, bytes) {
                Ok(rx) => {
                    let weak = weak.clone();
                    inner.handle.spawn(async move {
                        let got = rx.await.ok();
                        if let Some(inner) = weak.upgrade() {
                            if let Some(e) = call_error(inner.delivered(got)) {
                                tracing::warn!(error = %e, "batch notification not delivered");
                            }
                        }
                    });
                }
                Err(e) => {
                    inner.stats.notify.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "batch notification not sent");
                }
            }
        };
        live.submit_transfer_then(batch, requests, Some(Box::new(then)))
    }

    /// Takes up to `max` received notifications, oldest first.
    pub fn take_notifications(&self, max: usize) -> Result<Vec<Notification>> {
        Ok(self.live()?.local.notify_inbox.take(max))
    }

    /// Notifications waiting in the receive queue.
    pub fn notifications_queued(&self) -> usize {
        self.live().map_or(0, |l| l.local.notify_inbox.len())
    }

    /// Sets who is told that notifications wait (`Ready`, when the queue stops being
    /// empty) or were dropped; `None` stops telling.
    pub fn set_notification_waker(&self, waker: Option<InboxWaker>) {
        if let Ok(l) = self.live() {
            l.local.notify_inbox.set_waker(waker);
        }
    }
}
