//! Bench workers against real ferry-core engines over loopback TCP, in one process.
//! Every wait is bounded: a hang fails the test.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use ferry_bench::{
    bench_gate, Addressing, Backoff, BenchSpec, GateHooks, ReportRow, RunError, Stripe,
    DEFAULT_STALL_TIMEOUT,
};
use ferry_core::{Engine, EngineConfig, Opcode, Request, TransferStatus, TransportKind};

use ferry_testkit::{request, within, Pair};

const BOUND: Duration = Duration::from_secs(20);

fn tcp(io_threads: usize) -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Tcp],
        peer_timeout: Duration::from_millis(1000),
        io_threads,
        ..EngineConfig::default()
    }
}

struct Rig {
    pair: Pair,
    spec: BenchSpec,
}

/// A target and an initiator with `stripes` stripes of `stripe_len` bytes on each side.
fn rig(stripes: u64, stripe_len: u64, block: u64, batch: usize, duration: Duration) -> Rig {
    let target = Engine::new(tcp(2)).expect("target");
    let initiator = Engine::new(tcp(2)).expect("initiator");
    let pair = Pair::new(target, initiator, stripes * stripe_len);
    let spec = BenchSpec {
        opcode: Opcode::Write,
        block_size: block,
        batch_size: batch,
        local: pair.local.id(),
        segment: pair.seg,
        peer: pair.peer.clone(),
        remote_buffer: pair.remote.id(),
        extra_targets: Vec::new(),
        stripe: Stripe {
            base: 0,
            len: stripe_len,
        },
        addressing: Addressing::Walk,
        transport: Some(TransportKind::Tcp),
        duration,
        warmup: Duration::from_millis(50),
        request_interval_us: 0,
        stall_timeout: DEFAULT_STALL_TIMEOUT,
        notify: false,
    };
    Rig { pair, spec }
}

#[test]
fn workers_run_end_to_end_over_loopback() {
    let rig = rig(2, 1 << 20, 64 << 10, 2, Duration::from_millis(300));
    let gate =
        Arc::new(bench_gate(rig.pair.initiator.clone(), 2, GateHooks::default()).expect("gate"));
    for opcode in [Opcode::Write, Opcode::Read] {
        let spec = BenchSpec {
            opcode,
            ..rig.spec.clone()
        };
        let g = gate.clone();
        let s = spec.clone();
        let started = Instant::now();
        let stats = within(BOUND, "run", move || g.run(s)).expect("run completes");
        let elapsed = started.elapsed();
        assert_eq!(stats.len(), 2);
        for w in &stats {
            assert!(w.ops > 0, "{opcode:?}: a worker did nothing");
            assert_eq!(w.bytes, w.ops * spec.op_bytes());
            assert!(w.wall >= spec.duration, "{:?}", w.wall);
            assert!(w.tx_total <= w.wall, "op time exceeds wall time");
        }
        let row = ReportRow::from_stats(spec.block_size, spec.batch_size, &stats).expect("row");
        assert_eq!(row.threads, 2);
        assert_eq!(row.ops, stats.iter().map(|w| w.ops).sum::<u64>() as f64);
        assert!(row.bw_gbps > 0.0 && row.bw_gbps.is_finite());
        assert!(row.avg_inst_gbps > 0.0 && row.avg_inst_gbps.is_finite());
        assert!(row.avg_tx_us > 0.0);
        // Each thread's wall time covers its operations, so Avg Lat ≥ Avg Tx.
        assert!(row.avg_lat_us >= row.avg_tx_us, "{row:?}");
        assert!(
            row.p999_tx_us >= row.p99_tx_us && row.p99_tx_us > 0.0,
            "{row:?}"
        );
        // Bandwidth and latency agree: BW ≈ threads × op bytes / Avg Lat.
        let implied = 2.0 * spec.op_bytes() as f64 / row.avg_lat_us / 1e3;
        assert!(
            (implied - row.bw_gbps).abs() <= 1e-6 * implied,
            "{implied} vs {row:?}"
        );
        eprintln!(
            "{opcode:?} in {elapsed:?}\n{}\n{}",
            ReportRow::header(),
            row.to_line()
        );
    }
    assert_eq!(gate.retirements().retired, [1, 1]);
    gate.stop();
    rig.pair.initiator.close();
    rig.pair.target.close();
}

#[test]
fn a_batch_that_does_not_fit_fails_invalid_without_moving_anything() {
    let rig = rig(1, 1 << 20, 64 << 10, 2, Duration::from_millis(100));
    let gate = bench_gate(rig.pair.initiator.clone(), 1, GateHooks::default()).expect("gate");
    // The remote buffer is one stripe; a second worker's stripe would lie past its end,
    // but here one worker asks for a block bigger than the stripe itself.
    let spec = BenchSpec {
        block_size: 1 << 20,
        ..rig.spec.clone()
    };
    match gate.run(spec) {
        Err(RunError::Failed(f)) => assert_eq!(f.status, TransferStatus::Invalid, "{f}"),
        other => panic!("{other:?}"),
    }
    // A stripe that the engine refuses (past the remote buffer's end): INVALID from
    // submit_transfer, with the engine's code and the request named.
    let gate = bench_gate(rig.pair.initiator.clone(), 1, GateHooks::default()).expect("gate");
    let spec = BenchSpec {
        stripe: Stripe {
            base: 1 << 20,
            len: 1 << 20,
        },
        ..rig.spec.clone()
    };
    match gate.run(spec) {
        Err(RunError::Failed(f)) => {
            assert_eq!(f.status, TransferStatus::Invalid, "{f}");
            assert_eq!(f.code.as_deref(), Some("ERR_FERRY_OUT_OF_RANGE"), "{f}");
            assert!(f.request.contains("submit_transfer"), "{f}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.pair.initiator.metrics().tasks_submitted, 0);
    rig.pair.initiator.close();
    rig.pair.target.close();
}

#[test]
fn target_death_mid_run_fails_with_status_transport_and_peer() {
    let rig = rig(4, 1 << 20, 64 << 10, 1, Duration::from_secs(60));
    let gate =
        Arc::new(bench_gate(rig.pair.initiator.clone(), 4, GateHooks::default()).expect("gate"));
    let (tx, rx) = mpsc::channel();
    let (g, spec) = (gate.clone(), rig.spec.clone());
    std::thread::spawn(move || {
        let _ = tx.send(g.run(spec));
    });
    // Wait (bounded) until work is flowing, then kill the target.
    let deadline = Instant::now() + BOUND;
    while rig.pair.initiator.metrics().tasks_completed < 50 {
        assert!(Instant::now() < deadline, "no work completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let peer = rig.pair.target.segment_name().to_string();
    let killed = Instant::now();
    rig.pair.target.close();
    let result = rx
        .recv_timeout(BOUND)
        .expect("run returned after target death");
    let took = killed.elapsed();
    match result {
        Err(RunError::Failed(f)) => {
            assert_eq!(f.status, TransferStatus::Failed, "{f}");
            assert_eq!(f.transport, Some(TransportKind::Tcp), "{f}");
            assert_eq!(f.peer, peer, "{f}");
            assert!(f.request.contains("WRITE"), "{f}");
            eprintln!("after {took:?}: {f}");
        }
        other => panic!("expected FAILED, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "failure took {took:?}");
    assert_eq!(gate.retirements().retired, [1; 4]);
    within(BOUND, "stop", move || gate.stop());
    rig.pair.initiator.close();
}

#[test]
fn initiator_close_under_eight_workers_ends_the_run_canceled() {
    let rig = rig(8, 256 << 10, 16 << 10, 4, Duration::from_secs(60));
    let gate =
        Arc::new(bench_gate(rig.pair.initiator.clone(), 8, GateHooks::default()).expect("gate"));
    let (tx, rx) = mpsc::channel();
    let (g, spec) = (gate.clone(), rig.spec.clone());
    std::thread::spawn(move || {
        let _ = tx.send(g.run(spec));
    });
    let deadline = Instant::now() + BOUND;
    while rig.pair.initiator.metrics().tasks_completed < 50 {
        assert!(Instant::now() < deadline, "no work completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    rig.pair.initiator.close();
    match rx.recv_timeout(BOUND).expect("run returned after close") {
        Err(RunError::Failed(f)) => {
            assert_eq!(f.status, TransferStatus::Canceled, "{f}");
            assert_eq!(f.code.as_deref(), Some("ERR_FERRY_CLOSED"), "{f}");
        }
        other => panic!("expected CANCELED, got {other:?}"),
    }
    assert_eq!(gate.retirements().retired, [1; 8]);
    within(BOUND, "stop", move || gate.stop());
    rig.pair.target.close();
}

/// Iterations of the close-while-polling race. Each builds and closes an initiator engine
/// (a few ms of work here); 1000 fit well inside a minute on a 2-core machine.
const CLOSE_ITERATIONS: usize = 1000;
const POLLERS: usize = 8;

/// What the pollers saw over all iterations.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    polls: usize,
    pending: usize,
    terminal_before_close: usize,
    closed_errors: usize,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.polls += o.polls;
        self.pending += o.pending;
        self.terminal_before_close += o.terminal_before_close;
        self.closed_errors += o.closed_errors;
    }
}

/// 8 threads poll `batch_status` with work in flight while the engine closes, `iterations`
/// times. Every poll must give PENDING or a terminal status before the close, and
/// ERR_FERRY_CLOSED once `close` has started; nothing may panic or hang. (A poll racing
/// the drain of the batch table once got ERR_FERRY_INVALID_BATCH; the engine now reports
/// any lookup that fails during close as ERR_FERRY_CLOSED.)
fn pollers_while_the_engine_closes(iterations: usize) -> Tally {
    let target = Engine::new(tcp(2)).expect("target");
    let remote = target.allocate(1 << 20).expect("remote");
    let started = Instant::now();
    let mut seen = Tally::default();
    for iter in 0..iterations {
        let initiator = Engine::new(tcp(1)).expect("initiator");
        let local = initiator.allocate(1 << 20).expect("local");
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open");
        let batch = initiator.allocate_batch(16).expect("batch");
        let reqs: Vec<Request> = (0..16u64)
            .map(|i| {
                let opcode = if i % 2 == 0 {
                    Opcode::Write
                } else {
                    Opcode::Read
                };
                request(opcode, &local, seg.handle, &remote, i << 16, 1 << 16)
            })
            .collect();
        initiator.submit_transfer(batch, &reqs).expect("submit");

        let closed = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(Barrier::new(POLLERS + 1));
        let violations = Arc::new(Mutex::new(Vec::<String>::new()));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let pollers: Vec<_> = (0..POLLERS)
            .map(|_| {
                let (engine, closed, polls, go, violations, tally) = (
                    initiator.clone(),
                    closed.clone(),
                    polls.clone(),
                    go.clone(),
                    violations.clone(),
                    tally.clone(),
                );
                std::thread::spawn(move || {
                    let mut mine = Tally::default();
                    let mut backoff = Backoff::default();
                    let polling = Instant::now();
                    let deadline = polling + BOUND;
                    let violation = |what: String| {
                        violations
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(what);
                    };
                    go.wait();
                    loop {
                        let after_close = closed.load(Ordering::Acquire);
                        let result = engine.batch_status(batch);
                        polls.fetch_add(1, Ordering::Relaxed);
                        mine.polls += 1;
                        match result {
                            Ok(s) if after_close => {
                                violation(format!("{} after close returned", s.status));
                                break;
                            }
                            Ok(s) if s.status.is_terminal() => mine.terminal_before_close += 1,
                            Ok(s) if s.status == TransferStatus::Pending => mine.pending += 1,
                            Ok(s) => {
                                violation(format!("unexpected status {}", s.status));
                                break;
                            }
                            Err(e) if e.code() == "ERR_FERRY_CLOSED" => {
                                mine.closed_errors += 1;
                                break;
                            }
                            Err(e) => {
                                let when = if after_close { "after" } else { "during" };
                                violation(format!("{} {when} close ({e})", e.code()));
                                break;
                            }
                        }
                        if Instant::now() > deadline {
                            violation("poller never saw the close".into());
                            break;
                        }
                        backoff.wait(polling.elapsed());
                    }
                    tally.lock().unwrap_or_else(|p| p.into_inner()).add(&mine);
                })
            })
            .collect();
        go.wait();
        // Close once every poller is polling (bounded wait).
        let deadline = Instant::now() + BOUND;
        while polls.load(Ordering::Relaxed) < POLLERS {
            assert!(Instant::now() < deadline, "pollers never polled");
            std::thread::yield_now();
        }
        initiator.close();
        closed.store(true, Ordering::Release);
        for p in pollers {
            assert!(p.join().is_ok(), "iteration {iter}: a poller panicked");
        }
        let v = violations.lock().unwrap_or_else(|p| p.into_inner());
        assert!(v.is_empty(), "iteration {iter}: {v:?}");
        seen.add(&tally.lock().unwrap_or_else(|p| p.into_inner()));
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "iteration {iter}: too slow"
        );
    }
    assert_eq!(
        seen.closed_errors,
        iterations * POLLERS,
        "every poller saw the close as ERR_FERRY_CLOSED"
    );
    eprintln!(
        "{iterations} closes under {POLLERS} pollers in {:?}: {seen:?}",
        started.elapsed()
    );
    target.close();
    seen
}

#[test]
fn eight_pollers_while_the_engine_closes() {
    pollers_while_the_engine_closes(CLOSE_ITERATIONS);
}

#[test]
fn what_served_a_case_counts_its_measured_operations_only() {
    // shm moves a 4 KiB block on the submitting thread and counts it there, so the bytes
    // counted are exactly those of the operations the workers timed.
    let shm = || EngineConfig {
        transports: vec![TransportKind::Shm],
        ..EngineConfig::default()
    };
    let pair = Pair::new(
        Engine::new(shm()).expect("target"),
        Engine::new(shm()).expect("initiator"),
        2 << 20,
    );
    let bench = ferry_bench::Bench::start(pair.initiator.clone(), 2).expect("bench");
    let spec = BenchSpec {
        opcode: Opcode::Write,
        block_size: 4096,
        batch_size: 2,
        local: pair.local.id(),
        segment: pair.seg,
        peer: pair.peer.clone(),
        remote_buffer: pair.remote.id(),
        extra_targets: Vec::new(),
        stripe: Stripe {
            base: 0,
            len: 1 << 20,
        },
        addressing: Addressing::Fixed,
        transport: Some(TransportKind::Shm),
        // As long a warm-up as the measured time: counted in, it would double the bytes.
        duration: Duration::from_millis(200),
        warmup: Duration::from_millis(200),
        request_interval_us: 0,
        stall_timeout: DEFAULT_STALL_TIMEOUT,
        notify: false,
    };
    let report = within(BOUND, "case", move || {
        let r = bench.run_case(spec);
        bench.stop();
        r
    });
    let row = report.row.expect("a row");
    assert!(row.ops > 0.0);
    let shares: Vec<(String, f64)> = report
        .served
        .shares
        .iter()
        .map(|s| (s.transport.clone(), s.bytes))
        .collect();
    assert_eq!(
        shares,
        [("shm".to_string(), row.ops * 4096.0 * 2.0)],
        "{row:?}"
    );
    assert_eq!(report.served.failovers, 0);
}
