//! Running attempts: start one on a transport, give it a deadline, and carry out what
//! `attempt::on_failure` decides when it fails (events, counters, the next attempt).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::attempt::{on_failure, Failure, Next};
use crate::error::Error;
use crate::events::EngineEvent;
use crate::failover::Trampoline;
use crate::fence::Fenced;
use crate::inner::Inner;
use crate::kind::TransportKind;
use crate::lazy_now::LazyNow;
use crate::task::{Driver, Task};
use crate::transport::Attempt;

thread_local! {
    /// Attempt failures raised on this thread while it handles one (see `Trampoline`).
    static FAILURES: Trampoline<(Arc<Task>, Error)> = Trampoline::default();
}

impl Driver for Inner {
    fn attempt_failed(&self, task: &Arc<Task>, _attempt: u32, error: Error) {
        // A failure raised while handling another (the resubmission failed at submit) is
        // queued and handled after it, so the stack stays flat whatever the budget.
        FAILURES.with(|f| {
            f.run((task.clone(), error), |(task, error)| {
                self.attempt_failure(&task, error)
            })
        });
    }

    fn start_next(&self, task: &Arc<Task>, kind: TransportKind) {
        self.start_attempt(task, kind);
    }

    fn attempt_succeeded(&self, task: &Task, _attempt: u32) {
        if let Some(kind) = task.transport() {
            self.rail_succeeded(task.request().peer.handle(), kind);
        }
    }
}

impl Inner {
    /// Records a success on the (peer, transport) rail: health bookkeeping, which matters
    /// only once a failure was ever recorded (until then it costs a load).
    pub(crate) fn rail_succeeded(&self, peer: u64, kind: TransportKind) {
        if self.health_dirty.load(Ordering::Relaxed) {
            self.health.record_success(&(peer, kind), Instant::now());
        }
    }

    /// Starts a new attempt of `task` on `kind`.
    pub(crate) fn start_attempt(&self, task: &Arc<Task>, kind: TransportKind) {
        self.start_attempt_in(task, kind, false, &LazyNow::new())
    }

    /// `start_attempt`, as one of a submission's attempts (`more_follow`: see [`Attempt`]).
    pub(crate) fn start_attempt_in(
        &self,
        task: &Arc<Task>,
        kind: TransportKind,
        more_follow: bool,
        now: &LazyNow,
    ) {
        let Some(attempt) = task.begin_attempt(kind) else {
            return;
        };
        tracing::debug!(
            peer = task.request().peer.name(),
            transport = kind.name(),
            attempt,
            "attempt"
        );
        let Some(transport) = self.transport(kind) else {
            task.attempt_failed(attempt, Error::TransportUnavailable(kind.name().into()));
            return;
        };
        let a = Attempt {
            task: task.clone(),
            attempt,
            more_follow,
        };
        let timed = self.config.failover.attempt_timeout;
        // A transport that queues work and says when it starts moving times it from then
        // (`Transport::reports_starts`): a long list never times out behind its own head.
        let from_start = timed.is_some() && transport.reports_starts();
        if from_start {
            task.time_from_start(attempt, &self.deadlines);
        }
        if let Err(e) = transport.submit_one(&a) {
            task.attempt_failed(attempt, e);
            return;
        }
        // Otherwise registered only for an attempt still running once submitted: most
        // same-host copies are done by now, and skip the deadline table's lock and the
        // clock. One that ends meanwhile is removed again by the task, and one that its
        // transport queued and timed from its start itself (shm's copy threads) keeps
        // that. The deadline counts from the call's time: its first clock read, at the
        // latest now.
        if let Some(timeout) = timed.filter(|_| !from_start) {
            if !task.status().is_terminal()
                && task.attempt() == attempt
                && !task.is_timed_from_start(attempt)
            {
                let at = now.get() + timeout;
                let key = self.deadlines.add(Arc::downgrade(task), attempt, at);
                task.set_deadline(attempt, &self.deadlines, key);
            }
        }
    }

    fn attempt_failure(&self, task: &Arc<Task>, error: Error) {
        let now = Instant::now();
        let peer = &task.request().peer;
        let current = task.transport().unwrap_or(TransportKind::Tcp);
        let failure = Failure {
            error: &error,
            transport: current,
            peer: peer.handle(),
            peer_lost: peer.is_lost(),
            engine_open: !self.is_closed(),
            observer: task.observer(),
        };
        let actions =
            task.with_state(|st| on_failure(&self.config.failover, &self.health, st, failure, now));
        if matches!(error, Error::Integrity(_)) {
            self.stats.integrity_failures.add(current);
        }
        if actions.recorded {
            self.health_dirty.store(true, Ordering::Relaxed);
        }
        if let Some(until) = actions.rail_paused_until {
            tracing::info!(
                peer = peer.name(),
                transport = current.name(),
                "transport keeps failing towards this peer: ranked last for a cooldown"
            );
            self.stats
                .transports_disabled
                .fetch_add(1, Ordering::Relaxed);
            let wall = SystemTime::now() + until.saturating_duration_since(now);
            self.emit(EngineEvent::TransportDisabled {
                transport: current,
                segment: Some(peer.name().to_string()),
                reason: error.to_string(),
                until_ms: wall
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64),
            });
        }
        match actions.next {
            Next::Retry { to, switches } => {
                self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                let segment = peer.name().to_string();
                tracing::debug!(%segment, from = current.name(), to = to.name(), switches, %error, "failover");
                self.emit(EngineEvent::Failover {
                    segment,
                    from: current,
                    to,
                    attempt: switches,
                    reason: error.to_string(),
                });
                // The next attempt starts once nothing of this one can land any more: at
                // once, or on the runtime when the last piece is dropped (wherever that
                // is, it may hold a transport's lock).
                let (next, handle) = (task.clone(), self.handle.clone());
                let later = Box::new(move || {
                    handle.spawn(async move {
                        if let Some(driver) = next.driver() {
                            driver.start_next(&next, to);
                        }
                    });
                });
                if task.fence().defer_then(later).is_err() {
                    self.start_attempt(task, to);
                }
            }
            Next::Fail(why) if may_mean_peer_died(&error) => {
                tracing::debug!(?why, %error, "task failed; held until the peer's fate is known");
                let task = task.clone();
                peer.hold_until_fate(Box::new(move |loss| {
                    task.fail(loss.unwrap_or(error));
                }));
            }
            Next::Fail(why) => {
                tracing::debug!(?why, %error, "task failed");
                task.fail(error);
            }
        }
    }
}

/// Whether a final failure may be the first sign of the peer's death (a broken or refused
/// connection, a dead process, no answer in time): such a failure waits for the link's
/// verdict, so that `PeerLost` is always emitted before the work it explains fails. An
/// injected fault says nothing about the peer.
fn may_mean_peer_died(error: &Error) -> bool {
    !crate::error::is_injected(error)
        && matches!(
            error,
            Error::PeerLost { .. } | Error::Connect { .. } | Error::Io(_) | Error::Timeout
        )
}

/// Fails attempts that pass their deadline (they then fail over like any failed attempt).
pub(crate) async fn sweep_deadlines(inner: Weak<Inner>, cancel: CancellationToken) {
    let tick = match inner.upgrade() {
        Some(i) => i.deadlines.tick(),
        None => return,
    };
    let mut interval = tokio::time::interval(tick.max(Duration::from_millis(1)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        for (task, attempt) in inner.deadlines.expired(Instant::now()) {
            let Some(task) = task.upgrade() else { continue };
            if task.attempt() == attempt && !task.status().is_terminal() {
                inner.stats.attempt_timeouts.fetch_add(1, Ordering::Relaxed);
                task.attempt_failed(attempt, Error::Timeout);
            }
        }
    }
}
