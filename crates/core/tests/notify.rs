//! Notifications riding on transfers, two engines in one process: the target's handler
//! finds the data in place, nothing for a call that did not complete, exactly one across
//! failover, order per sender, a bounded queue whose overflow is counted.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::failover::FailoverPolicy;
use ferry_core::notify::InboxSignal;
use ferry_core::transports::fault::FaultSpec;
use ferry_core::{
    Engine, EngineConfig, NotifyConfig, NotifyOutcome, Opcode, TransferStatus, TransportKind,
};
use ferry_testkit::notes::{handler, payloads, wait_for};
use ferry_testkit::{bytes_at, fill, wait_batch, within, Pair};

const LIMIT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

fn pair(initiator: EngineConfig, target: EngineConfig) -> Pair {
    let r = Pair::new(
        Engine::new(target).expect("target"),
        Engine::new(initiator).expect("initiator"),
        4 << 20,
    );
    fill(&r.local, 9);
    r
}

fn transfer_notify(
    r: &Pair,
    reqs: &[ferry_core::Request],
    note: &str,
) -> (Vec<TransferStatus>, Option<String>) {
    let (tx, rx) = mpsc::channel();
    r.initiator
        .transfer_notify(reqs, note.as_bytes().to_vec(), move |snaps, err| {
            let _ = tx.send((
                snaps.iter().map(|s| s.status).collect::<Vec<_>>(),
                err.map(|e| e.code().to_string()),
            ));
        })
        .expect("submit");
    rx.recv_timeout(WAIT).expect("transfer ended")
}

#[test]
fn the_handler_finds_the_data_and_the_sender_name() {
    within(LIMIT, "data then notification", || {
        for kind in [TransportKind::Tcp, TransportKind::Shm] {
            let cfg = EngineConfig {
                transports: vec![kind],
                ..EngineConfig::default()
            };
            let r = pair(cfg.clone(), cfg);
            let expected = bytes_at(&r.local, 0, 4 << 20);
            let (seen, ticks) = handler(&r, expected);
            for i in 0..20u64 {
                let off = i * 200_000;
                let req = r.request(Opcode::Write, off, 200_000);
                let (statuses, err) = transfer_notify(&r, &[req], &format!("{off}:200000"));
                assert_eq!(statuses, [TransferStatus::Completed]);
                assert_eq!(err, None);
            }
            wait_for(&ticks, 20);
            let seen = seen.lock().expect("seen");
            assert_eq!(seen.len(), 20, "{kind:?}");
            for (n, landed) in seen.iter() {
                assert!(
                    landed,
                    "{kind:?}: the bytes were there when {:?} came",
                    n.data
                );
                assert_eq!(n.from, r.initiator.segment_name());
                assert_eq!(n.engine_id, r.initiator.engine_id());
                assert_eq!(n.bytes, 200_000);
            }
            assert_eq!(r.initiator.metrics().notifications.sent, 20);
            assert_eq!(r.target.metrics().notifications.received, 20);
        }
    });
}

#[test]
fn failing_without_failover_sends_nothing_and_failover_sends_exactly_one() {
    within(LIMIT, "failover", || {
        // No failover: the call fails, nothing is sent. The barrier notification after it
        // is the first and only one the target sees.
        let failing = EngineConfig {
            transports: vec![TransportKind::Tcp],
            failover: FailoverPolicy {
                max_failover_attempts: 0,
                ..FailoverPolicy::default()
            },
            faults: vec![(
                TransportKind::Tcp,
                FaultSpec {
                    submit_failure_rate: 1.0,
                    ..FaultSpec::default()
                },
            )],
            ..EngineConfig::default()
        };
        let r = pair(failing, EngineConfig::default());
        let (seen, ticks) = handler(&r, bytes_at(&r.local, 0, 4 << 20));
        let reqs = [r.request(Opcode::Write, 0, 1 << 20)];
        let (statuses, err) = transfer_notify(&r, &reqs, "failed");
        assert_eq!(statuses, [TransferStatus::Failed]);
        assert_eq!(err, None, "no notification, so no delivery error either");
        assert_eq!(
            r.initiator.notify_blocking(r.seg, b"barrier"),
            Ok(NotifyOutcome::Queued)
        );
        wait_for(&ticks, 1);
        assert_eq!(payloads(&seen), ["barrier"]);
        drop(r);

        // Every shm attempt moves the bytes and then reads as failed: each task fails
        // over to tcp mid-way. The call notifies once.
        let flaky = EngineConfig {
            transports: vec![TransportKind::Shm, TransportKind::Tcp],
            faults: vec![(
                TransportKind::Shm,
                FaultSpec {
                    corrupt_completion_rate: 1.0,
                    ..FaultSpec::default()
                },
            )],
            ..EngineConfig::default()
        };
        let r = pair(flaky, EngineConfig::default());
        let (seen, ticks) = handler(&r, bytes_at(&r.local, 0, 4 << 20));
        let reqs: Vec<_> = (0..8)
            .map(|i| r.request(Opcode::Write, i << 19, 1 << 19))
            .collect();
        let (statuses, err) = transfer_notify(&r, &reqs, "0:4194304");
        assert_eq!(statuses, [TransferStatus::Completed; 8]);
        assert_eq!(err, None);
        assert!(
            r.initiator.metrics().failovers >= 8,
            "every task failed over"
        );
        r.initiator
            .notify_blocking(r.seg, b"barrier")
            .expect("barrier");
        wait_for(&ticks, 2);
        assert_eq!(payloads(&seen), ["0:4194304", "barrier"]);
        assert!(seen.lock().expect("seen")[0].1, "all 4 MiB were there");
    });
}

#[test]
fn batches_notify_once_when_the_submission_completed() {
    within(LIMIT, "batch", || {
        let r = pair(EngineConfig::default(), EngineConfig::default());
        let (seen, ticks) = handler(&r, bytes_at(&r.local, 0, 4 << 20));
        let batch = r.initiator.allocate_batch(16).expect("batch");
        let reqs: Vec<_> = (0..16)
            .map(|i| r.request(Opcode::Write, i << 18, 1 << 18))
            .collect();
        r.initiator
            .submit_transfer_notify(batch, &reqs, b"0:4194304".to_vec())
            .expect("submit");
        let snaps = wait_batch(&r.initiator, batch, WAIT);
        assert!(snaps.iter().all(|s| s.status == TransferStatus::Completed));
        wait_for(&ticks, 1);
        r.initiator
            .notify_blocking(r.seg, b"barrier")
            .expect("barrier");
        wait_for(&ticks, 1);
        assert_eq!(payloads(&seen), ["0:4194304", "barrier"]);
        assert!(seen.lock().expect("seen")[0].1);
    });
}

#[test]
fn order_per_sender_and_a_bounded_queue() {
    within(LIMIT, "flood", || {
        let target = EngineConfig {
            notify: NotifyConfig {
                queue_size: 16,
                ..NotifyConfig::default()
            },
            ..EngineConfig::default()
        };
        let r = pair(EngineConfig::default(), target);
        let drops: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let d = drops.clone();
        r.target.set_notification_waker(Some(Arc::new(move |sig| {
            if matches!(sig, InboxSignal::Dropped { .. }) {
                d.lock().expect("drops").push(sig);
            }
        })));
        // Nobody takes: the queue fills at 16, the rest is dropped and counted. All are
        // in flight at once (pipelined on the connection), in the order of the calls.
        let (tx, rx) = mpsc::channel();
        for i in 0..100u32 {
            let sent = r.initiator.notify(r.seg, format!("{i}").as_bytes());
            let tx = tx.clone();
            r.initiator
                .spawn(async move {
                    let _ = tx.send((i, sent.await));
                })
                .expect("spawn");
        }
        let outcomes: Vec<(u32, ferry_core::Result<NotifyOutcome>)> = (0..100)
            .map(|_| rx.recv_timeout(WAIT).expect("outcome"))
            .collect();
        let queued = outcomes
            .iter()
            .filter(|(_, o)| *o == Ok(NotifyOutcome::Queued))
            .count();
        let dropped = outcomes
            .iter()
            .filter(|(_, o)| *o == Ok(NotifyOutcome::Dropped))
            .count();
        assert_eq!((queued, dropped), (16, 84));
        let m = r.target.metrics().notifications;
        assert_eq!((m.received, m.dropped, m.queued), (16, 84, 16));
        assert!(r
            .target
            .metrics()
            .to_prometheus()
            .contains("ferry_notifications_dropped_total 84\n"));
        assert_eq!(
            drops.lock().expect("drops").len(),
            1,
            "one signal for the run of drops"
        );
        // The 16 kept are in the order they were sent.
        let got: Vec<u32> = r
            .target
            .take_notifications(100)
            .expect("take")
            .iter()
            .map(|n| String::from_utf8_lossy(&n.data).parse().expect("number"))
            .collect();
        assert_eq!(got, (0..16).collect::<Vec<u32>>(), "the first 16, in order");
        for (i, o) in &outcomes {
            let expected = if *i < 16 {
                NotifyOutcome::Queued
            } else {
                NotifyOutcome::Dropped
            };
            assert_eq!(*o, Ok(expected), "notification {i}");
        }
    });
}

#[test]
fn bad_payloads_and_targets_are_refused_before_anything_moves() {
    within(LIMIT, "bad input", || {
        let r = pair(EngineConfig::default(), EngineConfig::default());
        let big = vec![0u8; 4097];
        let e = r
            .initiator
            .notify_blocking(r.seg, &big)
            .expect_err("too large");
        assert_eq!(e.code(), "ERR_FERRY_NOTIFY_TOO_LARGE");
        let req = r.request(Opcode::Write, 0, 4096);
        let e = r
            .initiator
            .transfer_notify(std::slice::from_ref(&req), big, |_, _| {})
            .expect_err("too large");
        assert_eq!(e.code(), "ERR_FERRY_NOTIFY_TOO_LARGE");
        let other = Engine::new(EngineConfig::default()).expect("other");
        let seg2 = r
            .initiator
            .open_segment_blocking(other.segment_name())
            .expect("open")
            .handle;
        let mut elsewhere = req.clone();
        elsewhere.segment = seg2;
        let e = r
            .initiator
            .transfer_notify(&[req, elsewhere], b"x".to_vec(), |_, _| {})
            .expect_err("two targets");
        assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT");
        assert_eq!(r.initiator.metrics().tasks_submitted, 0, "nothing moved");
        // A target with a lower cap refuses what this sender allows.
        let small = Engine::new(EngineConfig {
            notify: NotifyConfig {
                max_bytes: 8,
                ..NotifyConfig::default()
            },
            ..EngineConfig::default()
        })
        .expect("small");
        let seg3 = r
            .initiator
            .open_segment_blocking(small.segment_name())
            .expect("open")
            .handle;
        let e = r
            .initiator
            .notify_blocking(seg3, b"123456789")
            .expect_err("refused");
        assert_eq!(e.code(), "ERR_FERRY_REMOTE_REJECTED");
        assert_eq!(
            r.initiator.notify_blocking(seg3, b"12345678"),
            Ok(NotifyOutcome::Queued)
        );
        other.close();
        small.close();
    });
}

#[test]
fn a_closed_target_fails_the_notification_in_bounded_time() {
    within(LIMIT, "closed target", || {
        let cfg = EngineConfig {
            peer_timeout: Duration::from_millis(500),
            ..EngineConfig::default()
        };
        let r = pair(cfg.clone(), cfg);
        assert_eq!(
            r.initiator.notify_blocking(r.seg, b"one"),
            Ok(NotifyOutcome::Queued)
        );
        r.target.close();
        let e = r
            .initiator
            .notify_blocking(r.seg, b"two")
            .expect_err("target gone");
        assert!(
            [
                "ERR_FERRY_PEER_LOST",
                "ERR_FERRY_CONNECT",
                "ERR_FERRY_IO",
                "ERR_FERRY_TIMEOUT"
            ]
            .contains(&e.code()),
            "{e:?}"
        );
        assert_eq!(r.initiator.metrics().notifications.failed, 1);
    });
}

#[test]
fn concurrent_senders_to_one_target_lose_nothing_as_duplicates() {
    within(LIMIT, "concurrent senders", || {
        let target = EngineConfig {
            notify: NotifyConfig {
                queue_size: 1 << 16,
                ..NotifyConfig::default()
            },
            ..EngineConfig::default()
        };
        let r = pair(EngineConfig::default(), target);
        // Threads hand notifications to the one outbox of the target at once. Each must
        // leave with the next sequence number of the session: the target takes one at or
        // below the last it took for a resend (answered, not queued again) and refuses one
        // beyond the next.
        const THREADS: usize = 4;
        const EACH: usize = 2000;
        let (tx, rx) = mpsc::channel();
        let senders: Vec<_> = (0..THREADS)
            .map(|t| {
                let (initiator, seg, tx) = (r.initiator.clone(), r.seg, tx.clone());
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let sent = initiator.notify(seg, format!("{t}:{i}").as_bytes());
                        let tx = tx.clone();
                        initiator
                            .spawn(async move {
                                let _ = tx.send(sent.await);
                            })
                            .expect("spawn");
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().expect("sender");
        }
        let mut outcomes: Vec<ferry_core::Result<NotifyOutcome>> = (0..THREADS * EACH)
            .map(|_| rx.recv_timeout(WAIT).expect("outcome"))
            .collect();
        outcomes.retain(|o| *o != Ok(NotifyOutcome::Queued));
        assert_eq!(outcomes, [], "every notification queued once");
        let m = r.target.metrics().notifications;
        assert_eq!((m.received, m.dropped), ((THREADS * EACH) as u64, 0));
        // Each thread's notifications arrive in its order.
        let mut next = [0usize; THREADS];
        for n in r.target.take_notifications(THREADS * EACH).expect("take") {
            let text = String::from_utf8_lossy(&n.data).into_owned();
            let (t, i) = text.split_once(':').expect("t:i");
            let (t, i): (usize, usize) = (t.parse().expect("t"), i.parse().expect("i"));
            assert_eq!(i, next[t], "thread {t}'s order");
            next[t] += 1;
        }
        assert_eq!(next, [EACH; THREADS]);
    });
}
