//! Failover decisions. Pure code: the engine supplies the ranked
//! candidates, the budget used so far and the time.
//!
//! Ferry's departures from TENT: submit-stage failures fail over like completion failures
//! (transports return a result per request, atomically); an attempt that passes its deadline
//! counts as a failed attempt and fails over, so TIMEOUT is final only when the last attempt
//! timed out; failover runs as soon as an attempt fails rather than on the next poll — with
//! `enableAutoFailoverOnPoll` off, polled (batch) tasks never fail over, while the Promise
//! path still does.

use std::time::Duration;

pub use crate::deadlines::{DeadlineEntry, DeadlineKey, Deadlines};
use crate::kind::TransportKind;

/// Largest `max_failover_attempts` accepted. Failover is iterative (see [`Trampoline`]),
/// so any budget is safe for the stack; this bound keeps a task that keeps failing from
/// switching (and emitting a failover event) without end.
pub const MAX_FAILOVER_ATTEMPTS: u32 = 1000;

/// Failover settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverPolicy {
    /// Switches allowed per task: 0 disables failover, 1 allows exactly one. Default 3.
    pub max_failover_attempts: u32,
    /// Whether polled (batch) tasks fail over. Default true.
    pub auto_failover_on_poll: bool,
    /// Deadline of one attempt; `None` = no deadline. Default 10 s. It runs from when the
    /// attempt's bytes start moving where its transport says so (tcp, rdma:
    /// `Transport::reports_starts`), else from its submission.
    pub attempt_timeout: Option<Duration>,
}

impl Default for FailoverPolicy {
    fn default() -> Self {
        Self {
            max_failover_attempts: 3,
            auto_failover_on_poll: true,
            attempt_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// How a task is observed, which decides whether failover may run for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observer {
    /// Submitted to a batch and polled (`enableAutoFailoverOnPoll` governs failover).
    Poll,
    /// Awaited through the Promise path (always fails over while the budget lasts).
    Progress,
}

/// What to do after an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start a new attempt on this transport.
    Retry(TransportKind),
    /// End the task with the attempt's error.
    Fail(FailReason),
}

/// Why no retry happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// `max_failover_attempts` switches were spent (or it is 0).
    BudgetExhausted,
    /// The request pinned its transport (`requireTransport`).
    Pinned,
    /// A polled task with `enableAutoFailoverOnPoll` off.
    PollFailoverDisabled,
    /// No transport is left to try.
    NoCandidate,
    /// The error is final whatever the transport (canceled, closed, bad request).
    NotRetryable,
    /// The peer is declared lost: no transport reaches it.
    PeerLost,
}

/// Decides the next step after an attempt on `current` failed.
///
/// `ranked` is the task's candidates in current preference order (health applied). The
/// next transport is the one after `current` in that order, wrapping around, so two
/// failing transports alternate until the budget is spent; a single candidate is retried.
pub fn decide(
    policy: &FailoverPolicy,
    observer: Observer,
    pinned: bool,
    retryable: bool,
    switches_used: u32,
    ranked: &[TransportKind],
    current: TransportKind,
) -> Decision {
    if !retryable {
        return Decision::Fail(FailReason::NotRetryable);
    }
    if pinned {
        return Decision::Fail(FailReason::Pinned);
    }
    if observer == Observer::Poll && !policy.auto_failover_on_poll {
        return Decision::Fail(FailReason::PollFailoverDisabled);
    }
    if switches_used >= policy.max_failover_attempts {
        return Decision::Fail(FailReason::BudgetExhausted);
    }
    let next = match ranked.iter().position(|k| *k == current) {
        Some(i) => ranked.get((i + 1) % ranked.len()).copied(),
        None => ranked.first().copied(),
    };
    match next {
        Some(k) => Decision::Retry(k),
        None => Decision::Fail(FailReason::NoCandidate),
    }
}

/// Runs nested work iteratively. A resubmission that fails at once (inside `submit`)
/// reports its failure while the previous failure is still being handled on the same
/// thread; handled by recursion, a budget of a few thousand switches overflowed the stack.
/// The outermost call on a thread runs the work and then every item queued meanwhile, in
/// order; nested calls only queue.
pub struct Trampoline<T> {
    queue: std::cell::RefCell<Option<std::collections::VecDeque<T>>>,
}

impl<T> Default for Trampoline<T> {
    fn default() -> Self {
        Self {
            queue: std::cell::RefCell::new(None),
        }
    }
}

impl<T> Trampoline<T> {
    /// Runs `handle(item)` now, or queues it if this thread is already running `run`.
    pub fn run(&self, item: T, mut handle: impl FnMut(T)) {
        {
            let mut q = self.queue.borrow_mut();
            if let Some(queue) = q.as_mut() {
                queue.push_back(item);
                return;
            }
            *q = Some(std::collections::VecDeque::new());
        }
        // Resets the queue even if `handle` panics, so the thread is not left queuing.
        struct Reset<'a, T>(&'a std::cell::RefCell<Option<std::collections::VecDeque<T>>>);
        impl<T> Drop for Reset<'_, T> {
            fn drop(&mut self) {
                *self.0.borrow_mut() = None;
            }
        }
        let _reset = Reset(&self.queue);
        handle(item);
        loop {
            let next = self.queue.borrow_mut().as_mut().and_then(|q| q.pop_front());
            match next {
                Some(item) => handle(item),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransportKind::*;

    fn policy(budget: u32) -> FailoverPolicy {
        FailoverPolicy {
            max_failover_attempts: budget,
            ..FailoverPolicy::default()
        }
    }

    #[test]
    fn fails_over_to_the_next_candidate_and_wraps() {
        let p = policy(3);
        let ranked = [Shm, Tcp];
        assert_eq!(
            decide(&p, Observer::Progress, false, true, 0, &ranked, Shm),
            Decision::Retry(Tcp)
        );
        assert_eq!(
            decide(&p, Observer::Progress, false, true, 1, &ranked, Tcp),
            Decision::Retry(Shm)
        );
        // a single candidate is retried
        assert_eq!(
            decide(&p, Observer::Progress, false, true, 0, &[Tcp], Tcp),
            Decision::Retry(Tcp)
        );
        // current no longer ranked (e.g. disabled): start from the best
        assert_eq!(
            decide(&p, Observer::Progress, false, true, 0, &[Tcp], Shm),
            Decision::Retry(Tcp)
        );
        assert_eq!(
            decide(&p, Observer::Progress, false, true, 0, &[], Shm),
            Decision::Fail(FailReason::NoCandidate)
        );
    }

    #[test]
    fn budgets() {
        let ranked = [Shm, Tcp];
        // budget 0 disables failover
        assert_eq!(
            decide(&policy(0), Observer::Progress, false, true, 0, &ranked, Shm),
            Decision::Fail(FailReason::BudgetExhausted)
        );
        // budget 1 allows exactly one switch
        assert_eq!(
            decide(&policy(1), Observer::Progress, false, true, 0, &ranked, Shm),
            Decision::Retry(Tcp)
        );
        assert_eq!(
            decide(&policy(1), Observer::Progress, false, true, 1, &ranked, Tcp),
            Decision::Fail(FailReason::BudgetExhausted)
        );
    }

    #[test]
    fn poll_failover_switch_pinning_and_final_errors() {
        let off = FailoverPolicy {
            auto_failover_on_poll: false,
            ..FailoverPolicy::default()
        };
        let ranked = [Shm, Tcp];
        assert_eq!(
            decide(&off, Observer::Poll, false, true, 0, &ranked, Shm),
            Decision::Fail(FailReason::PollFailoverDisabled)
        );
        // the progress (Promise) path still fails over
        assert_eq!(
            decide(&off, Observer::Progress, false, true, 0, &ranked, Shm),
            Decision::Retry(Tcp)
        );
        assert_eq!(
            decide(&policy(3), Observer::Progress, true, true, 0, &ranked, Shm),
            Decision::Fail(FailReason::Pinned)
        );
        assert_eq!(
            decide(
                &policy(3),
                Observer::Progress,
                false,
                false,
                0,
                &ranked,
                Shm
            ),
            Decision::Fail(FailReason::NotRetryable)
        );
    }

    #[test]
    fn trampoline_runs_nested_work_iteratively_and_in_order() {
        thread_local! {
            static T: Trampoline<u32> = Trampoline::default();
        }
        fn step(n: u32, seen: &std::cell::RefCell<Vec<u32>>) {
            seen.borrow_mut().push(n);
            if n < 200_000 {
                // Would be 200k frames deep if it recursed.
                T.with(|t| t.run(n + 1, |m| step(m, seen)));
            }
        }
        let seen = std::cell::RefCell::new(Vec::new());
        T.with(|t| t.run(0, |n| step(n, &seen)));
        let seen = seen.into_inner();
        assert_eq!(seen.len(), 200_001);
        assert!(seen.windows(2).all(|w| w[1] == w[0] + 1));
        // The thread is free again: the next run starts a fresh outermost call.
        let again = std::cell::Cell::new(0);
        T.with(|t| t.run(7, |n| again.set(n)));
        assert_eq!(again.get(), 7);
    }
}
