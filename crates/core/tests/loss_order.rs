//! `PeerLost` comes before the failures it explains: work in flight towards a peer that
//! goes away fails only after the engine has emitted the event, whichever of the data
//! connections and the control link notices first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::transports::fault::FaultSpec;
use ferry_core::wire::{ConnKind, Header, HEADER_LEN};
use ferry_core::{
    Engine, EngineConfig, EngineEvent, Opcode, Request, TransferStatus, TransportHint,
    TransportKind,
};

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Lost,
    Failed(&'static str),
    Completed,
}

fn run_once(transports: Vec<TransportKind>) {
    let started = Instant::now();
    let cfg = EngineConfig {
        transports,
        peer_timeout: Duration::from_millis(2000),
        ..EngineConfig::default()
    };
    let target = Engine::new(cfg.clone()).expect("target");
    let remote = target.allocate(64 << 20).expect("remote");
    let initiator = Engine::new(cfg).expect("initiator");
    let local = initiator.allocate(64 << 20).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    initiator.set_event_sink(Some(Arc::new(move |e| {
        if let EngineEvent::PeerLost { .. } = e {
            log.lock().expect("log").push(Seen::Lost);
        }
    })));
    // Many transfers in flight, of several sizes, when the target goes away.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut ops = 0;
    for i in 0..64u64 {
        let len = 4096u64 << (i % 9);
        let req = Request {
            opcode: if i % 2 == 0 {
                Opcode::Write
            } else {
                Opcode::Read
            },
            local: local.id(),
            local_offset: (i % 16) << 20,
            segment: seg.handle,
            remote_buffer: remote.id(),
            remote_offset: (i % 16) << 20,
            length: len,
            hint: TransportHint::Auto,
            verify: false,
        };
        let (log, tx) = (seen.clone(), done_tx.clone());
        initiator
            .transfer(&[req], move |snaps| {
                let entry = match snaps[0].status {
                    TransferStatus::Completed => Seen::Completed,
                    _ => Seen::Failed(snaps[0].error.as_ref().map_or("none", |e| e.code())),
                };
                log.lock().expect("log").push(entry);
                let _ = tx.send(());
            })
            .expect("submit");
        ops += 1;
    }
    target.close();
    let closed_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..ops {
        let left = deadline.saturating_duration_since(Instant::now());
        done_rx
            .recv_timeout(left)
            .expect("every transfer ends in bounded time");
    }
    let seen = seen.lock().expect("log").clone();
    if std::env::var_os("LOSS_ORDER_TRACE").is_some() {
        eprintln!("ended {:?} after close: {seen:?}", closed_at.elapsed());
    }
    let lost_at = seen.iter().position(|s| *s == Seen::Lost);
    for (i, s) in seen.iter().enumerate() {
        if let Seen::Failed(code) = s {
            let lost_at =
                lost_at.unwrap_or_else(|| panic!("a failure ({code}) without PeerLost: {seen:?}"));
            assert!(
                lost_at < i,
                "failure {code} at {i} before PeerLost at {lost_at}: {seen:?}"
            );
            assert_eq!(*code, "ERR_FERRY_PEER_LOST", "{seen:?}");
        }
    }
    let before_close = started.elapsed();
    initiator.close();
    if std::env::var_os("LOSS_ORDER_TRACE").is_some() {
        eprintln!(
            "round: {before_close:?} before close, {:?} in all",
            started.elapsed()
        );
    }
}

#[test]
fn peer_lost_is_emitted_before_the_failures_it_explains() {
    for round in 0..10 {
        let transports = if round % 2 == 0 {
            vec![TransportKind::Tcp]
        } else {
            vec![TransportKind::Shm, TransportKind::Tcp]
        };
        run_once(transports);
    }
}

/// A submission that an injected delay still holds when its peer is lost fails with the
/// loss at once, as the real transports fail what they hold towards a lost peer: the
/// delay (far longer than the test may run) stands for a peer slow to take it, and a
/// test that needs "this request has not landed yet" holds it with such a delay.
#[test]
fn a_submission_held_by_an_injected_delay_fails_when_its_peer_is_lost() {
    let cfg = EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        peer_timeout: Duration::from_millis(2000),
        ..EngineConfig::default()
    };
    let target = Engine::new(cfg.clone()).expect("target");
    let remote = target.allocate(1 << 20).expect("remote");
    let mut held = cfg;
    held.failover.attempt_timeout = None;
    held.faults = vec![(
        TransportKind::Shm,
        FaultSpec {
            delay: Some(Duration::from_secs(600)),
            ..FaultSpec::default()
        },
    )];
    let initiator = Engine::new(held).expect("initiator");
    let local = initiator.allocate(1 << 20).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let req = Request {
        opcode: Opcode::Write,
        local: local.id(),
        local_offset: 0,
        segment: seg.handle,
        remote_buffer: remote.id(),
        remote_offset: 0,
        length: 1 << 20,
        hint: TransportHint::Require(TransportKind::Shm),
        verify: false,
    };
    initiator
        .transfer(&[req], move |snaps| {
            let _ = done_tx.send((snaps[0].status, snaps[0].error.as_ref().map(|e| e.code())));
        })
        .expect("submit");
    target.close();
    let (status, code) = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the held submission ends with the loss, not after its delay");
    assert_eq!(status, TransferStatus::Failed);
    assert_eq!(code, Some("ERR_FERRY_PEER_LOST"));
    initiator.close();
}

/// A tcp proxy in front of a target that advertises the proxy's address. Control
/// connections flow both ways; on data connections, what the target sends stops after
/// `DATA_CAP` bytes (the connection stays open): a READ reply's header has come, the rest
/// of its payload never does.
struct Proxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// The initiator's end of each data connection, once its capped reply has gone out.
    capped: Arc<Mutex<Vec<SocketAddr>>>,
}

const DATA_CAP: usize = 16 << 10;

impl Proxy {
    fn start(listener: TcpListener, to: SocketAddr) -> Self {
        let proxy = Self {
            addr: listener.local_addr().expect("addr"),
            stop: Arc::default(),
            capped: Arc::default(),
        };
        let (stop, capped) = (proxy.stop.clone(), proxy.capped.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                let (stop, capped) = (stop.clone(), capped.clone());
                std::thread::spawn(move || relay(client, to, &stop, &capped));
            }
        });
        proxy
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr);
    }
}

fn relay(
    mut client: TcpStream,
    to: SocketAddr,
    stop: &Arc<AtomicBool>,
    capped: &Arc<Mutex<Vec<SocketAddr>>>,
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
    std::thread::spawn(move || pump(c2, s2, usize::MAX));
    let cap = if data { DATA_CAP } else { usize::MAX };
    let Ok(initiator_end) = client.peer_addr() else {
        return;
    };
    if pump(server, client, cap) {
        capped.lock().expect("capped").push(initiator_end);
        // Held open, so that the initiator's reader waits for the rest of the payload.
        while !stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Copies `from` to `to`, at most `cap` bytes; returns whether the cap was reached.
fn pump(mut from: TcpStream, mut to: TcpStream, cap: usize) -> bool {
    let mut buf = vec![0u8; 4096];
    let mut sent = 0;
    loop {
        let want = buf.len().min(cap - sent);
        if want == 0 {
            return true;
        }
        let n = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n;
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
    false
}

/// Bytes waiting in the receive queue of the local tcp socket bound to `local` (from
/// `/proc/net/tcp`); `None` when there is no such socket.
fn receive_queue(local: SocketAddr) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = format!(":{:04X}", local.port());
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields.get(1)?.ends_with(&port) {
            return None;
        }
        let queues = fields.get(4)?;
        u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
    })
}

/// A READ whose reply is coming in (its header read, its payload not yet) when the peer
/// is lost ends with the loss at once. Its data connection is broken then, and the reader
/// that had taken the slice off the connection's books to receive the payload is dropped
/// with it: before, nothing failed that slice, and the task waited for its attempt
/// deadline (10 s by default: the "rounds that take 10 s to end after close").
#[test]
fn a_read_whose_payload_is_coming_in_when_the_peer_is_lost_ends_with_the_loss() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let cfg = EngineConfig {
        transports: vec![TransportKind::Tcp],
        peer_timeout: Duration::from_millis(2000),
        ..EngineConfig::default()
    };
    let target = Engine::new(EngineConfig {
        advertise: Some(listener.local_addr().expect("addr").to_string()),
        ..cfg.clone()
    })
    .expect("target");
    let proxy = Proxy::start(listener, target.local_addr());
    let remote = target.allocate(1 << 20).expect("remote");
    let mut no_deadline = cfg;
    no_deadline.failover.attempt_timeout = None;
    let initiator = Engine::new(no_deadline).expect("initiator");
    let local = initiator.allocate(1 << 20).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let req = Request {
        opcode: Opcode::Read,
        local: local.id(),
        local_offset: 0,
        segment: seg.handle,
        remote_buffer: remote.id(),
        remote_offset: 0,
        length: 256 << 10,
        hint: TransportHint::Require(TransportKind::Tcp),
        verify: false,
    };
    initiator
        .transfer(&[req], move |snaps| {
            let _ = done_tx.send((snaps[0].status, snaps[0].error.as_ref().map(|e| e.code())));
        })
        .expect("submit");
    // The reply's first bytes went out and the initiator has read them all: its reader
    // now waits for the rest of the payload.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let ends = proxy.capped.lock().expect("capped").clone();
        if ends.iter().any(|end| receive_queue(*end) == Some(0)) {
            break;
        }
        assert!(Instant::now() < until, "the READ reply never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    target.close();
    let (status, code) = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the READ ends with the loss, not never");
    assert_eq!(status, TransferStatus::Failed);
    assert_eq!(code, Some("ERR_FERRY_PEER_LOST"));
    initiator.close();
    drop(proxy);
}
