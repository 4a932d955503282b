//! Failover over real transports with the fault decorator (TENT's failover behaviours plus
//! Ferry's departures: submit-stage failover, attempt deadlines).

use std::time::{Duration, Instant};

use ferry_core::failover::FailoverPolicy;
use ferry_core::transports::fault::FaultSpec;
use ferry_core::{
    Engine, EngineConfig, EngineEvent, Opcode, Request, TaskSnapshot, TransferStatus, TransportKind,
};
use ferry_testkit::{self as testkit, bytes_at, fill, Pair};

fn config(budget: u32, on_poll: bool, fault: FaultSpec) -> EngineConfig {
    EngineConfig {
        failover: FailoverPolicy {
            max_failover_attempts: budget,
            auto_failover_on_poll: on_poll,
            attempt_timeout: Some(Duration::from_secs(10)),
        },
        faults: vec![(TransportKind::Tcp, fault)],
        transports: vec![TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

/// A target with default settings and an initiator with `cfg`, 4 MiB on each side.
fn rig(cfg: EngineConfig) -> Pair {
    let target = Engine::new(EngineConfig::default()).expect("target");
    let initiator = Engine::new(cfg).expect("initiator");
    let r = Pair::new(target, initiator, 4 << 20);
    fill(&r.local, 7);
    r
}

fn write(r: &Pair, i: u64) -> Request {
    r.request(Opcode::Write, i * 4096, 4096)
}

fn wait_batch(e: &Engine, batch: u64) -> Vec<TaskSnapshot> {
    testkit::wait_batch(e, batch, Duration::from_secs(20))
}

fn landed(r: &Pair, i: u64) -> bool {
    bytes_at(&r.remote, i * 4096, 4096) == bytes_at(&r.local, i * 4096, 4096)
}

fn always_failing_submit() -> FaultSpec {
    FaultSpec {
        submit_failure_rate: 1.0,
        ..FaultSpec::default()
    }
}

#[test]
fn budget_zero_disables_failover() {
    let r = rig(config(0, true, always_failing_submit()));
    let snaps = r
        .initiator
        .transfer_blocking(&[write(&r, 0)])
        .expect("submit");
    assert_eq!(snaps[0].status, TransferStatus::Failed);
    assert_eq!(snaps[0].attempts, 1);
    assert_eq!(r.initiator.metrics().failovers, 0);
}

#[test]
fn budget_one_allows_exactly_one_switch() {
    let r = rig(config(1, true, always_failing_submit()));
    let snaps = r
        .initiator
        .transfer_blocking(&[write(&r, 0)])
        .expect("submit");
    assert_eq!(snaps[0].status, TransferStatus::Failed);
    assert_eq!(snaps[0].attempts, 2);
    assert_eq!(r.initiator.metrics().failovers, 1);
    let events = r.events();
    assert!(
        matches!(
            events.as_slice(),
            [EngineEvent::Failover {
                from: TransportKind::Tcp,
                to: TransportKind::Tcp,
                attempt: 1,
                ..
            }]
        ),
        "{events:?}"
    );
}

#[test]
fn failing_everywhere_exhausts_the_budget_and_the_batch_can_still_be_freed() {
    let r = rig(config(
        3,
        true,
        FaultSpec {
            corrupt_completion_rate: 1.0,
            ..FaultSpec::default()
        },
    ));
    let batch = r.initiator.allocate_batch(4).expect("batch");
    r.initiator
        .submit_transfer(batch, &[write(&r, 0), write(&r, 1)])
        .expect("submit");
    let snaps = wait_batch(&r.initiator, batch);
    for s in &snaps {
        assert_eq!(s.status, TransferStatus::Failed);
        assert_eq!(s.attempts, 4, "1 attempt + 3 switches");
    }
    assert_eq!(
        r.initiator.batch_status(batch).expect("status").status,
        TransferStatus::Failed
    );
    r.initiator
        .free_batch(batch)
        .expect("free after exhaustion");
    assert_eq!(r.initiator.metrics().failovers, 6);
}

#[test]
fn poll_failover_off_leaves_polled_tasks_failed_and_never_revives_them() {
    let r = rig(config(
        3,
        false,
        FaultSpec {
            corrupt_completion_rate: 1.0,
            ..FaultSpec::default()
        },
    ));
    let batch = r.initiator.allocate_batch(4).expect("batch");
    r.initiator
        .submit_transfer(batch, &[write(&r, 0)])
        .expect("submit");
    let snaps = wait_batch(&r.initiator, batch);
    assert_eq!(snaps[0].status, TransferStatus::Failed);
    assert_eq!(snaps[0].attempts, 1, "polling only observes: no failover");
    assert_eq!(
        r.initiator.transfer_status(batch, 0).expect("task").status,
        TransferStatus::Failed
    );
    assert_eq!(
        r.initiator.batch_status(batch).expect("overall").status,
        TransferStatus::Failed
    );
    // observed FAILED stays FAILED
    std::thread::sleep(Duration::from_millis(100));
    let again = r.initiator.transfer_status(batch, 0).expect("task");
    assert_eq!((again.status, again.attempts), (TransferStatus::Failed, 1));
    // ... while the progress (Promise) path still fails over.
    let progressed = r
        .initiator
        .transfer_blocking(&[write(&r, 1)])
        .expect("progress");
    assert_eq!(progressed[0].attempts, 4);
}

#[test]
fn submit_stage_failures_fail_over_and_budgets_are_per_task() {
    let fault = FaultSpec {
        submit_failure_rate: 0.5,
        seed: 11,
        ..FaultSpec::default()
    };
    let r = rig(config(3, true, fault));
    let reqs: Vec<_> = (0..200).map(|i| write(&r, i)).collect();
    let batch = r.initiator.allocate_batch(200).expect("batch");
    r.initiator.submit_transfer(batch, &reqs).expect("submit");
    let snaps = wait_batch(&r.initiator, batch);
    let mut by_attempts = [0usize; 5];
    for (i, s) in snaps.iter().enumerate() {
        assert!(s.attempts >= 1 && s.attempts <= 4, "{s:?}");
        by_attempts[s.attempts as usize] += 1;
        match s.status {
            TransferStatus::Completed => {
                assert!(landed(&r, i as u64), "task {i} completed but bytes differ")
            }
            TransferStatus::Failed => assert_eq!(s.attempts, 4, "failed before its budget ran out"),
            other => panic!("unexpected {other:?}"),
        }
    }
    // Some tasks failed over at submit and then completed; others needed no failover:
    // one task's failures never spent another's budget.
    assert!(
        by_attempts[1] > 0 && by_attempts[2] > 0 && by_attempts[3] > 0,
        "{by_attempts:?}"
    );
    assert!(snaps
        .iter()
        .any(|s| s.status == TransferStatus::Completed && s.attempts > 1));
}

#[test]
fn mixed_faults_over_many_submissions_end_every_task() {
    let fault = FaultSpec {
        submit_failure_rate: 0.2,
        corrupt_completion_rate: 0.2,
        seed: 42,
        ..FaultSpec::default()
    };
    let r = rig(config(3, true, fault));
    let mut completed = 0;
    for round in 0..10u64 {
        let reqs: Vec<_> = (0..50)
            .map(|i| write(&r, (round * 50 + i) % 1024))
            .collect();
        let snaps = r.initiator.transfer_blocking(&reqs).expect("transfer");
        for s in snaps {
            assert!(
                s.status == TransferStatus::Completed
                    || (s.status == TransferStatus::Failed && s.attempts == 4)
            );
            completed += usize::from(s.status == TransferStatus::Completed);
        }
    }
    assert!(completed > 450, "completed {completed} of 500");
    let m = r.initiator.metrics();
    assert_eq!(m.tasks_submitted, 500);
    assert_eq!(m.tasks_completed + m.tasks_failed, 500);
    assert!(m.failovers > 100);
}

#[test]
fn a_pending_task_keeps_the_batch_from_reporting_failed_early() {
    // The first submission is delayed 300 ms; every later one fails at once (budget 0).
    let fault = FaultSpec {
        fail_after_submits: Some(1),
        delay: Some(Duration::from_millis(300)),
        ..FaultSpec::default()
    };
    let r = rig(config(0, true, fault));
    let batch = r.initiator.allocate_batch(4).expect("batch");
    r.initiator
        .submit_transfer(batch, &[write(&r, 0), write(&r, 1)])
        .expect("submit");
    assert_eq!(
        r.initiator.transfer_status(batch, 1).expect("t1").status,
        TransferStatus::Failed
    );
    assert_eq!(
        r.initiator.transfer_status(batch, 0).expect("t0").status,
        TransferStatus::Pending
    );
    assert_eq!(
        r.initiator.batch_status(batch).expect("overall").status,
        TransferStatus::Pending
    );
    let snaps = wait_batch(&r.initiator, batch);
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    assert_eq!(
        r.initiator.batch_status(batch).expect("overall").status,
        TransferStatus::Failed
    );
}

#[test]
fn attempts_past_their_deadline_fail_over_and_end_timeout() {
    let mut cfg = config(
        1,
        true,
        FaultSpec {
            delay: Some(Duration::from_millis(400)),
            ..FaultSpec::default()
        },
    );
    cfg.failover.attempt_timeout = Some(Duration::from_millis(100));
    let r = rig(cfg);
    let started = Instant::now();
    let snaps = r
        .initiator
        .transfer_blocking(&[write(&r, 0)])
        .expect("transfer");
    assert_eq!(snaps[0].status, TransferStatus::Timeout, "{:?}", snaps[0]);
    assert_eq!(snaps[0].attempts, 2, "the first timeout failed over");
    assert!(
        started.elapsed() < Duration::from_millis(390),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.initiator.metrics().attempt_timeouts, 2);
    // a late completion of a timed-out attempt never revives the task
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(r.initiator.metrics().tasks_completed, 0);
}

#[test]
fn a_transport_that_fails_to_install_is_never_selected() {
    let cfg = config(
        3,
        true,
        FaultSpec {
            fail_install: true,
            ..FaultSpec::default()
        },
    );
    let target = Engine::new(EngineConfig::default()).expect("target");
    let initiator = Engine::new(cfg).expect("initiator");
    let r = Pair::new(target, initiator, 4096);
    let err = r
        .initiator
        .transfer_blocking(&[write(&r, 0)])
        .expect_err("no transport");
    assert_eq!(err.code(), "ERR_FERRY_TRANSPORT_UNAVAILABLE");
}

/// Both engines on this host: shm first, tcp second.
fn shm_and_tcp(budget: u32, faults: Vec<(TransportKind, FaultSpec)>) -> EngineConfig {
    EngineConfig {
        failover: FailoverPolicy {
            max_failover_attempts: budget,
            ..FailoverPolicy::default()
        },
        faults,
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

#[test]
fn status_corruption_fails_over_to_the_secondary() {
    let corrupt_shm = FaultSpec {
        corrupt_completion_rate: 1.0,
        ..FaultSpec::default()
    };
    let r = rig(shm_and_tcp(3, vec![(TransportKind::Shm, corrupt_shm)]));
    let snaps = r
        .initiator
        .transfer_blocking(&[write(&r, 0)])
        .expect("transfer");
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    assert_eq!(snaps[0].transport, Some(TransportKind::Tcp));
    assert_eq!(snaps[0].attempts, 2);
    assert!(landed(&r, 0));
    let events = r.events();
    assert!(
        matches!(
            events.as_slice(),
            [EngineEvent::Failover {
                from: TransportKind::Shm,
                to: TransportKind::Tcp,
                attempt: 1,
                ..
            }]
        ),
        "{events:?}"
    );
}

#[test]
fn both_transports_failing_alternate_until_the_budget_is_spent() {
    let r = rig(shm_and_tcp(
        3,
        vec![
            (
                TransportKind::Shm,
                FaultSpec {
                    corrupt_completion_rate: 1.0,
                    ..FaultSpec::default()
                },
            ),
            (
                TransportKind::Tcp,
                FaultSpec {
                    submit_failure_rate: 1.0,
                    ..FaultSpec::default()
                },
            ),
        ],
    ));
    let batch = r.initiator.allocate_batch(1).expect("batch");
    r.initiator
        .submit_transfer(batch, &[write(&r, 0)])
        .expect("submit");
    let snaps = wait_batch(&r.initiator, batch);
    assert_eq!(
        (snaps[0].status, snaps[0].attempts),
        (TransferStatus::Failed, 4)
    );
    let hops: Vec<_> = r
        .events()
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Failover { from, to, .. } => Some((*from, *to)),
            _ => None,
        })
        .collect();
    use TransportKind::{Shm, Tcp};
    assert_eq!(hops, [(Shm, Tcp), (Tcp, Shm), (Shm, Tcp)]);
    r.initiator.free_batch(batch).expect("free");
}

#[test]
fn a_timed_out_attempt_fails_over_and_completes_elsewhere() {
    let slow_shm = FaultSpec {
        delay: Some(Duration::from_millis(500)),
        ..FaultSpec::default()
    };
    let mut cfg = shm_and_tcp(3, vec![(TransportKind::Shm, slow_shm)]);
    cfg.failover.attempt_timeout = Some(Duration::from_millis(100));
    let r = rig(cfg);
    let started = Instant::now();
    let snaps = r
        .initiator
        .transfer_blocking(&[write(&r, 0)])
        .expect("transfer");
    assert_eq!(snaps[0].status, TransferStatus::Completed, "{:?}", snaps[0]);
    assert_eq!(
        (snaps[0].transport, snaps[0].attempts),
        (Some(TransportKind::Tcp), 2)
    );
    assert!(started.elapsed() < Duration::from_millis(450));
    assert_eq!(r.initiator.metrics().attempt_timeouts, 1);
    assert!(landed(&r, 0));
}

#[test]
fn a_transport_that_keeps_failing_is_ranked_last_for_a_cooldown() {
    let corrupt_shm = FaultSpec {
        corrupt_completion_rate: 1.0,
        ..FaultSpec::default()
    };
    let r = rig(shm_and_tcp(3, vec![(TransportKind::Shm, corrupt_shm)]));
    // Three failures of shm towards this peer within the window pause it...
    for i in 0..3 {
        let s = r
            .initiator
            .transfer_blocking(&[write(&r, i)])
            .expect("transfer");
        assert_eq!(
            (s[0].transport, s[0].attempts),
            (Some(TransportKind::Tcp), 2)
        );
    }
    // ... so the next requests go to tcp first, without a failed attempt.
    for i in 3..6 {
        let s = r
            .initiator
            .transfer_blocking(&[write(&r, i)])
            .expect("transfer");
        assert_eq!(
            (s[0].status, s[0].transport, s[0].attempts),
            (TransferStatus::Completed, Some(TransportKind::Tcp), 1)
        );
    }
    assert_eq!(r.initiator.metrics().failovers, 3);
}
