//! Attempt deadlines over tcp count from when an attempt's bytes start moving: a block
//! list far longer than the deadline ends with no TIMEOUT behind its own queue, while a
//! peer whose data path stops answering still ends every task within the deadline.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferry_core::blocks::{BlockOutcome, Blocks, PerBlock};
use ferry_core::wire::{ConnKind, Header, HEADER_LEN};
use ferry_core::{
    Engine, EngineConfig, Opcode, TaskSnapshot, TransferStatus, TransportHint, TransportKind,
};
use ferry_testkit::{bytes_at, fill, within, Pair};

fn config(deadline: Duration) -> EngineConfig {
    let mut c = EngineConfig {
        transports: vec![TransportKind::Tcp],
        ..EngineConfig::default()
    };
    c.failover.attempt_timeout = Some(deadline);
    c
}

/// `n` blocks of `len` bytes: local block `i` to remote block `(i * 7) % n` (`n` not a
/// multiple of 7), so no two neighbours merge and the list is gathered span by span.
fn scattered(p: &Pair, n: u64, len: u64) -> Blocks {
    assert!(n % 7 != 0);
    Blocks {
        opcode: Opcode::Write,
        local: PerBlock::One(p.local.id()),
        segment: PerBlock::One(p.seg),
        remote_buffer: PerBlock::One(p.remote.id()),
        local_offsets: (0..n).map(|i| i * len).collect(),
        remote_offsets: (0..n).map(|i| (i * 7 % n) * len).collect(),
        lengths: PerBlock::One(len),
        hint: TransportHint::Require(TransportKind::Tcp),
    }
}

/// Every block's bytes are where the list says (the whole regions compared at once).
fn every_byte_right(p: &Pair, blocks: &Blocks, len: u64) {
    for (b, (l, r)) in blocks
        .local_offsets
        .iter()
        .zip(&blocks.remote_offsets)
        .enumerate()
    {
        assert!(
            bytes_at(&p.local, *l, len) == bytes_at(&p.remote, *r, len),
            "block {b} differs"
        );
    }
}

/// Runs a block list through `transfer_blocks`; its outcome and how long it took.
fn run(p: &Pair, blocks: &Blocks, bound: Duration) -> (BlockOutcome, Duration) {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    p.initiator
        .transfer_blocks(blocks, move |o| {
            let _ = tx.send(o);
        })
        .expect("submitted");
    let outcome = rx.recv_timeout(bound).expect("the list ended");
    (outcome, started.elapsed())
}

fn count(outcome: &BlockOutcome, status: TransferStatus) -> usize {
    outcome
        .status
        .iter()
        .filter(|s| **s == status.raw())
        .count()
}

/// A list whose queue takes many times the deadline to drain, on a healthy peer: before,
/// every attempt's deadline ran from submission and the list's tail ended TIMEOUT behind
/// its own head.
#[test]
fn a_block_list_longer_than_the_deadline_never_times_out_behind_its_own_queue() {
    within(Duration::from_secs(240), "long list", || {
        const N: u64 = 2 * 1024 * 1024 + 1;
        const LEN: u64 = 512;
        let deadline = Duration::from_secs(2);
        let target = Engine::new(config(deadline)).expect("target");
        let initiator = Engine::new(config(deadline)).expect("initiator");
        let p = Pair::new(target, initiator, N * LEN);
        fill(&p.local, 7);
        let blocks = scattered(&p, N, LEN);
        let (outcome, took) = run(&p, &blocks, Duration::from_secs(200));
        let timeouts = count(&outcome, TransferStatus::Timeout);
        eprintln!(
            "{N} blocks: {timeouts} TIMEOUT, {took:?}, {} attempt timeouts, first failure {:?}",
            p.initiator.metrics().attempt_timeouts,
            outcome.failed.first()
        );
        assert!(
            took > deadline,
            "the list took {took:?}: too short to prove anything"
        );
        assert_eq!(
            (timeouts, outcome.failed.len()),
            (0, 0),
            "{timeouts} of {N} blocks ended TIMEOUT in {took:?}"
        );
        assert_eq!(count(&outcome, TransferStatus::Completed), N as usize);
        assert_eq!(p.initiator.metrics().attempt_timeouts, 0);
        every_byte_right(&p, &blocks, LEN);
    });
}

/// The full-size figure: 4 M × 1 KiB blocks with a 1 s deadline (8 GiB of memory; run
/// with `--release -- --ignored`).
/// The measurement's deadline: `FERRY_FULL_SIZE_DEADLINE_MS` (0 = none), 1 s by default.
fn full_size_deadline() -> Option<Duration> {
    let ms = std::env::var("FERRY_FULL_SIZE_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    (ms > 0).then(|| Duration::from_millis(ms))
}

#[test]
#[ignore = "8 GiB and a minute of two cores: a measurement, not a check"]
fn full_size_4m_blocks_of_1k_with_a_1s_deadline() {
    const N: u64 = 4 * 1024 * 1024 + 1;
    const LEN: u64 = 1024;
    let deadline = full_size_deadline();
    let config = || EngineConfig {
        failover: ferry_core::failover::FailoverPolicy {
            attempt_timeout: deadline,
            ..Default::default()
        },
        ..config(Duration::from_secs(1))
    };
    let target = Engine::new(config()).expect("target");
    let initiator = Engine::new(config()).expect("initiator");
    let p = Pair::new(target, initiator, N * LEN);
    fill(&p.local, 7);
    let blocks = scattered(&p, N, LEN);
    let (outcome, took) = run(&p, &blocks, Duration::from_secs(600));
    let timeouts = count(&outcome, TransferStatus::Timeout);
    eprintln!(
        "tcp 4M x 1KiB, deadline {deadline:?}: {timeouts} TIMEOUT ({:.1} %), {} completed, {} tasks, {took:?}, {} attempt timeouts",
        100.0 * timeouts as f64 / N as f64,
        count(&outcome, TransferStatus::Completed),
        outcome.requests,
        p.initiator.metrics().attempt_timeouts,
    );
    assert_eq!(timeouts, 0);
    every_byte_right(&p, &blocks, LEN);
}

/// A tcp proxy in front of a target that advertises the proxy's address, so every
/// connection to it, control and data, goes through here. Frozen, it stops forwarding on
/// data connections (both ways) while control connections keep flowing: a peer whose data
/// path stops answering while it still answers heartbeats.
struct Proxy {
    addr: std::net::SocketAddr,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a port of its own; `forward_to` is set once the target exists.
    fn bind() -> (Self, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let proxy = Self {
            addr: listener.local_addr().expect("addr"),
            frozen: Arc::default(),
            stop: Arc::default(),
        };
        (proxy, listener)
    }

    fn run(&self, listener: TcpListener, to: std::net::SocketAddr) {
        let (frozen, stop) = (self.frozen.clone(), self.stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                let (frozen, stop) = (frozen.clone(), stop.clone());
                std::thread::spawn(move || relay(client, to, &frozen, &stop));
            }
        });
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.freeze(false);
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// One proxied connection: its kind from the Hello, then both ways pumped.
fn relay(
    mut client: TcpStream,
    to: std::net::SocketAddr,
    frozen: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
) {
    let mut hello = [0u8; HEADER_LEN];
    if client.read_exact(&mut hello).is_err() {
        return;
    }
    let data = Header::decode(&hello).is_ok_and(|h| h.buffer_id == ConnKind::Data as u64);
    let Ok(mut server) = TcpStream::connect(to) else {
        return;
    };
    if server.write_all(&hello).is_err() {
        return;
    }
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (f2, st2) = (frozen.clone(), stop.clone());
    std::thread::spawn(move || pump(s2, c2, data, &f2, &st2));
    pump(client, server, data, frozen, stop);
}

/// Copies `from` to `to` until either ends; a data connection holds what it read while
/// frozen (and so reads no more: the sender's buffers fill).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    data: bool,
    frozen: &AtomicBool,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while data && frozen.load(Ordering::Acquire) {
            if stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Mid-list, the peer's data path stops answering while its control link stays healthy
/// (so it is never declared lost): every task still pending ends TIMEOUT within the
/// deadline and a margin, queued ones too, and once the peer answers again new work goes
/// through. Timing attempts from their start must not leave the queue behind a stuck
/// connection waiting forever.
#[test]
fn a_peer_whose_data_path_stops_answering_mid_list_ends_every_task_within_the_deadline() {
    within(Duration::from_secs(120), "stuck peer", || {
        const N: u64 = 256 * 1024 + 1;
        const LEN: u64 = 1024;
        let deadline = Duration::from_millis(500);
        let margin = Duration::from_secs(2);
        let (proxy, listener) = Proxy::bind();
        let target = Engine::new(EngineConfig {
            advertise: Some(proxy.addr.to_string()),
            ..config(deadline)
        })
        .expect("target");
        proxy.run(listener, target.local_addr());
        let initiator = Engine::new(config(deadline)).expect("initiator");
        let p = Pair::new(target, initiator, N * LEN);
        fill(&p.local, 5);
        let blocks = scattered(&p, N, LEN);
        let batch = p.initiator.allocate_batch(1024).expect("batch");
        let sub = p
            .initiator
            .submit_blocks(batch, &blocks)
            .expect("submitted");
        let tasks = sub.map.starts.len() - 1;
        // Some of the list has landed; then the data path freezes.
        let completed = |snaps: &[TaskSnapshot]| {
            snaps
                .iter()
                .filter(|s| s.status == TransferStatus::Completed)
                .count()
        };
        let until = Instant::now() + Duration::from_secs(60);
        while completed(&p.initiator.transfer_status_list(batch).expect("list")) < 2 {
            assert!(Instant::now() < until, "the list never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        proxy.freeze(true);
        let frozen_at = Instant::now();
        let snaps = ferry_testkit::wait_batch(&p.initiator, batch, Duration::from_secs(60));
        let took = frozen_at.elapsed();
        let done = completed(&snaps);
        eprintln!("{tasks} tasks: {done} completed, the rest ended {took:?} after the freeze");
        assert!(
            done < tasks,
            "the list ended before the freeze: proves nothing"
        );
        for s in snaps
            .iter()
            .filter(|s| s.status != TransferStatus::Completed)
        {
            assert_eq!(s.status, TransferStatus::Timeout, "{s:?}");
        }
        assert!(
            took <= deadline + margin,
            "pending tasks ended {took:?} after the freeze (deadline {deadline:?})"
        );
        assert!(
            !p.events()
                .iter()
                .any(|e| matches!(e, ferry_core::EngineEvent::PeerLost { .. })),
            "the peer answered heartbeats throughout: never lost"
        );
        // It answers again: new work goes through on fresh connections.
        proxy.freeze(false);
        let again = p
            .initiator
            .transfer_blocking(&[p.request(Opcode::Write, 0, 1 << 20)])
            .expect("write");
        assert_eq!(again[0].status, TransferStatus::Completed, "{:?}", again[0]);
    });
}
