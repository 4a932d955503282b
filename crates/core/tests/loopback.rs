//! Two engines in one process over loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::auth::{nonce, ClientHandshake, Secret, MAC_LEN};
use ferry_core::wire::{ConnKind, Header, Op, HEADER_LEN, MAX_DATA_PAYLOAD};
use ferry_core::{Engine, EngineConfig, Opcode, Request, TransferStatus};
use ferry_testkit::{bytes_of, fill, request};

fn tcp_only() -> EngineConfig {
    EngineConfig {
        transports: vec![ferry_core::TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

fn pair() -> (Engine, Engine) {
    let cfg = EngineConfig {
        peer_timeout: Duration::from_millis(1000),
        ..tcp_only()
    };
    (
        Engine::new(cfg.clone()).expect("target"),
        Engine::new(cfg).expect("initiator"),
    )
}

#[test]
fn moves_64_mib_each_way_with_bytes_verified() {
    const SIZE: u64 = 64 << 20;
    let (target, initiator) = pair();
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    fill(&local, 42);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    assert_eq!(seg.buffers.len(), 1);

    // WRITE 64 MiB as 1 MiB requests in one batch, polled.
    let batch = initiator.allocate_batch(64).expect("batch");
    let reqs: Vec<_> = (0..64)
        .map(|i| request(Opcode::Write, &local, seg.handle, &remote, i << 20, 1 << 20))
        .collect();
    initiator.submit_transfer(batch, &reqs).expect("submit");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = initiator.batch_status(batch).expect("status");
        if s.status.is_terminal() {
            assert_eq!(s.status, TransferStatus::Completed);
            assert_eq!(s.transferred, SIZE);
            break;
        }
        assert!(Instant::now() < deadline, "write did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
    let list = initiator.transfer_status_list(batch).expect("list");
    assert!(list
        .iter()
        .all(|t| t.transport == Some(ferry_core::TransportKind::Tcp) && t.attempts == 1));
    initiator.free_batch(batch).expect("free");
    assert_eq!(bytes_of(&remote), bytes_of(&local));

    // READ it back into a fresh region through the callback path, one 64 MiB request.
    let back = initiator.allocate(SIZE).expect("back");
    let snaps = initiator
        .transfer_blocking(&[request(Opcode::Read, &back, seg.handle, &remote, 0, SIZE)])
        .expect("read");
    assert_eq!(
        snaps[0].status,
        TransferStatus::Completed,
        "{:?}",
        snaps[0].error
    );
    assert_eq!(snaps[0].transferred, SIZE);
    assert!(bytes_of(&back) == bytes_of(&local), "read-back differs");
    let m = initiator.metrics();
    assert_eq!(m.tasks_completed, 65);
    assert_eq!(m.bytes_transferred, 2 * SIZE);
    initiator.close();
    target.close();
}

#[test]
fn target_close_fails_in_flight_work_quickly() {
    let (target, initiator) = pair();
    let remote = target.allocate(64 << 20).expect("remote");
    let local = initiator.allocate(64 << 20).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let batch = initiator.allocate_batch(1024).expect("batch");
    // Keep a stream of writes going, then kill the target.
    for round in 0..8u64 {
        let reqs: Vec<_> = (0..64)
            .map(|i| request(Opcode::Write, &local, seg.handle, &remote, i << 20, 1 << 20))
            .collect();
        initiator.submit_transfer(batch, &reqs).expect("submit");
        if round == 4 {
            target.close();
        }
    }
    let killed = Instant::now();
    loop {
        let s = initiator.batch_status(batch).expect("status");
        if s.status.is_terminal() {
            assert_eq!(s.status, TransferStatus::Failed);
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "not FAILED within 2 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // The peer is declared lost; new work fails fast with PEER_LOST.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let snaps = initiator
            .transfer_blocking(&[request(Opcode::Write, &local, seg.handle, &remote, 0, 4096)])
            .expect("submit after loss");
        assert_eq!(snaps[0].status, TransferStatus::Failed);
        if snaps[0].error.as_ref().map(|e| e.code()) == Some("ERR_FERRY_PEER_LOST") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "peer never declared lost: {:?}",
            snaps[0].error
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(initiator.metrics().peers_lost >= 1);
    initiator.close();
}

#[test]
fn bad_input_is_refused_and_moves_nothing() {
    let (target, initiator) = pair();
    let remote = target.allocate(8192).expect("remote");
    let local = initiator.allocate(8192).expect("local");
    fill(&local, 7);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let good = request(Opcode::Write, &local, seg.handle, &remote, 0, 4096);
    let batch = initiator.allocate_batch(4).expect("batch");
    let bad_cases = [
        (
            Request {
                length: 0,
                ..good.clone()
            },
            "ERR_FERRY_INVALID_ARGUMENT",
        ),
        (
            Request {
                remote_offset: 8000,
                ..good.clone()
            },
            "ERR_FERRY_OUT_OF_RANGE",
        ),
        (
            Request {
                segment: 999,
                ..good.clone()
            },
            "ERR_FERRY_UNKNOWN_SEGMENT",
        ),
        (
            Request {
                remote_buffer: 77,
                ..good.clone()
            },
            "ERR_FERRY_UNKNOWN_BUFFER",
        ),
    ];
    for (bad, code) in bad_cases {
        // A good request beside a bad one: the whole submission is refused.
        let err = initiator
            .submit_transfer(batch, &[good.clone(), bad])
            .expect_err("must refuse");
        assert_eq!(err.code(), code);
    }
    assert_eq!(initiator.batch_status(batch).expect("status").tasks, 0);
    assert!(
        bytes_of(&remote).iter().all(|&b| b == 0),
        "a refused request moved bytes"
    );
    // stale, freed and foreign batch ids
    initiator.free_batch(batch).expect("free");
    assert_eq!(
        initiator.batch_status(batch).unwrap_err().code(),
        "ERR_FERRY_INVALID_BATCH"
    );
    let foreign = target.allocate_batch(1).expect("foreign");
    assert_eq!(
        initiator.batch_status(foreign).unwrap_err().code(),
        "ERR_FERRY_INVALID_BATCH"
    );
    // released region
    initiator.release(local.id()).expect("release");
    let err = initiator.transfer_blocking(&[good]).expect_err("released");
    assert_eq!(err.code(), "ERR_FERRY_UNKNOWN_REGION");
    // after close
    initiator.close();
    assert_eq!(
        initiator.allocate_batch(1).unwrap_err().code(),
        "ERR_FERRY_CLOSED"
    );
    assert_eq!(
        initiator.allocate(1).unwrap_err().code(),
        "ERR_FERRY_CLOSED"
    );
    target.close();
}

/// A raw data connection of this user: it proves the per-user secret, as engines given
/// no secret do.
fn raw_data_conn(target: &Engine) -> TcpStream {
    let file = ferry_core::user_secret::user_secret_file().expect("per-user secret file");
    let secret = Secret::from_file(&file.display().to_string()).expect("per-user secret");
    let hs = ClientHandshake::new(
        Some(secret),
        ConnKind::Data as u64,
        1,
        nonce().expect("nonce"),
    );
    let mut s = TcpStream::connect(target.segment_name()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(hs.hello()).expect("hello");
    let mut challenge = [0u8; HEADER_LEN + MAC_LEN];
    s.read_exact(&mut challenge).expect("challenge");
    let (head, mac) = challenge.split_at(HEADER_LEN);
    let head: [u8; HEADER_LEN] = head.try_into().expect("header");
    let proof = hs
        .answer(&head, mac)
        .expect("the target holds the per-user secret");
    s.write_all(&proof).expect("proof");
    let mut ack = [0u8; HEADER_LEN];
    s.read_exact(&mut ack).expect("ack");
    assert_eq!(Header::decode(&ack).expect("decode").op, Op::HelloAck);
    s
}

fn read_reply(s: &mut TcpStream) -> Option<Header> {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b).ok()?;
    Header::decode(&b).ok()
}

#[test]
fn malformed_frames_drop_the_connection_and_touch_nothing() {
    let (target, _unused) = pair();
    let remote = target.allocate(4096).expect("remote");
    // 1. garbage
    let mut s = raw_data_conn(&target);
    s.write_all(&[0xEE; 100]).expect("garbage");
    assert!(
        read_reply(&mut s).is_none(),
        "garbage must drop the connection"
    );
    // 2. oversized WRITE
    let mut s = raw_data_conn(&target);
    let mut h = Header::new(Op::WriteReq);
    h.length = MAX_DATA_PAYLOAD + 1;
    let mut enc = h.encode().to_vec();
    enc.extend_from_slice(&[1; 64]);
    s.write_all(&enc).expect("oversized");
    assert!(
        read_reply(&mut s).is_none(),
        "oversized frame must drop the connection"
    );
    // 3. truncated header then EOF
    let mut s = raw_data_conn(&target);
    s.write_all(&Header::new(Op::WriteReq).encode()[..20])
        .expect("partial");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert!(read_reply(&mut s).is_none());
    // 4. well-formed WRITE with a wrong token: rejected, payload drained, nothing written
    let mut s = raw_data_conn(&target);
    let mut h = Header::new(Op::WriteReq);
    h.request_id = 9;
    h.buffer_id = remote.id();
    h.length = 16;
    let mut enc = h.encode().to_vec();
    enc.extend_from_slice(&[0xAA; 16]);
    s.write_all(&enc).expect("bad token");
    let reply = read_reply(&mut s).expect("error reply");
    assert_eq!((reply.op, reply.request_id), (Op::Error, 9));
    let mut text = vec![0u8; reply.length as usize];
    s.read_exact(&mut text).expect("text");
    // the connection survives a rejected request: a ping still answers
    s.write_all(&Header::new(Op::Ping).encode()).expect("ping");
    assert_eq!(read_reply(&mut s).expect("pong").op, Op::Pong);
    assert!(bytes_of(&remote).iter().all(|&b| b == 0));
    // 5. the engine still serves a real peer afterwards
    let initiator = Engine::new(tcp_only()).expect("initiator");
    let local = initiator.allocate(4096).expect("local");
    fill(&local, 3);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let snaps = initiator
        .transfer_blocking(&[request(Opcode::Write, &local, seg.handle, &remote, 0, 4096)])
        .expect("write");
    assert_eq!(snaps[0].status, TransferStatus::Completed);
    assert_eq!(bytes_of(&remote), bytes_of(&local));
    initiator.close();
    target.close();
}

#[test]
fn close_wakes_every_waiter_while_threads_poll() {
    let (target, initiator) = pair();
    let remote = target.allocate(1 << 20).expect("remote");
    let local = initiator.allocate(1 << 20).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let batch = initiator.allocate_batch(4096).expect("batch");
    let reqs: Vec<_> = (0..256)
        .map(|i| {
            request(
                Opcode::Write,
                &local,
                seg.handle,
                &remote,
                (i % 16) << 16,
                1 << 16,
            )
        })
        .collect();
    initiator.submit_transfer(batch, &reqs).expect("submit");
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..16 {
        initiator
            .transfer(&reqs[..4], {
                let tx = tx.clone();
                move |snaps| {
                    let _ = tx.send(snaps);
                }
            })
            .expect("transfer");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pollers: Vec<_> = (0..8)
        .map(|_| {
            let e = initiator.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut polls = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && polls < 1_000_000 {
                    match e.batch_status(batch) {
                        Ok(_) => {}
                        Err(err) => {
                            assert_eq!(err.code(), "ERR_FERRY_CLOSED");
                            return;
                        }
                    }
                    polls += 1;
                }
            })
        })
        .collect();
    initiator.close();
    initiator.close(); // idempotent
    for _ in 0..16 {
        let snaps = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("every waiter wakes");
        assert!(snaps.iter().all(|s| s.status.is_terminal()));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in pollers {
        p.join().expect("poller panicked");
    }
    target.close();
}

#[test]
fn a_restarted_peer_is_refetched_and_served_again() {
    let cfg = EngineConfig {
        peer_timeout: Duration::from_millis(500),
        ..tcp_only()
    };
    let first = Engine::new(cfg.clone()).expect("target");
    let addr = first.segment_name().to_string();
    let _ = first.allocate(4096).expect("remote");
    let initiator = Engine::new(cfg.clone()).expect("initiator");
    let local = initiator.allocate(1 << 20).expect("local");
    fill(&local, 9);
    let seg = initiator.open_segment_blocking(&addr).expect("open");
    let old_id = seg.engine_id;

    // Restart the target on the same address, with a bigger buffer this time.
    first.close();
    let second = Engine::new(EngineConfig {
        listen: addr.clone(),
        ..cfg
    })
    .expect("restarted target");
    let remote = second.allocate(1 << 20).expect("remote");
    assert_ne!(second.engine_id(), old_id);

    // The link notices the restart, refetches the descriptor (new token, new buffers), and
    // requests against the new buffer succeed without reopening the segment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let attempt = initiator.transfer_blocking(&[request(
            Opcode::Write,
            &local,
            seg.handle,
            &remote,
            0,
            1 << 20,
        )]);
        if let Ok(snaps) = &attempt {
            if snaps[0].status == TransferStatus::Completed {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never served after restart: {attempt:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(bytes_of(&remote), bytes_of(&local));
    let reopened = initiator.open_segment_blocking(&addr).expect("reopen");
    assert_eq!(reopened.handle, seg.handle);
    assert_eq!(reopened.engine_id, second.engine_id());
    initiator.close();
    second.close();
}

#[test]
fn work_towards_a_lost_peer_fails_without_failover_and_events_report_it() {
    let (target, initiator) = pair();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    initiator.set_event_sink(Some(Arc::new(move |e| sink.lock().unwrap().push(e))));
    let remote = target.allocate(16 << 20).expect("remote");
    let local = initiator.allocate(16 << 20).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let reqs: Vec<_> = (0..16)
        .map(|i| request(Opcode::Write, &local, seg.handle, &remote, i << 20, 1 << 20))
        .collect();
    let done = initiator.transfer_blocking(&reqs).expect("transfer");
    assert!(done.iter().all(|s| s.status == TransferStatus::Completed));
    target.close();
    let killed = Instant::now();
    while initiator.metrics().peers_lost == 0 {
        assert!(killed.elapsed() < Duration::from_secs(3), "not lost");
        std::thread::sleep(Duration::from_millis(2));
    }
    let before = initiator.metrics();
    // Declared lost: every transport is out of reach, so tasks end at once, are not retried
    // into the dead peer, and do not count against the path's health.
    let batch = initiator.allocate_batch(64).expect("batch");
    initiator.submit_transfer(batch, &reqs).expect("submit");
    let snaps = initiator.transfer_status_list(batch).expect("status");
    for s in &snaps {
        assert_eq!(s.status, TransferStatus::Failed);
        assert_eq!(s.attempts, 1);
        assert_eq!(
            s.error.as_ref().map(|e| e.code()),
            Some("ERR_FERRY_PEER_LOST")
        );
    }
    let m = initiator.metrics();
    assert_eq!(m.failovers, before.failovers, "{m:?}");
    assert_eq!(m.transports_disabled, before.transports_disabled, "{m:?}");
    assert_eq!(m.peers_lost, 1);
    assert_eq!(m.inflight, 0, "{m:?}");
    let by = |s: TransferStatus| {
        m.transfers_by_status
            .iter()
            .find(|(x, _)| *x == s)
            .map(|(_, n)| *n)
    };
    assert_eq!(by(TransferStatus::Completed), Some(16));
    assert_eq!(by(TransferStatus::Failed), Some(16));
    let events = events.lock().unwrap().clone();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ferry_core::EngineEvent::PeerLost { .. })),
        "{events:?}"
    );
    initiator.close();
}

#[test]
fn start_time_install_failure_reaches_a_late_sink() {
    let cfg = EngineConfig {
        faults: vec![(
            ferry_core::TransportKind::Shm,
            ferry_core::transports::fault::FaultSpec {
                fail_install: true,
                ..Default::default()
            },
        )],
        transports: vec![
            ferry_core::TransportKind::Shm,
            ferry_core::TransportKind::Tcp,
        ],
        ..EngineConfig::default()
    };
    let engine = Engine::new(cfg).expect("engine");
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    engine.set_event_sink(Some(Arc::new(move |e| sink.lock().unwrap().push(e))));
    let events = events.lock().unwrap().clone();
    assert!(
        matches!(
            events.as_slice(),
            [ferry_core::EngineEvent::TransportDisabled {
                transport: ferry_core::TransportKind::Shm,
                segment: None,
                until_ms: None,
                ..
            }]
        ),
        "{events:?}"
    );
    engine.close();
}

/// One call whose requests alternate between two local regions and two segments: each
/// request uses its own region and segment (the submit path looks ids up once per run of
/// equal ones), and an unknown id anywhere in the call fails it whole, moving nothing.
#[test]
fn a_call_mixing_regions_and_segments_uses_each_requests_own() {
    const LEN: u64 = 4096;
    let cfg = EngineConfig {
        peer_timeout: Duration::from_millis(1000),
        ..tcp_only()
    };
    let t1 = Engine::new(cfg.clone()).expect("target 1");
    let t2 = Engine::new(cfg.clone()).expect("target 2");
    let initiator = Engine::new(cfg).expect("initiator");
    let (r1, r2) = (
        t1.allocate(4 * LEN).expect("r1"),
        t2.allocate(4 * LEN).expect("r2"),
    );
    let (a, b) = (
        initiator.allocate(LEN).expect("a"),
        initiator.allocate(LEN).expect("b"),
    );
    fill(&a, 3);
    fill(&b, 5);
    let s1 = initiator
        .open_segment_blocking(t1.segment_name())
        .expect("open 1")
        .handle;
    let s2 = initiator
        .open_segment_blocking(t2.segment_name())
        .expect("open 2")
        .handle;
    let at = |local: &ferry_core::memory::Region, seg, remote: &ferry_core::memory::Region, off| {
        Request {
            remote_offset: off,
            ..request(Opcode::Write, local, seg, remote, 0, LEN)
        }
    };
    let reqs = [
        at(&a, s1, &r1, 0),
        at(&b, s1, &r1, LEN),
        at(&b, s2, &r2, 0),
        at(&a, s2, &r2, LEN),
        at(&a, s1, &r1, 2 * LEN),
    ];
    let snaps = initiator.transfer_blocking(&reqs).expect("transfer");
    assert!(
        snaps.iter().all(|s| s.status == TransferStatus::Completed),
        "{snaps:?}"
    );
    let (ab, bb) = (bytes_of(&a), bytes_of(&b));
    let r1b = bytes_of(&r1);
    let r2b = bytes_of(&r2);
    assert!(r1b[..4096] == ab[..] && r1b[4096..8192] == bb[..] && r1b[8192..12288] == ab[..]);
    assert!(r2b[..4096] == bb[..] && r2b[4096..8192] == ab[..]);
    // An unknown region after a known one (the looked-up one must not stand in for it),
    // and an unknown segment after a known one: the call fails, nothing moves.
    let mut unknown_region = at(&a, s1, &r1, 3 * LEN);
    unknown_region.local = a.id() + 1000;
    let mut unknown_segment = at(&a, s1, &r1, 3 * LEN);
    unknown_segment.segment = s1 + s2 + 1000;
    for bad in [unknown_region, unknown_segment] {
        let call = [at(&a, s1, &r1, 3 * LEN), bad];
        assert!(initiator.transfer_blocking(&call).is_err());
    }
    assert!(
        bytes_of(&r1)[3 * 4096..].iter().all(|&x| x == 0),
        "nothing moved"
    );
}

/// `wait_batch` returns once the batch's tasks have ended (a task ending wakes it), with
/// the final status; a wait on a batch with nothing submitted ends at its timeout.
#[test]
fn wait_batch_returns_when_the_batch_ends() {
    const SIZE: u64 = 8 << 20;
    let (target, initiator) = pair();
    let remote = target.allocate(SIZE).expect("remote");
    let local = initiator.allocate(SIZE).expect("local");
    fill(&local, 9);
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let batch = initiator.allocate_batch(8).expect("batch");
    let reqs: Vec<_> = (0..8)
        .map(|i| request(Opcode::Write, &local, seg.handle, &remote, i << 20, 1 << 20))
        .collect();
    initiator.submit_transfer(batch, &reqs).expect("submit");
    let start = Instant::now();
    let s = initiator
        .wait_batch(batch, Duration::from_secs(60))
        .expect("wait");
    assert_eq!(s.status, TransferStatus::Completed);
    assert_eq!(s.transferred, SIZE);
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "woken, not timed out"
    );
    assert_eq!(bytes_of(&remote), bytes_of(&local));
    initiator.free_batch(batch).expect("free");
    let empty = initiator.allocate_batch(1).expect("empty");
    let s = initiator
        .wait_batch(empty, Duration::from_millis(30))
        .expect("wait");
    assert!(!s.status.is_terminal() || s.tasks == 0);
    assert!(
        initiator
            .wait_batch(batch, Duration::from_millis(1))
            .is_err(),
        "freed id refused"
    );
}

#[test]
fn polled_and_awaited_writes_from_several_threads_land_whole_and_in_place() {
    // Polled WRITEs of every size are written by their submitting thread while the
    // connection is idle, and by the writer task behind it otherwise; awaited ones (the
    // Promise path) above 64 KiB always by the writer task. Four threads share the peer's
    // connections: a frame written into another, or the rest of one lost, would show as a
    // protocol error or as wrong bytes.
    ferry_testkit::within(Duration::from_secs(120), "concurrent tcp writes", || {
        const THREADS: u64 = 4;
        const STRIPE: u64 = 4 << 20;
        const ROUNDS: u64 = 40;
        let (target, initiator) = pair();
        let remote = target.allocate(THREADS * STRIPE).expect("remote");
        let local = initiator.allocate(THREADS * STRIPE).expect("local");
        fill(&local, 7);
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        let sizes: [u64; 6] = [1 << 20, 4096, 768 << 10, 64 << 10, 100_003, 1];
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (initiator, local, remote) = (&initiator, &local, &remote);
                s.spawn(move || {
                    let base = t * STRIPE;
                    for round in 0..ROUNDS {
                        for (i, &len) in sizes.iter().enumerate() {
                            let room = STRIPE - len;
                            // Source and destination move apart each round, so a WRITE
                            // that did not land leaves other bytes there.
                            let from = base + (round * 7919 + i as u64 * 104_729) % room;
                            let to = base + (round * 4099 + i as u64 * 65_537) % room;
                            let req = Request {
                                opcode: Opcode::Write,
                                local: local.id(),
                                local_offset: from,
                                segment: seg,
                                remote_buffer: remote.id(),
                                remote_offset: to,
                                length: len,
                                hint: ferry_core::TransportHint::Auto,
                                verify: false,
                            };
                            let status = if t == 0 && round % 2 == 1 {
                                let snaps = initiator.transfer_blocking(&[req]).expect("write");
                                snaps[0].status
                            } else {
                                let batch = initiator.allocate_batch(1).expect("batch");
                                initiator.submit_transfer(batch, &[req]).expect("submit");
                                // Polled without sleeping, as tebench does, so that the
                                // threads' writes overlap.
                                let deadline = Instant::now() + Duration::from_secs(30);
                                let status = loop {
                                    let s = initiator.batch_status(batch).expect("status");
                                    if s.status.is_terminal() {
                                        break s.status;
                                    }
                                    assert!(Instant::now() < deadline, "write never ended");
                                    std::thread::yield_now();
                                };
                                initiator.free_batch(batch).expect("free");
                                status
                            };
                            assert_eq!(status, TransferStatus::Completed, "{len} B, thread {t}");
                            assert!(
                                ferry_testkit::bytes_at(remote, to, len)
                                    == ferry_testkit::bytes_at(local, from, len),
                                "{len} B written by thread {t} in round {round} differ"
                            );
                        }
                    }
                });
            }
        });
        let m = initiator.metrics();
        assert_eq!(m.tasks_completed, THREADS * ROUNDS * sizes.len() as u64);
        initiator.close();
        target.close();
    });
}
