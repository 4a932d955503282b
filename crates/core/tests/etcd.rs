//! Cluster mode against a real etcd server (Debian's `etcd-server`, which CI installs):
//! publishing, opening by logical name, lease expiry, re-registration and etcd outages
//! (etcd killed, or paused past every lease).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::metadata::DEFAULT_PREFIX;
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
            client_port: ferry_testkit::unused_port(),
            peer_port: ferry_testkit::unused_port(),
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

    /// Sends `signal` to the server, by pid (SIGSTOP pauses it, SIGCONT resumes it).
    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("etcd is running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) takes no pointers; `pid` is our own child, not reaped yet (we hold
        // its `Child`), so the number cannot name another process.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// The records under the default prefix (segment name → the revision that created the
    /// record) and the store's revision, or `None` when etcd does not answer within 2 s.
    fn records(&self) -> Option<(i64, HashMap<String, i64>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let endpoint = format!("127.0.0.1:{}", self.client_port);
        rt.block_on(async {
            let limit = Duration::from_secs(2);
            let connect = etcd_client::Client::connect([endpoint], None);
            let mut c = tokio::time::timeout(limit, connect).await.ok()?.ok()?;
            let all = etcd_client::GetOptions::new().with_prefix();
            let get = c.get(DEFAULT_PREFIX, Some(all));
            let resp = tokio::time::timeout(limit, get).await.ok()?.ok()?;
            let revision = resp.header()?.revision();
            let names = resp
                .kvs()
                .iter()
                .map(|kv| {
                    let key = String::from_utf8_lossy(kv.key());
                    let name = key.trim_start_matches(DEFAULT_PREFIX).to_string();
                    (name, kv.create_revision())
                })
                .collect();
            Some((revision, names))
        })
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

/// Waits (bounded) until `done` holds; returns how long it took.
fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// Longer than a direct check of a peer whose record went away takes to fail (its bound
/// is at most 1.5 s), with a margin for a loaded machine: a loss it would cause shows by then.
const CHECK_MARGIN: Duration = Duration::from_secs(3);

fn assert_no_loss(events: &Events, who: &str) {
    let lost: Vec<_> = events
        .lock()
        .expect("events")
        .iter()
        .filter(|e| matches!(e, EngineEvent::PeerLost { .. }))
        .cloned()
        .collect();
    assert!(lost.is_empty(), "{who} declared peers lost: {lost:?}");
}

/// Whether etcd holds `name`'s record, created after `revision`.
fn registered_after(etcd: &Etcd, name: &str, revision: i64) -> bool {
    etcd.records()
        .is_some_and(|(_, r)| r.get(name).is_some_and(|&created| created > revision))
}

#[test]
fn an_expired_lease_is_no_loss_while_the_peer_answers_directly_and_the_record_returns() {
    skip_without_etcd!();
    let etcd = Etcd::new();
    let target = Engine::new(config(&etcd, Some("decode-0"))).expect("target");
    let remote = target.allocate(64 << 10).expect("remote");
    let initiator = Engine::new(config(&etcd, None)).expect("initiator");
    let events = record_events(&initiator);
    let seg = initiator.open_segment_blocking("decode-0").expect("open");
    let (revision, _) = etcd.records().expect("etcd answers");

    // The target stays up (its control link answers) but stops renewing its lease: etcd
    // removes its record. That only makes the initiator check the peer directly.
    target.pause_metadata_keepalive(true);
    wait_until(TTL + Duration::from_secs(4), "the record expired", || {
        etcd.records()
            .is_some_and(|(_, r)| !r.contains_key("decode-0"))
    });
    std::thread::sleep(CHECK_MARGIN);
    assert_no_loss(&events, "the initiator");
    write_and_verify(&initiator, seg.handle, &remote, 2);

    // Keep-alives resume: the lease is gone, so a new one is granted and the record put
    // again.
    target.pause_metadata_keepalive(false);
    let took = wait_until(Duration::from_secs(10), "the record returned", || {
        registered_after(&etcd, "decode-0", revision)
    });
    eprintln!("record re-registered {took:?} after keep-alives resumed");
    write_and_verify(&initiator, seg.handle, &remote, 3);
    assert_no_loss(&events, "the initiator");
    initiator.close();
    target.close();
}

/// Writes `SLOT` bytes from `engine` to each of `targets` in turn, each into the writer's
/// own slot (`index`) of the target's inbox, and checks the bytes, until `stop`.
struct Writer {
    done: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    thread: std::thread::JoinHandle<()>,
}

const SLOT: u64 = 64 << 10;

impl Writer {
    fn start(
        engine: Engine,
        index: u64,
        targets: Vec<(u64, Arc<Region>)>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let done = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let (d, f) = (done.clone(), failures.clone());
        let thread = std::thread::spawn(move || {
            let local = engine.allocate(SLOT).expect("local");
            let mut round = 0u64;
            while !stop.load(Ordering::Acquire) {
                for (segment, inbox) in &targets {
                    round += 1;
                    fill(&local, index << 32 | round);
                    let req = Request {
                        opcode: Opcode::Write,
                        local: local.id(),
                        local_offset: 0,
                        segment: *segment,
                        remote_buffer: inbox.id(),
                        remote_offset: index * SLOT,
                        length: SLOT,
                        hint: ferry_core::TransportHint::Auto,
                        verify: false,
                    };
                    let (tx, rx) = std::sync::mpsc::channel();
                    let outcome = engine
                        .transfer(&[req], move |s| {
                            let _ = tx.send(s);
                        })
                        .map_err(|e| format!("submit: {e}"))
                        .and_then(|_| {
                            rx.recv_timeout(Duration::from_secs(20))
                                .map_err(|_| "no outcome within 20 s".to_string())
                        });
                    match outcome {
                        Ok(s) if s[0].status == TransferStatus::Completed => {
                            if bytes_at(inbox, index * SLOT, SLOT) == bytes_at(&local, 0, SLOT) {
                                d.fetch_add(1, Ordering::AcqRel);
                            } else {
                                f.lock().expect("failures").push("bytes differ".into());
                            }
                        }
                        Ok(s) => f.lock().expect("failures").push(format!("{:?}", s[0])),
                        Err(e) => f.lock().expect("failures").push(e),
                    }
                    // Paced, so that 4 writers leave the machine's cores to etcd and the
                    // links.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let _ = engine.release(local.id());
        });
        Self {
            done,
            failures,
            thread,
        }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }
}

/// Waits (bounded) until every writer completed `more` writes beyond what it had.
fn wait_for_writes(writers: &[Writer], more: u64, within: Duration, when: &str) {
    let from: Vec<u64> = writers.iter().map(Writer::done).collect();
    wait_until(within, &format!("writes {when}"), || {
        writers.iter().zip(&from).all(|(w, f)| w.done() >= f + more)
    });
}

#[test]
fn a_paused_etcd_is_no_peer_death_and_every_record_returns() {
    skip_without_etcd!();
    const N: usize = 4;
    // Longer than the lease, so every lease has expired when etcd runs again.
    const PAUSE: Duration = Duration::from_secs(6);
    let etcd = Etcd::new();
    let names: Vec<String> = (0..N).map(|i| format!("node-{i}")).collect();
    let engines: Vec<Engine> = names
        .iter()
        .map(|n| Engine::new(config(&etcd, Some(n))).expect("engine"))
        .collect();
    let events: Vec<Events> = engines.iter().map(record_events).collect();
    let inboxes: Vec<Arc<Region>> = engines
        .iter()
        .map(|e| e.allocate(SLOT * N as u64).expect("inbox"))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<Writer> = (0..N)
        .map(|i| {
            let targets = (0..N)
                .filter(|&j| j != i)
                .map(|j| {
                    let seg = engines[i].open_segment_blocking(&names[j]).expect("open");
                    (seg.handle, inboxes[j].clone())
                })
                .collect();
            Writer::start(engines[i].clone(), i as u64, targets, stop.clone())
        })
        .collect();
    wait_for_writes(&writers, 3, Duration::from_secs(20), "before the pause");
    let (revision, records) = etcd.records().expect("etcd answers");
    assert!(names.iter().all(|n| records.contains_key(n)), "{records:?}");

    etcd.signal(libc::SIGSTOP);
    let paused = Instant::now();
    wait_for_writes(&writers, 3, PAUSE, "while etcd is paused");
    std::thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
    etcd.signal(libc::SIGCONT);

    // Every lease expired in the pause: each engine grants a new one and publishes again.
    let took = wait_until(
        Duration::from_secs(10),
        "every record re-registered",
        || names.iter().all(|n| registered_after(&etcd, n, revision)),
    );
    eprintln!("every record re-registered {took:?} after etcd resumed");
    wait_for_writes(&writers, 3, Duration::from_secs(10), "after etcd resumed");
    std::thread::sleep(CHECK_MARGIN);
    stop.store(true, Ordering::Release);
    for (i, w) in writers.into_iter().enumerate() {
        w.thread.join().expect("writer");
        let failures = w.failures.lock().expect("failures");
        assert!(
            failures.is_empty(),
            "{} of node-{i}'s writes failed, the first: {:?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
    }
    for (i, e) in events.iter().enumerate() {
        assert_no_loss(e, &names[i]);
    }
    for e in &engines {
        e.close();
    }
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
    let port = ferry_testkit::unused_port();
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

    // The watch resumed: a new engine instance that takes the name once the target closed
    // is followed (its address and descriptor fetched, the peer reported back).
    target.close();
    wait_event(
        &events,
        Duration::from_secs(5),
        |e| matches!(e, EngineEvent::PeerLost { segment, .. } if segment == "big"),
    );
    let successor = Engine::new(config(&etcd, Some("big"))).expect("successor");
    let moved = successor.allocate(64 << 10).expect("successor's buffer");
    wait_event(
        &events,
        Duration::from_secs(10),
        |e| matches!(e, EngineEvent::PeerRecovered { segment } if segment == "big"),
    );
    let info = initiator.open_segment_blocking("big").expect("reopen");
    assert_eq!(info.engine_id, successor.engine_id());
    write_and_verify(&initiator, seg.handle, &moved, 5);
    successor.close();
    initiator.close();
    late.close();
}
