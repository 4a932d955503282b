//! The task gate's races, made deterministic with its pause points. Every wait in these
//! tests is bounded by a watchdog that fails the test instead of hanging it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_bench::{Failure, Gate, GateHooks, RunError, StopSignal};
use ferry_core::TransferStatus;
use ferry_testkit::within;

const BOUND: Duration = Duration::from_secs(10);

fn failure(slot: usize) -> Failure {
    Failure {
        peer: "127.0.0.1:9".into(),
        request: format!("WRITE from slot {slot}"),
        ..Failure::new(TransferStatus::Failed, "injected")
    }
}

#[test]
#[allow(non_snake_case)]
fn FailureBeforeDequeueDoesNotHang() {
    // Worker 0 is held before it takes its task until worker 1's failure has raised stop.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let hooks = GateHooks {
        before_dequeue: Some(Arc::new(move |slot| {
            if slot == 0 {
                let rx = release_rx.lock().unwrap_or_else(|p| p.into_inner());
                rx.recv_timeout(BOUND).expect("worker 0 was never released");
            }
        })),
        after_stop_raised: Some(Arc::new(move |_| {
            let _ = release_tx.send(());
        })),
    };
    let ran0 = Arc::new(AtomicUsize::new(0));
    let ran = ran0.clone();
    let gate = Arc::new(
        Gate::start_with_hooks(2, hooks, move |slot, (), _stop: &StopSignal| {
            if slot == 0 {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(slot)
            } else {
                Err(failure(slot))
            }
        })
        .expect("gate"),
    );

    let g = gate.clone();
    let started = Instant::now();
    let result = within(BOUND, "run", move || g.run(()));
    match result {
        Err(RunError::Failed(f)) => {
            assert_eq!(f.worker, Some(1));
            assert_eq!(f.status, TransferStatus::Failed);
            assert_eq!(f.peer, "127.0.0.1:9");
            assert_eq!(f.request, "WRITE from slot 1");
        }
        other => panic!("expected worker 1's failure, got {other:?}"),
    }
    assert!(started.elapsed() < BOUND);
    assert_eq!(
        ran0.load(Ordering::SeqCst),
        0,
        "worker 0 must not run after stop"
    );
    let r = gate.retirements();
    assert_eq!(r.generation, 1);
    assert_eq!(r.retired, [1, 1], "each slot retired exactly once");
    assert_eq!(r.never_dequeued, [true, false]);
    assert_eq!(r.anomalies, 0);

    let g = gate.clone();
    within(BOUND, "stop", move || g.stop());
    // After stop a run returns at once instead of hanging.
    let g = gate.clone();
    let again = within(BOUND, "run after stop", move || g.run(()));
    assert!(matches!(again, Err(RunError::Stopped { .. })), "{again:?}");
    assert_eq!(
        gate.retirements().generation,
        1,
        "no new generation after stop"
    );
}

#[test]
fn stop_in_the_middle_of_a_run() {
    const N: usize = 4;
    let (entered_tx, entered_rx) = mpsc::channel::<usize>();
    // Never sent on: workers stay blocked on it until stop is raised.
    let (_block_tx, block_rx) = mpsc::channel::<()>();
    let block_rx = Arc::new(Mutex::new(block_rx));
    let entered_tx = Mutex::new(entered_tx);
    let gate = Arc::new(
        Gate::start(N, move |slot, (), stop: &StopSignal| {
            let _ = entered_tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(slot);
            let deadline = Instant::now() + BOUND;
            while !stop.is_raised() {
                if Instant::now() > deadline {
                    return Err(Failure::new(TransferStatus::Timeout, "never stopped"));
                }
                let rx = block_rx.lock().unwrap_or_else(|p| p.into_inner());
                let _ = rx.recv_timeout(Duration::from_millis(2));
            }
            Ok(slot)
        })
        .expect("gate"),
    );
    let g = gate.clone();
    let (run_tx, run_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = run_tx.send(g.run(()));
    });
    // Every worker is inside its task before stop comes.
    for _ in 0..N {
        entered_rx
            .recv_timeout(BOUND)
            .expect("worker entered its task");
    }
    assert!(run_rx.try_recv().is_err(), "run returned before stop");
    let g = gate.clone();
    within(BOUND, "stop from another thread", move || g.stop());
    let result = run_rx.recv_timeout(BOUND).expect("run returned after stop");
    match result {
        Err(RunError::Stopped { partial }) => assert_eq!(partial, [0, 1, 2, 3]),
        other => panic!("expected Stopped, got {other:?}"),
    }
    let r = gate.retirements();
    assert_eq!(r.retired, [1; N]);
    assert_eq!(r.never_dequeued, [false; N]);
    assert_eq!(r.anomalies, 0);
    // stop returned, so every thread is joined; stop again is a no-op and runs refuse.
    let g = gate.clone();
    within(BOUND, "second stop", move || g.stop());
    assert!(matches!(gate.run(()), Err(RunError::Stopped { .. })));
}

#[test]
fn idle_gate_stops_and_drops_promptly() {
    let gate: Gate<(), ()> = Gate::start(3, |_, (), _: &StopSignal| Ok(())).expect("gate");
    assert_eq!(gate.run(()).expect("run").len(), 3);
    within(BOUND, "drop", move || drop(gate));
    assert!(Gate::<(), ()>::start(0, |_, (), _: &StopSignal| Ok(())).is_err());
}

#[test]
fn a_panicking_worker_is_a_failure_not_a_hang() {
    let gate: Gate<u32, ()> = Gate::start(2, |slot, _, _: &StopSignal| {
        if slot == 1 {
            panic!("boom");
        }
        Ok(())
    })
    .expect("gate");
    let gate = Arc::new(gate);
    let g = gate.clone();
    match within(BOUND, "run", move || g.run(7)) {
        Err(RunError::Failed(f)) => {
            assert_eq!(f.worker, Some(1));
            assert!(f.reason.contains("boom"), "{f}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(gate.retirements().retired, [1, 1]);
}

/// A tiny xorshift generator: deterministic and dependency-free.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[test]
fn thousand_runs_with_random_failures_retire_every_slot_once() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut gates_started = 0;
    let mut failed_runs = 0;
    let mut skipped_total = 0;
    let mut gate: Option<(usize, Gate<u64, usize>)> = None;
    let started = Instant::now();

    for run in 0..1000 {
        let (n, g) = gate.get_or_insert_with(|| {
            gates_started += 1;
            let n = 1 + (rng.next() % 6) as usize;
            // Workers pause a pseudo-random number of yields before dequeuing and inside
            // their task, so interleavings vary from run to run.
            let hooks = GateHooks {
                before_dequeue: Some(Arc::new(move |slot| {
                    for _ in 0..mix(slot as u64 ^ 0x55) % 8 {
                        std::thread::yield_now();
                    }
                })),
                after_stop_raised: None,
            };
            let calls = calls.clone();
            let g = Gate::start_with_hooks(n, hooks, move |slot, seed: u64, _: &StopSignal| {
                calls.fetch_add(1, Ordering::SeqCst);
                let r = mix(seed ^ (slot as u64).wrapping_mul(0x1000_0001));
                for _ in 0..r % 16 {
                    std::thread::yield_now();
                }
                // About one worker in 12 fails.
                if (r >> 8) % 12 == 0 {
                    Err(failure(slot))
                } else {
                    Ok(slot)
                }
            })
            .expect("gate");
            (n, g)
        });
        let n = *n;
        calls.store(0, Ordering::SeqCst);
        let result = g.run(rng.next());
        let r = g.retirements();
        assert_eq!(r.retired, vec![1; n], "run {run}: every slot retired once");
        assert_eq!(r.anomalies, 0, "run {run}");
        let skipped = r.never_dequeued.iter().filter(|s| **s).count();
        assert_eq!(
            calls.load(Ordering::SeqCst) + skipped,
            n,
            "run {run}: each slot either ran or was retired untaken"
        );
        match result {
            Ok(stats) => {
                assert_eq!(stats, (0..n).collect::<Vec<_>>(), "run {run}");
                assert_eq!(skipped, 0, "run {run}");
            }
            Err(RunError::Failed(f)) => {
                assert!(f.worker.is_some_and(|w| w < n), "run {run}: {f}");
                failed_runs += 1;
                skipped_total += skipped;
                // A failure stops the gate for good: the next run gets a fresh one.
                assert!(matches!(g.run(0), Err(RunError::Stopped { .. })));
                g.stop();
                gate = None;
            }
            Err(other) => panic!("run {run}: unexpected {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "too slow");
    }
    assert!(failed_runs > 50, "only {failed_runs} runs failed");
    assert!(failed_runs < 950, "{failed_runs} runs failed");
    eprintln!(
        "1000 runs on {gates_started} gates: {failed_runs} failed, {skipped_total} slots retired untaken, {:?}",
        started.elapsed()
    );
}
