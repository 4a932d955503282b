//! Loom models of the gate (`npm run test:model`), a child module of `gate` kept in a file
//! of its own.

use std::sync::atomic::AtomicU32;

use super::*;

/// Preemptions per explored interleaving (unless `LOOM_MAX_PREEMPTIONS` says): three
/// take every model here about a minute on one core, and each seeded bug is found
/// with two.
const PREEMPTIONS: usize = 3;

fn explore(model: impl Fn() + Send + Sync + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(PREEMPTIONS);
    builder.check(model);
}

/// A model's gate, stopped (its threads joined) as it is dropped, unless a check
/// failed: loom's execution is over then, and joining would abort the test binary.
struct Modelled(Option<Gate<u32, usize>>);

impl std::ops::Deref for Modelled {
    type Target = Gate<u32, usize>;
    fn deref(&self) -> &Gate<u32, usize> {
        self.0.as_ref().expect("gate")
    }
}

impl Drop for Modelled {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::mem::forget(self.0.take());
        }
    }
}

/// How often each slot's worker function ran, per task (the tasks are 1 and 2). Plain
/// std atomics: an observation of the model, not part of what loom interleaves.
struct Calls([[AtomicU32; 2]; 2]);

impl Calls {
    fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self(Default::default()))
    }

    fn record(&self, slot: usize, task: u32) {
        self.0[slot][task as usize - 1].fetch_add(1, Ordering::Relaxed);
    }

    fn of(&self, slot: usize, task: u32) -> u32 {
        self.0[slot][task as usize - 1].load(Ordering::Relaxed)
    }
}

/// A gate of two workers; `fails` is the slot whose task fails, if any.
fn gate(calls: &std::sync::Arc<Calls>, fails: Option<usize>) -> Modelled {
    let calls = calls.clone();
    let gate = Gate::start(2, move |slot, task: u32, _stop: &StopSignal| {
        calls.record(slot, task);
        if fails == Some(slot) {
            Err(Failure::new(TransferStatus::Failed, "injected"))
        } else {
            Ok(slot)
        }
    });
    Modelled(Some(gate.expect("gate")))
}

/// Every slot of `task`'s generation was retired once: its task ran once, or was
/// retired untaken and never ran.
fn each_slot_retired_once(gate: &Gate<u32, usize>, calls: &Calls, task: u32) {
    let r = gate.retirements();
    assert_eq!(r.generation, u64::from(task));
    assert_eq!(r.retired, [1, 1], "each slot retired exactly once");
    assert_eq!(r.anomalies, 0);
    for slot in 0..2 {
        let ran = calls.of(slot, task);
        assert_eq!(
            ran + u32::from(r.never_dequeued[slot]),
            1,
            "slot {slot}: ran {ran} times, untaken: {}",
            r.never_dequeued[slot]
        );
    }
}

#[test]
fn a_failure_while_another_worker_has_not_taken_its_task_ends_the_run() {
    explore(|| {
        let calls = Calls::new();
        let gate = gate(&calls, Some(1));
        match gate.run(1) {
            Err(RunError::Failed(f)) => assert_eq!(f.worker, Some(1)),
            other => panic!("expected worker 1's failure, got {other:?}"),
        }
        each_slot_retired_once(&gate, &calls, 1);
        assert_eq!(calls.of(1, 1), 1, "the failing task ran");
        assert!(matches!(gate.run(2), Err(RunError::Stopped { .. })));
    });
}

#[test]
fn a_stop_from_another_thread_ends_a_run_with_every_slot_retired_once() {
    explore(|| {
        let calls = Calls::new();
        let gate = Arc::new(gate(&calls, None));
        let stopper = {
            let gate = gate.clone();
            thread::spawn(move || gate.stop())
        };
        let result = gate.run(1);
        stopper.join().expect("stopper");
        match result {
            Ok(stats) => assert_eq!(stats, [0, 1]),
            Err(RunError::Stopped { partial }) => {
                let ran: Vec<usize> = (0..2).filter(|&s| calls.of(s, 1) == 1).collect();
                assert_eq!(partial, ran, "the results of the tasks that ran");
            }
            Err(other) => panic!("{other:?}"),
        }
        if gate.retirements().generation == 1 {
            each_slot_retired_once(&gate, &calls, 1);
        } else {
            assert_eq!(calls.of(0, 1) + calls.of(1, 1), 0, "no run, no task");
        }
        assert!(matches!(gate.run(2), Err(RunError::Stopped { .. })));
    });
}

#[test]
fn consecutive_runs_hand_each_worker_each_task_once() {
    explore(|| {
        let calls = Calls::new();
        let gate = gate(&calls, None);
        assert_eq!(gate.run(1).expect("first run"), [0, 1]);
        each_slot_retired_once(&gate, &calls, 1);
        assert_eq!(gate.run(2).expect("second run"), [0, 1]);
        each_slot_retired_once(&gate, &calls, 2);
        assert_eq!([calls.of(0, 1), calls.of(1, 1)], [1, 1], "task 1 once each");
    });
}
