//! Cluster mode against a real etcd server (Debian's `etcd-server`, which CI installs):
//! publishing, opening by logical name, lease expiry, re-registration and etcd outages.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, EngineEvent, EtcdConfig, Opcode, Region, Request, TransferStatus,
    TransportKind,
};
use ferry_testkit::{bytes_at, etcd_healthy, fill, request, skip_without_etcd, spawn_etcd};

/// A throwaway single-member etcd on free loopback ports. Killed by pid and its data
/// directory removed on drop; `stop` and `start` restart it on the same ports and data.
struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

impl Etcd {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferry-etcd-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd temp dir");
        let mut e = Self {
            child: None,
            dir,
            client_port: free_port(),
            peer_port: free_port(),
        };
        e.start();
        e
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    fn start(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log");
        let data = self.dir.join("data");
        let child = spawn_etcd("ferry-test", &data, &client, &peer, &[], log);
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.healthy() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "etcd exited with {status}; log:\n{}",
                    std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "etcd not ready within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn healthy(&self) -> bool {
        etcd_healthy(self.client_port)
    }

    /// Kills the server (SIGKILL, by pid) and reaps it.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const TTL: Duration = Duration::from_secs(2);

fn config(etcd: &Etcd, name: Option<&str>) -> EngineConfig {
    if let Ok(filter) = std::env::var("FERRY_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
    EngineConfig {
        transports: vec![TransportKind::Tcp],
        metadata: Some(EtcdConfig {
            segment_name: name.map(str::to_string),
            lease_ttl: TTL,
            connect_timeout: Duration::from_secs(1),
            ..EtcdConfig::from_url(&etcd.url()).expect("url")
        }),
        ..EngineConfig::default()
    }
}

type Events = Arc<Mutex<Vec<EngineEvent>>>;

fn record_events(e: &Engine) -> Events {
    let events: Events = Arc::default();
    let sink = events.clone();
    e.set_event_sink(Some(Arc::new(move |ev| {
        sink.lock().expect("events").push(ev);
    })));
    events
}

/// Waits (bounded) for an event matching `pred`; returns it and when it was seen.
fn wait_event(
    events: &Events,
    within: Duration,
    pred: impl Fn(&EngineEvent) -> bool,
) -> EngineEvent {
    let deadline = Instant::now() + within;
    loop {
        if let Some(e) = events.lock().expect("events").iter().find(|e| pred(e)) {
            return e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no matching event within {within:?}; got {:?}",
            events.lock().expect("events")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn writes(local: &Region, seg: u64, remote: &Region, chunk: u64, n: u64) -> Vec<Request> {
    (0..n)
        .map(|i| request(Opcode::Write, local, seg, remote, i * chunk, chunk))
        .collect()
}

fn write_and_verify(initiator: &Engine, seg: u64, remote: &Region, seed: u8) {
    let len = remote.len();
    let local = initiator.allocate(len as u64).expect("local");
    fill(&local, u64::from(seed));
    let done = initiator
        .transfer_blocking(&writes(&local, seg, remote, len as u64, 1))
        .expect("transfer");
    assert_eq!(done[0].status, TransferStatus::Completed, "{done:?}");
    assert!(
        bytes_at(&local, 0, len as u64) == bytes_at(remote, 0, len as u64),
        "bytes differ after the write"
    );
    initiator.release(local.id()).expect("release");
}

#[test]
fn open_by_logical_name_and_transfer() {
    skip_without_etcd!();
    let etcd = Etcd::new();
    let target = Engine::new(config(&etcd, Some("prefill-0"))).expect("target");
    assert_eq!(target.segment_name(), "prefill-0");
    let initiator = Engine::new(config(&etcd, None)).expect("initiator");
    assert_eq!(initiator.segment_name(), initiator.local_addr().to_string());

    let seg = initiator.open_segment_blocking("prefill-0").expect("open");
    assert_eq!(seg.engine_id, target.engine_id());
    // A buffer registered after the open is seen by the next open (descriptor refetch).
    let remote = target.allocate(1 << 20).expect("remote");
    let again = initiator
        .open_segment_blocking("prefill-0")
        .expect("reopen");
    assert_eq!(again.handle, seg.handle);
    assert!(again.buffers.iter().any(|b| b.id == remote.id()));
    write_and_verify(&initiator, seg.handle, &remote, 1);

    // The engine is also found under its host:port name when that is what it published.
    let back = target
        .open_segment_blocking(initiator.segment_name())
        .expect("open initiator by its default name");
    assert_eq!(back.engine_id, initiator.engine_id());

    let missing = initiator
        .open_segment_blocking("nobody")
        .expect_err("unknown");
    assert_eq!(missing.code(), "ERR_FERRY_UNKNOWN_SEGMENT", "{missing}");
    initiator.close();
    target.close();
}

#[test]
fn lease_expiry_declares_the_peer_lost_and_republishing_brings_it_back() {
    skip_without_etcd!();
    let etcd = Etcd::new();
    let target = Engine::new(config(&etcd, Some("decode-0"))).expect("target");
    let remote = target.allocate(64 << 10).expect("remote");
    let initiator = Engine::new(config(&etcd, None)).expect("initiator");
    let events = record_events(&initiator);
    let seg = initiator.open_segment_blocking("decode-0").expect("open");

    // The target stays up (heartbeats go on) but stops renewing its lease.
    let t0 = Instant::now();
    target.pause_metadata_keepalive(true);
    let lost = wait_event(&events, TTL + Duration::from_secs(4), |e| {
        matches!(e, EngineEvent::PeerLost { .. })
    });
    let took = t0.elapsed();
    match lost {
        EngineEvent::PeerLost { segment, reason } => {
            assert_eq!(segment, "decode-0");
            assert!(reason.to_string().contains("etcd"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Keep-alives were last sent up to TTL/3 before the pause.
    assert!(took <= TTL + Duration::from_secs(3), "lost after {took:?}");

    // Keep-alives resume: the lease is gone, so a new one is granted and the record put
    // again; the watch reports the peer back.
    target.pause_metadata_keepalive(false);
    wait_event(
        &events,
        Duration::from_secs(10),
        |e| matches!(e, EngineEvent::PeerRecovered { segment } if segment == "decode-0"),
    );
    write_and_verify(&initiator, seg.handle, &remote, 2);
    initiator.close();
    target.close();
}

#[test]
fn re_registration_refreshes_the_peer_and_transfers_resume() {
    skip_without_etcd!();
    let etcd = Etcd::new();
    let first = Engine::new(config(&etcd, Some("kv-0"))).expect("first");
    let _old = first.allocate(64 << 10).expect("old buffer");
    let initiator = Engine::new(config(&etcd, None)).expect("initiator");
    let events = record_events(&initiator);
    let seg = initiator.open_segment_blocking("kv-0").expect("open");
    assert_eq!(seg.engine_id, first.engine_id());

    // Closing revokes the lease: the loss is seen at once, not after the TTL.
    let t0 = Instant::now();
    first.close();
    wait_event(&events, Duration::from_secs(2), |e| {
        matches!(e, EngineEvent::PeerLost { .. })
    });
    assert!(t0.elapsed() < TTL, "lost after {:?}", t0.elapsed());

    // A new engine instance takes the name, on another port.
    let second = Engine::new(config(&etcd, Some("kv-0"))).expect("second");
    let remote = second.allocate(64 << 10).expect("new buffer");
    wait_event(
        &events,
        Duration::from_secs(10),
        |e| matches!(e, EngineEvent::PeerRecovered { segment } if segment == "kv-0"),
    );
    let info = initiator.open_segment_blocking("kv-0").expect("reopen");
    assert_eq!(info.handle, seg.handle);
    assert_eq!(info.engine_id, second.engine_id());
    write_and_verify(&initiator, seg.handle, &remote, 3);
    initiator.close();
    second.close();
}

#[test]
fn unreachable_etcd_fails_engine_start_with_a_clear_error() {
    let port = free_port();
    let cfg = EngineConfig {
        metadata: Some(EtcdConfig {
            connect_timeout: Duration::from_millis(500),
            ..EtcdConfig::from_url(&format!("etcd://127.0.0.1:{port}")).expect("url")
        }),
        ..EngineConfig::default()
    };
    let t0 = Instant::now();
    let err = Engine::new(cfg).expect_err("no etcd there");
    assert_eq!(err.code(), "ERR_FERRY_METADATA", "{err}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    let bad = EtcdConfig::from_url("etcd://nohost").expect_err("no port");
    assert_eq!(bad.code(), "ERR_FERRY_INVALID_ARGUMENT");
}

#[test]
fn an_etcd_outage_spares_transfers_and_cached_segments_and_ends_when_etcd_returns() {
    skip_without_etcd!();
    let mut etcd = Etcd::new();
    let target = Engine::new(config(&etcd, Some("big"))).expect("target");
    let late = Engine::new(config(&etcd, Some("late"))).expect("late");
    const CHUNK: u64 = 1 << 20;
    const N: u64 = 32;
    let remote = target.allocate(CHUNK * N).expect("remote");
    let initiator = Engine::new(config(&etcd, None)).expect("initiator");
    let events = record_events(&initiator);
    let seg = initiator.open_segment_blocking("big").expect("open");
    let local = initiator.allocate(CHUNK * N).expect("local");
    fill(&local, 4);

    let (tx, rx) = std::sync::mpsc::channel();
    initiator
        .transfer(&writes(&local, seg.handle, &remote, CHUNK, N), move |s| {
            let _ = tx.send(s);
        })
        .expect("submit");
    etcd.stop();
    let done = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("transfer ended");
    assert!(
        done.iter().all(|s| s.status == TransferStatus::Completed),
        "{done:?}"
    );
    assert!(bytes_at(&local, 0, CHUNK * N) == bytes_at(&remote, 0, CHUNK * N));

    // A cached name still opens (descriptor from the peer itself); a new one cannot.
    initiator
        .open_segment_blocking("big")
        .expect("cached open during the outage");
    let t0 = Instant::now();
    let err = initiator
        .open_segment_blocking("late")
        .expect_err("etcd is down");
    assert_eq!(err.code(), "ERR_FERRY_METADATA", "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // Past the TTL with etcd down: nobody is declared lost for etcd's absence.
    std::thread::sleep(TTL + Duration::from_millis(500));
    etcd.start();
    let deadline = Instant::now() + Duration::from_secs(20);
    let info = loop {
        match initiator.open_segment_blocking("late") {
            Ok(info) => break info,
            Err(e) => {
                assert!(Instant::now() < deadline, "open never worked again: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(info.engine_id, late.engine_id());
    let lost: Vec<_> = events
        .lock()
        .expect("events")
        .iter()
        .filter(|e| matches!(e, EngineEvent::PeerLost { .. }))
        .cloned()
        .collect();
    assert!(lost.is_empty(), "{lost:?}");

    // The watch resumed: the target's lease expiring is still seen.
    target.pause_metadata_keepalive(true);
    let lost = wait_event(
        &events,
        TTL + Duration::from_secs(4),
        |e| matches!(e, EngineEvent::PeerLost { segment, .. } if segment == "big"),
    );
    assert!(
        matches!(&lost, EngineEvent::PeerLost { reason, .. } if reason.to_string().contains("etcd")),
        "{lost:?}"
    );
    target.close();
    initiator.close();
    late.close();
}
