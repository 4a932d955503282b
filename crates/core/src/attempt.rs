//! What happens after an attempt fails: record it against the rail, pause the rail when it
//! keeps failing, and fail over or end the task. Pure: the task's attempt state, the
//! failure and `now` in; the [`Actions`] out, which the engine carries out (events,
//! counters, the next attempt).

use std::time::Instant;

use crate::error::Error;
use crate::failover::{decide, Decision, FailReason, FailoverPolicy, Observer};
use crate::health::HealthTable;
use crate::kind::{Kinds, TransportKind};
use crate::liveness::LossReason;
use crate::status::TransferStatus;

/// Per-task failover bookkeeping, guarded by the task's lock (`Task::with_state`).
#[derive(Debug, Default)]
pub struct AttemptState {
    /// Why the task did not complete (set when it ends).
    pub error: Option<Error>,
    /// Ranked transports this task may use.
    pub candidates: Kinds,
    /// Whether fallback is forbidden (`requireTransport`).
    pub pinned: bool,
    /// Switches made so far.
    pub switches: u32,
    /// The last attempt whose failure was handled (first failure of an attempt wins).
    pub failed_attempt: u32,
}

/// A (peer, transport) rail: the key of the engine's health table.
pub(crate) type Rail = (u64, TransportKind);

/// A failed attempt, as the engine saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Failure<'a> {
    /// What failed it.
    pub(crate) error: &'a Error,
    /// The transport it ran on.
    pub(crate) transport: TransportKind,
    /// The peer's handle (the rail's other half).
    pub(crate) peer: u64,
    /// Whether the peer is declared lost.
    pub(crate) peer_lost: bool,
    /// Whether the engine is still open.
    pub(crate) engine_open: bool,
    /// How the task is awaited.
    pub(crate) observer: Observer,
}

/// What the engine does about a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Actions {
    /// The failure was counted against the rail (the health table is in use).
    pub(crate) recorded: bool,
    /// This failure paused the rail until then (emit `TransportDisabled`, count it).
    pub(crate) rail_paused_until: Option<Instant>,
    /// The next step.
    pub(crate) next: Next,
}

/// The task's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Start a new attempt on `to`: the task's `switches`-th switch (emit `Failover`).
    Retry {
        /// The transport of the new attempt.
        to: TransportKind,
        /// Switches made, this one included.
        switches: u32,
    },
    /// End the task with the attempt's error.
    Fail(FailReason),
}

/// Decides what follows a failed attempt and updates the task's attempt state (its switch
/// count) and the rail's history in `health`.
pub(crate) fn on_failure(
    policy: &FailoverPolicy,
    health: &HealthTable<Rail>,
    state: &mut AttemptState,
    failure: Failure<'_>,
    now: Instant,
) -> Actions {
    let end = |reason| Actions {
        recorded: false,
        rail_paused_until: None,
        next: Next::Fail(reason),
    };
    if !failure.engine_open {
        return end(FailReason::NotRetryable);
    }
    // A peer declared lost is out of reach whatever the transport: end the task now
    // instead of retrying into it, and count nothing against the transport's health.
    if failure.peer_lost {
        return end(FailReason::PeerLost);
    }
    // Planned against an incarnation of the peer that is gone: no transport can serve it.
    if matches!(
        failure.error,
        Error::PeerLost {
            reason: LossReason::Restarted { .. },
            ..
        }
    ) {
        return end(FailReason::PeerLost);
    }
    // Bytes corrupted on the way (`verify`) count against the rail that carried them, but
    // are never retried: a retry that succeeds would hide the corruption from the caller.
    let corrupted = matches!(failure.error, Error::Integrity(_));
    let retryable = !corrupted
        && matches!(
            failure.error.status(),
            TransferStatus::Failed | TransferStatus::Timeout
        );
    let counts_against_rail = retryable || corrupted;
    let rail = (failure.peer, failure.transport);
    let rail_paused_until = if counts_against_rail && health.record_error(&rail, now) {
        health.paused_until(&rail)
    } else {
        None
    };
    let ranked = health.rank(&state.candidates, |k| (failure.peer, *k), now);
    let next = match decide(
        policy,
        failure.observer,
        state.pinned,
        retryable,
        state.switches,
        &ranked,
        failure.transport,
    ) {
        Decision::Retry(to) => {
            state.switches += 1;
            Next::Retry {
                to,
                switches: state.switches,
            }
        }
        Decision::Fail(reason) => Next::Fail(reason),
    };
    Actions {
        recorded: counts_against_rail,
        rail_paused_until,
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::RailPolicy;
    use std::time::Duration;
    use TransportKind::*;

    fn state(candidates: &[TransportKind], pinned: bool) -> AttemptState {
        AttemptState {
            candidates: candidates.into(),
            pinned,
            ..AttemptState::default()
        }
    }

    fn failure(error: &Error, transport: TransportKind) -> Failure<'_> {
        Failure {
            error,
            transport,
            peer: 9,
            peer_lost: false,
            engine_open: true,
            observer: Observer::Progress,
        }
    }

    fn io() -> Error {
        Error::Io("connection reset".into())
    }

    #[test]
    fn a_failed_attempt_moves_to_the_next_candidate_and_counts_the_switch() {
        let (policy, health, now) = (
            FailoverPolicy::default(),
            HealthTable::default(),
            Instant::now(),
        );
        let mut st = state(&[Shm, Tcp], false);
        let e = io();
        let a = on_failure(&policy, &health, &mut st, failure(&e, Shm), now);
        assert_eq!(
            a.next,
            Next::Retry {
                to: Tcp,
                switches: 1
            }
        );
        assert!(a.recorded);
        assert_eq!(a.rail_paused_until, None);
        let a = on_failure(&policy, &health, &mut st, failure(&e, Tcp), now);
        assert_eq!(
            a.next,
            Next::Retry {
                to: Shm,
                switches: 2
            }
        );
        assert_eq!(st.switches, 2);
    }

    #[test]
    fn the_budget_ends_the_task_and_a_single_candidate_is_retried() {
        let policy = FailoverPolicy {
            max_failover_attempts: 2,
            ..FailoverPolicy::default()
        };
        let (health, now) = (HealthTable::default(), Instant::now());
        let mut st = state(&[Tcp], false);
        let e = io();
        for n in 1..=2 {
            let a = on_failure(&policy, &health, &mut st, failure(&e, Tcp), now);
            assert_eq!(
                a.next,
                Next::Retry {
                    to: Tcp,
                    switches: n
                }
            );
        }
        let a = on_failure(&policy, &health, &mut st, failure(&e, Tcp), now);
        assert_eq!(a.next, Next::Fail(FailReason::BudgetExhausted));
        assert_eq!(st.switches, 2);
    }

    #[test]
    fn an_integrity_failure_is_never_retried_into_success() {
        let (policy, health, now) = (
            FailoverPolicy::default(),
            HealthTable::default(),
            Instant::now(),
        );
        let mut st = state(&[Shm, Tcp], false);
        let e = Error::Integrity("CRC32C mismatch".into());
        let a = on_failure(&policy, &health, &mut st, failure(&e, Tcp), now);
        assert_eq!(a.next, Next::Fail(FailReason::NotRetryable));
        assert!(
            a.recorded,
            "corruption counts against the rail that carried it"
        );
        assert_eq!(st.switches, 0);
    }

    #[test]
    fn work_planned_against_a_gone_incarnation_ends_without_failover() {
        let (policy, health, now) = (
            FailoverPolicy::default(),
            HealthTable::default(),
            Instant::now(),
        );
        let mut st = state(&[Shm, Tcp], false);
        let e = Error::PeerLost {
            peer: "p".into(),
            reason: LossReason::Restarted { engine_id: 2 },
        };
        let a = on_failure(&policy, &health, &mut st, failure(&e, Shm), now);
        assert_eq!(a.next, Next::Fail(FailReason::PeerLost));
        assert!(!a.recorded, "no transport's fault");
        assert_eq!(st.switches, 0);
    }

    #[test]
    fn pinned_lost_closed_and_final_errors_end_at_once() {
        let (policy, now) = (FailoverPolicy::default(), Instant::now());
        let e = io();
        let health = HealthTable::default();
        let a = on_failure(
            &policy,
            &health,
            &mut state(&[Tcp], true),
            failure(&e, Tcp),
            now,
        );
        assert_eq!(a.next, Next::Fail(FailReason::Pinned));
        assert!(a.recorded, "a pinned failure still counts against its rail");

        let health = HealthTable::default();
        let lost = Failure {
            peer_lost: true,
            ..failure(&e, Tcp)
        };
        let a = on_failure(&policy, &health, &mut state(&[Shm, Tcp], false), lost, now);
        assert_eq!(a.next, Next::Fail(FailReason::PeerLost));
        assert!(
            !a.recorded && health.is_empty(),
            "a lost peer says nothing about the rail"
        );

        let closed = Failure {
            engine_open: false,
            ..failure(&e, Tcp)
        };
        let a = on_failure(
            &policy,
            &health,
            &mut state(&[Shm, Tcp], false),
            closed,
            now,
        );
        assert_eq!(a.next, Next::Fail(FailReason::NotRetryable));

        let canceled = Error::Canceled;
        let a = on_failure(
            &policy,
            &health,
            &mut state(&[Shm, Tcp], false),
            failure(&canceled, Shm),
            now,
        );
        assert_eq!(a.next, Next::Fail(FailReason::NotRetryable));
        assert!(!a.recorded && health.is_empty());

        let poll = Failure {
            observer: Observer::Poll,
            ..failure(&e, Shm)
        };
        let no_poll = FailoverPolicy {
            auto_failover_on_poll: false,
            ..FailoverPolicy::default()
        };
        let a = on_failure(&no_poll, &health, &mut state(&[Shm, Tcp], false), poll, now);
        assert_eq!(a.next, Next::Fail(FailReason::PollFailoverDisabled));
    }

    #[test]
    fn a_rail_that_keeps_failing_is_paused_and_ranked_last() {
        let rail = RailPolicy::default();
        let health = HealthTable::new(rail);
        let policy = FailoverPolicy {
            max_failover_attempts: 1000,
            ..FailoverPolicy::default()
        };
        let now = Instant::now();
        let e = io();
        let mut st = state(&[Shm, Rdma, Tcp], false);
        let mut paused = None;
        for i in 0..1000u32 {
            let at = now + Duration::from_millis(u64::from(i));
            let a = on_failure(&policy, &health, &mut st, failure(&e, Shm), at);
            if let Some(until) = a.rail_paused_until {
                assert!(until > at);
                paused = Some((i, a.next));
                break;
            }
        }
        let (errors, next) = paused.expect("the rail pauses");
        assert_eq!(
            errors + 1,
            rail.error_threshold,
            "the threshold-th error pauses it"
        );
        // Paused shm is last: the task moves on to rdma (next after shm in what remains).
        assert_eq!(
            next,
            Next::Retry {
                to: Rdma,
                switches: errors + 1
            }
        );
        assert!(health.is_paused(&(9, Shm), now + Duration::from_millis(u64::from(errors))));
    }
}
