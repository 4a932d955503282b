//! The RDMA transport end to end on the emulated verbs device: two engines, bytes
//! verified, and the failure paths (stale rkey, silent loss, a closed peer, the rail
//! monitor, no device at all).

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::blocks::{Blocks, PerBlock};
use ferry_core::failover::FailoverPolicy;
use ferry_core::health::RailPolicy;
use ferry_core::transport::{Transport, TransportContext, TransportFactory};
use ferry_core::{
    Engine, EngineConfig, EngineEvent, Opcode, Request, TransferStatus, TransportKind,
};
use ferry_testkit::{bytes_of, fill, one, user_region, within, Pair};
use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
use ferry_verbs::{ProviderChoice, RdmaConfig, RdmaFactory, RdmaTransport};

fn provider(faults: EmulatedFaults) -> Arc<EmulatedProvider> {
    Arc::new(EmulatedProvider::new(faults))
}

fn engine_with(
    provider: Arc<EmulatedProvider>,
    tweak: impl FnOnce(&mut EngineConfig, &mut RdmaConfig),
) -> Engine {
    let mut rdma = RdmaConfig {
        provider_instance: Some(provider),
        ..RdmaConfig::default()
    };
    let mut cfg = EngineConfig {
        transports: vec![TransportKind::Rdma, TransportKind::Tcp],
        peer_timeout: Duration::from_millis(1000),
        ..EngineConfig::default()
    };
    tweak(&mut cfg, &mut rdma);
    cfg.extra_transports = vec![Arc::new(RdmaFactory { config: rdma })];
    Engine::new(cfg).expect("engine")
}

/// A target on the emulated device (no faults) and `initiator`, `len` bytes on each side,
/// filled with different patterns.
fn rig_with(len: u64, initiator: Engine) -> Pair {
    let target = engine_with(provider(EmulatedFaults::default()), |_, _| {});
    let r = Pair::new(target, initiator, len);
    fill(&r.local, 1);
    fill(&r.remote, 2);
    r
}

fn request(r: &Pair, op: Opcode, offset: u64, length: u64, require: bool) -> Request {
    Request {
        hint: if require {
            ferry_core::TransportHint::Require(TransportKind::Rdma)
        } else {
            ferry_core::TransportHint::Prefer(TransportKind::Rdma)
        },
        ..r.request(op, offset, length)
    }
}

/// Waits (bounded) until an rdma endpoint to the target is up again after a reset.
fn wait_reachable(r: &Pair) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match r.initiator.transport_reachable(r.seg, TransportKind::Rdma) {
            Ok(Ok(())) => return,
            other if Instant::now() > deadline => panic!("rdma never came back: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[test]
fn write_and_read_256_mib_move_the_right_bytes() {
    within(Duration::from_secs(120), "test body", || {
        const LEN: u64 = 256 << 20;
        let initiator = engine_with(provider(EmulatedFaults::default()), |_, _| {});
        let r = rig_with(LEN, initiator);
        // WRITE everything in 4 MiB requests, all in flight at once.
        let reqs: Vec<Request> = (0..LEN / (4 << 20))
            .map(|i| request(&r, Opcode::Write, i * (4 << 20), 4 << 20, true))
            .collect();
        let snaps = r.initiator.transfer_blocking(&reqs).expect("write");
        for s in &snaps {
            assert_eq!(s.status, TransferStatus::Completed, "{s:?}");
            assert_eq!(s.transport, Some(TransportKind::Rdma));
        }
        assert!(
            bytes_of(&r.local) == bytes_of(&r.remote),
            "written bytes differ"
        );
        // READ it back into a zeroed local region.
        fill(&r.local, 0);
        fill(&r.remote, 9);
        let reqs: Vec<Request> = (0..LEN / (4 << 20))
            .map(|i| request(&r, Opcode::Read, i * (4 << 20), 4 << 20, true))
            .collect();
        let snaps = r.initiator.transfer_blocking(&reqs).expect("read");
        assert!(snaps.iter().all(|s| s.status == TransferStatus::Completed));
        assert!(
            bytes_of(&r.local) == bytes_of(&r.remote),
            "read bytes differ"
        );
        // Unaligned small pieces too.
        let s = one(r
            .initiator
            .transfer_blocking(&[request(&r, Opcode::Write, 12_345, 77_777, true)])
            .expect("small"));
        assert_eq!(s.status, TransferStatus::Completed);
        assert_eq!(s.transferred, 77_777);
    });
}

/// A block list of scattered pages is one gather: its spans go out as work requests of
/// their own (each cut at the slice size), and every page lands where its block says.
#[test]
fn a_gather_of_scattered_blocks_moves_every_span_over_rdma() {
    within(Duration::from_secs(60), "test body", || {
        const SLOT: u64 = 96 << 10;
        const N: u64 = 257; // prime: i * 7 % N visits every slot once
        let initiator = engine_with(provider(EmulatedFaults::default()), |_, _| {});
        let r = rig_with(N * SLOT, initiator);
        // 4 KiB blocks, and one as long as its slot (more than the 64 KiB slice: two work
        // requests).
        let mut lengths: Vec<u64> = vec![4096; N as usize];
        lengths[3] = SLOT;
        let blocks = Blocks {
            opcode: Opcode::Write,
            local: PerBlock::One(r.local.id()),
            segment: PerBlock::One(r.seg),
            remote_buffer: PerBlock::One(r.remote.id()),
            local_offsets: (0..N).map(|i| i * SLOT).collect(),
            remote_offsets: (0..N).map(|i| (i * 7 % N) * SLOT).collect(),
            lengths: PerBlock::Each(lengths.clone()),
            hint: ferry_core::TransportHint::Require(TransportKind::Rdma),
            verify: false,
        };
        let (tx, rx) = mpsc::channel();
        let (_, tasks) = r
            .initiator
            .transfer_blocks(&blocks, move |o| {
                let _ = tx.send(o);
            })
            .expect("submitted");
        assert_eq!(tasks, 1, "one gather");
        let out = rx.recv_timeout(Duration::from_secs(30)).expect("outcome");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        for (b, &len) in lengths.iter().enumerate() {
            let (l, rm) = (blocks.local_offsets[b], blocks.remote_offsets[b]);
            assert!(
                ferry_testkit::bytes_at(&r.local, l, len)
                    == ferry_testkit::bytes_at(&r.remote, rm, len),
                "block {b} differs"
            );
        }
    });
}

#[test]
fn a_stale_rkey_fails_with_a_remote_access_error_and_touches_nothing() {
    within(Duration::from_secs(60), "test body", || {
        let initiator = engine_with(provider(EmulatedFaults::default()), |c, _| {
            c.transports = vec![TransportKind::Rdma];
        });
        let r = rig_with(1 << 20, initiator);
        // A second buffer that must stay untouched, then the target drops the first one:
        // the initiator's descriptor still names its (now invalid) rkey.
        let other = r.target.allocate(1 << 20).expect("other");
        fill(&other, 5);
        let before = bytes_of(&other);
        r.target.release(r.remote.id()).expect("release");
        let s = one(r
            .initiator
            .transfer_blocking(&[request(&r, Opcode::Write, 0, 1 << 20, true)])
            .expect("submit"));
        assert_eq!(s.status, TransferStatus::Failed, "{s:?}");
        let e = s.error.expect("error");
        assert_eq!(e.code(), "ERR_FERRY_REMOTE_REJECTED", "{e}");
        assert!(e.to_string().contains("IBV_WC_REM_ACCESS_ERR"), "{e}");
        assert!(
            bytes_of(&other) == before.as_slice(),
            "another buffer was touched"
        );
        // The endpoint resets and reconnects; the other buffer is then written over rdma.
        let seg = r
            .initiator
            .open_segment_blocking(r.target.segment_name())
            .expect("reopen")
            .handle;
        wait_reachable(&r);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let req = Request {
                remote_buffer: other.id(),
                segment: seg,
                ..request(&r, Opcode::Write, 0, 1 << 20, true)
            };
            match r.initiator.transfer_blocking(&[req]) {
                Ok(s) if s[0].status == TransferStatus::Completed => break,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                other => panic!("rdma did not recover: {other:?}"),
            }
        }
        assert!(bytes_of(&other) == bytes_of(&r.local));
    });
}

#[test]
fn silent_loss_hits_the_slice_deadline_and_fails_over_to_tcp() {
    within(Duration::from_secs(60), "test body", || {
        let lossy = provider(EmulatedFaults {
            silent_loss: 1.0,
            ..EmulatedFaults::default()
        });
        // No attempt deadline: only the rdma slice deadline can end the silent attempt.
        let initiator = engine_with(lossy, |c, rdma| {
            rdma.slice_timeout = Duration::from_millis(300);
            c.failover.attempt_timeout = None;
        });
        let r = rig_with(8 << 20, initiator);
        let started = Instant::now();
        let s = one(r
            .initiator
            .transfer_blocking(&[request(&r, Opcode::Write, 0, 8 << 20, false)])
            .expect("write"));
        let took = started.elapsed();
        assert_eq!(s.status, TransferStatus::Completed, "{s:?}");
        assert_eq!(s.transport, Some(TransportKind::Tcp), "{s:?}");
        assert!(s.attempts >= 2, "{s:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(10),
            "took {took:?}"
        );
        assert!(bytes_of(&r.local) == bytes_of(&r.remote));
        let events = r.events();
        assert!(
            events.iter().any(|e| matches!(
                e,
                EngineEvent::Failover {
                    from: TransportKind::Rdma,
                    to: TransportKind::Tcp,
                    ..
                }
            )),
            "{events:?}"
        );
    });
}

#[test]
fn a_closed_peer_fails_rdma_work_within_the_peer_timeout() {
    within(Duration::from_secs(60), "test body", || {
        // Completions are delayed so that work is in flight when the target goes away.
        let slow = provider(EmulatedFaults {
            delay: Duration::from_millis(200),
            ..EmulatedFaults::default()
        });
        let initiator = engine_with(slow, |c, _| {
            c.transports = vec![TransportKind::Rdma];
        });
        let r = rig_with(16 << 20, initiator);
        let (tx, rx) = mpsc::channel();
        let reqs: Vec<Request> = (0..16)
            .map(|i| request(&r, Opcode::Write, i << 20, 1 << 20, true))
            .collect();
        r.initiator
            .transfer(&reqs, move |snaps| {
                let _ = tx.send((Instant::now(), snaps));
            })
            .expect("submit");
        let closed_at = Instant::now();
        r.target.close();
        let (done_at, snaps) = rx.recv_timeout(Duration::from_secs(10)).expect("outcome");
        let took = done_at.saturating_duration_since(closed_at);
        assert!(took < Duration::from_millis(2500), "took {took:?}");
        assert!(
            snaps.iter().any(|s| s.status == TransferStatus::Failed),
            "{snaps:?}"
        );
        assert!(snaps
            .iter()
            .all(|s| matches!(s.status, TransferStatus::Failed | TransferStatus::Completed)));
    });
}

#[test]
fn a_failing_path_is_paused_by_the_rail_monitor_and_recovers() {
    within(Duration::from_secs(60), "test body", || {
        let flaky = provider(EmulatedFaults {
            remote_access: 1.0,
            ..EmulatedFaults::default()
        });
        let control = flaky.clone();
        let initiator = engine_with(flaky, |c, _| {
            c.rail = RailPolicy {
                error_threshold: 3,
                window: Duration::from_secs(10),
                base_cooldown: Duration::from_millis(600),
                max_cooldown: Duration::from_secs(5),
            };
            c.failover = FailoverPolicy {
                max_failover_attempts: 3,
                ..FailoverPolicy::default()
            };
        });
        let r = rig_with(1 << 20, initiator);
        // Three rdma failures (each failing over to tcp) pause the path.
        for _ in 0..3 {
            wait_reachable(&r);
            let mut req = request(&r, Opcode::Write, 0, 64 << 10, false);
            req.hint = ferry_core::TransportHint::Auto;
            let s = one(r.initiator.transfer_blocking(&[req]).expect("write"));
            assert_eq!(s.status, TransferStatus::Completed, "{s:?}");
            assert_eq!(s.transport, Some(TransportKind::Tcp), "{s:?}");
            assert_eq!(s.attempts, 2, "rdma first, then tcp: {s:?}");
        }
        // Paused: tcp is tried first, without touching rdma.
        control.set_faults(EmulatedFaults::default());
        let mut req = request(&r, Opcode::Write, 0, 64 << 10, false);
        req.hint = ferry_core::TransportHint::Auto;
        let s = one(r
            .initiator
            .transfer_blocking(&[req.clone()])
            .expect("paused"));
        assert_eq!(
            (s.transport, s.attempts),
            (Some(TransportKind::Tcp), 1),
            "{s:?}"
        );
        // After the cooldown rdma is first again.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            wait_reachable(&r);
            let s = one(r
                .initiator
                .transfer_blocking(&[req.clone()])
                .expect("after"));
            if s.transport == Some(TransportKind::Rdma) && s.attempts == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "rdma never recovered: {s:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

#[test]
fn without_a_device_rdma_is_disabled_with_the_reason() {
    within(Duration::from_secs(30), "test body", || {
        let cfg = EngineConfig {
            transports: vec![TransportKind::Rdma, TransportKind::Tcp],
            extra_transports: vec![Arc::new(RdmaFactory {
                config: RdmaConfig {
                    provider: ProviderChoice::Ibverbs,
                    ..RdmaConfig::default()
                },
            })],
            ..EngineConfig::default()
        };
        if !Path::new("/sys/class/infiniband")
            .read_dir()
            .map(|mut d| d.next().is_none())
            .unwrap_or(true)
        {
            eprintln!("skipped: this machine has RDMA devices");
            return;
        }
        let target = Engine::new(EngineConfig::default()).expect("target");
        let initiator = Engine::new(cfg).expect("the engine starts without rdma");
        let r = Pair::new(target, initiator, 4096);
        let initiator = &r.initiator;
        let mut req = request(&r, Opcode::Write, 0, 4096, true);
        let e = initiator
            .transfer_blocking(&[req.clone()])
            .expect_err("rdma required");
        assert_eq!(e.code(), "ERR_FERRY_TRANSPORT_UNAVAILABLE", "{e}");
        let text = e.to_string();
        assert!(text.contains("rdma is disabled"), "{text}");
        assert!(
            text.contains("no RDMA device") || text.contains("libibverbs"),
            "{text}"
        );
        // The engine runs on the others.
        req.hint = ferry_core::TransportHint::Auto;
        let s = one(initiator.transfer_blocking(&[req]).expect("tcp"));
        assert_eq!(s.status, TransferStatus::Completed);
        assert_eq!(s.transport, Some(TransportKind::Tcp));
    });
}

#[test]
fn registered_user_memory_is_served_over_rdma_on_both_ends() {
    within(Duration::from_secs(60), "test body", || {
        const LEN: usize = 3 << 20;
        let target = engine_with(provider(EmulatedFaults::default()), |_, _| {});
        let initiator = engine_with(provider(EmulatedFaults::default()), |_, _| {});
        // User memory on both sides (not engine-owned regions).
        let mut theirs = vec![0u8; LEN].into_boxed_slice();
        let mut ours: Box<[u8]> = (0..LEN).map(|i| (i % 253) as u8).collect();
        let (tp, ip) = (theirs.as_mut_ptr(), ours.as_mut_ptr());
        // SAFETY: each box is moved into its registration, which keeps it alive (and its
        // heap memory in place) until the region is released.
        let remote = unsafe {
            target.register_memory(tp, LEN, ferry_core::Access::ReadWrite, Box::new(theirs))
        }
        .expect("register target memory");
        // SAFETY: as above.
        let local = unsafe {
            initiator.register_memory(ip, LEN, ferry_core::Access::ReadWrite, Box::new(ours))
        }
        .expect("register initiator memory");
        let info = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open");
        let published = info
            .buffers
            .iter()
            .find(|b| b.id == remote.id())
            .expect("published");
        assert!(
            published.transports.contains(&TransportKind::Rdma),
            "{published:?}"
        );
        assert!(
            published.transport_info.contains_key("rdma"),
            "{published:?}"
        );
        let req = Request {
            opcode: Opcode::Write,
            local: local.id(),
            local_offset: 0,
            segment: info.handle,
            remote_buffer: remote.id(),
            remote_offset: 0,
            length: LEN as u64,
            hint: ferry_core::TransportHint::Require(TransportKind::Rdma),
            verify: false,
        };
        let s = one(initiator.transfer_blocking(&[req]).expect("write"));
        assert_eq!(s.status, TransferStatus::Completed, "{s:?}");
        assert_eq!(s.transport, Some(TransportKind::Rdma));
        assert!(bytes_of(&remote) == bytes_of(&local), "user memory differs");
        initiator.close();
        target.close();
    });
}

#[test]
fn a_device_allowlist_that_matches_nothing_disables_rdma_and_says_so() {
    within(Duration::from_secs(30), "test body", || {
        let engine = engine_with(provider(EmulatedFaults::default()), |_, rdma| {
            rdma.devices = vec!["mlx5_9".into()];
        });
        let target = Engine::new(EngineConfig::default()).expect("target");
        let seg = engine
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        let why = engine
            .transport_reachable(seg, TransportKind::Rdma)
            .expect("open engine")
            .expect_err("rdma must be disabled");
        assert!(why.contains("allowlist"), "{why}");
        assert!(why.contains("emu0"), "names the devices present: {why}");
        engine.close();
        target.close();
    });
}

/// Builds the rdma transport and keeps a handle to it, for tests that look inside.
struct Recording {
    config: RdmaConfig,
    built: Arc<Mutex<Option<Arc<RdmaTransport>>>>,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording").finish()
    }
}

impl TransportFactory for Recording {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }
    fn build(&self, context: TransportContext) -> ferry_core::Result<Arc<dyn Transport>> {
        let t = Arc::new(
            RdmaTransport::open(self.config.clone(), context)
                .map_err(ferry_core::Error::TransportUnavailable)?,
        );
        *self.built.lock().expect("built") = Some(t.clone());
        Ok(t)
    }
}

#[test]
fn the_target_side_of_a_departed_peer_is_released_and_a_connected_one_is_kept() {
    within(Duration::from_secs(60), "test body", || {
        let built = Arc::new(Mutex::new(None));
        let target = Engine::new(EngineConfig {
            transports: vec![TransportKind::Rdma, TransportKind::Tcp],
            extra_transports: vec![Arc::new(Recording {
                config: RdmaConfig {
                    provider_instance: Some(provider(EmulatedFaults::default())),
                    passive_grace: Duration::from_millis(300),
                    ..RdmaConfig::default()
                },
                built: built.clone(),
            })],
            ..EngineConfig::default()
        })
        .expect("target");
        let rdma = built
            .lock()
            .expect("built")
            .clone()
            .expect("rdma transport");
        let initiator = engine_with(provider(EmulatedFaults::default()), |_, _| {});
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        assert_eq!(rdma.passive_endpoints(), 2, "one per initiator queue pair");
        // Connected: kept well past the grace period.
        std::thread::sleep(Duration::from_millis(1800));
        assert_eq!(
            rdma.passive_endpoints(),
            2,
            "released while the peer is connected"
        );
        // The initiator closes the segment: its control connection goes, and after the
        // grace period (checked every second) the target side is released.
        initiator.close_segment(seg).expect("close segment");
        let deadline = Instant::now() + Duration::from_secs(5);
        while rdma.passive_endpoints() > 0 {
            assert!(Instant::now() < deadline, "never released");
            std::thread::sleep(Duration::from_millis(50));
        }
        initiator.close();
        target.close();
    });
}

#[test]
fn with_a_cluster_secret_the_rdma_handshake_runs_and_read_only_memory_stays_unwritten() {
    within(Duration::from_secs(60), "test body", || {
        let secret = |b: u8| Some(ferry_core::auth::Secret::new(vec![b; 32]).expect("secret"));
        let target = engine_with(provider(EmulatedFaults::default()), |c, _| {
            c.auth_secret = secret(1)
        });
        let initiator = engine_with(provider(EmulatedFaults::default()), |c, _| {
            c.auth_secret = secret(1)
        });
        let r = Pair::new(target, initiator, 1 << 20);
        fill(&r.local, 4);
        let s = one(r
            .initiator
            .transfer_blocking(&[request(&r, Opcode::Write, 0, 1 << 20, true)])
            .expect("write"));
        assert_eq!(s.status, TransferStatus::Completed, "{s:?}");
        assert!(bytes_of(&r.local) == bytes_of(&r.remote));
        // Read-only user memory: published for rdma reads, writes refused.
        let ro = user_region(&r.target, 6, 4096, ferry_core::Access::ReadOnly);
        let info = r
            .initiator
            .open_segment_blocking(r.target.segment_name())
            .expect("reopen");
        let req = Request {
            opcode: Opcode::Write,
            local: r.local.id(),
            local_offset: 0,
            segment: info.handle,
            remote_buffer: ro.id(),
            remote_offset: 0,
            length: 4096,
            hint: ferry_core::TransportHint::Require(TransportKind::Rdma),
            verify: false,
        };
        let err = r.initiator.transfer_blocking(&[req]).expect_err("refused");
        assert_eq!(err.code(), "ERR_FERRY_PERMISSION_DENIED", "{err}");
        assert_eq!(bytes_of(&ro), vec![6u8; 4096]);
        // Another secret opens nothing, so no rkey reaches it.
        let stranger = engine_with(provider(EmulatedFaults::default()), |c, _| {
            c.auth_secret = secret(2)
        });
        assert!(stranger
            .open_segment_blocking(r.target.segment_name())
            .is_err());
        stranger.close();
    });
}

#[test]
fn with_encrypt_the_rdma_handshake_runs_on_sealed_control_connections() {
    // Both engines seal every tcp connection (`encrypt: true`), the control connections
    // that carry the rdma endpoint handshake and its end-to-end check among them: the
    // handshake runs sealed and the bytes move over rdma.
    within(Duration::from_secs(60), "test body", || {
        let sealing = |c: &mut EngineConfig, _: &mut RdmaConfig| {
            c.auth_secret = Some(ferry_core::auth::Secret::new(vec![7; 32]).expect("secret"));
            c.encrypt = ferry_core::Encrypt::Always;
        };
        let target = engine_with(provider(EmulatedFaults::default()), sealing);
        let initiator = engine_with(provider(EmulatedFaults::default()), sealing);
        let r = Pair::new(target, initiator, 1 << 20);
        fill(&r.local, 4);
        let write = Request {
            verify: true,
            ..request(&r, Opcode::Write, 0, 1 << 20, true)
        };
        let s = one(r.initiator.transfer_blocking(&[write]).expect("write"));
        assert_eq!(s.status, TransferStatus::Completed, "{s:?}");
        assert!(bytes_of(&r.local) == bytes_of(&r.remote));
        let refused: u64 = r
            .target
            .metrics()
            .auth_failures
            .iter()
            .map(|(_, n)| n)
            .sum();
        assert_eq!(refused, 0, "a handshake was refused");
    });
}

#[test]
fn an_endpoint_reconnect_that_reaches_a_new_incarnation_moves_the_segment_to_it() {
    within(Duration::from_secs(60), "test body", || {
        const LEN: u64 = 1 << 20;
        let peer_timeout = Duration::from_secs(6);
        let listen_via = |proxy: &ferry_testkit::Proxy, listen: &str| {
            let addr = proxy.addr().to_string();
            engine_with(provider(EmulatedFaults::default()), |c, _| {
                c.listen = listen.to_string();
                c.advertise = Some(addr);
            })
        };
        let proxy = ferry_testkit::Proxy::start();
        let first = listen_via(&proxy, "127.0.0.1:0");
        proxy.forward_to(first.local_addr());
        let buffer = first.allocate(LEN).expect("buffer");
        // Completions come 500 ms late, so that the first write to the new incarnation is
        // still in flight when the reconnect that found it tries its slot again (200 ms
        // after its first try): that try must leave an endpoint that is up alone. It
        // replaced it once, and the write then waited, on a queue pair no longer polled,
        // for its 10 s attempt deadline.
        let slow = provider(EmulatedFaults {
            delay: Duration::from_millis(500),
            ..EmulatedFaults::default()
        });
        let initiator = engine_with(slow, |c, _| {
            c.transports = vec![TransportKind::Rdma];
            c.peer_timeout = peer_timeout;
        });
        let events: Arc<Mutex<Vec<EngineEvent>>> = Arc::default();
        let sink = events.clone();
        initiator.set_event_sink(Some(Arc::new(move |e| {
            sink.lock().expect("events").push(e);
        })));
        let losses = || -> Vec<&'static str> {
            let events = events.lock().expect("events");
            events
                .iter()
                .filter_map(|e| match e {
                    EngineEvent::PeerLost { reason, .. } => Some(reason.kind().name()),
                    _ => None,
                })
                .collect()
        };
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking(first.segment_name())
            .expect("open")
            .handle;
        let write = |buffer: u64| {
            let req = Request {
                opcode: Opcode::Write,
                local: local.id(),
                local_offset: 0,
                segment: seg,
                remote_buffer: buffer,
                remote_offset: 0,
                length: LEN,
                hint: ferry_core::TransportHint::Require(TransportKind::Rdma),
                verify: false,
            };
            // Refused at once while no endpoint is up.
            initiator.transfer_blocking(&[req]).map(one)
        };
        // The link's connection goes silent: it learns nothing of the restart until the
        // peer timeout.
        proxy.freeze();
        let frozen_at = Instant::now();
        fill(&local, 41);
        let snap = write(buffer.id()).expect("transfer");
        assert_eq!(snap.status, TransferStatus::Completed, "{:?}", snap.error);
        let listen = first.local_addr().to_string();
        first.close();
        let second = listen_via(&proxy, &listen);
        let fresh = second.allocate(LEN).expect("fresh buffer");
        assert_eq!(fresh.id(), buffer.id());
        // The endpoints break on the gone incarnation and reconnect to the new one first.
        fill(&local, 42);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let outcome = write(fresh.id());
            if outcome
                .as_ref()
                .is_ok_and(|s| s.status == TransferStatus::Completed)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never reached the new incarnation: {outcome:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(bytes_of(&fresh), bytes_of(&local));
        assert!(
            frozen_at.elapsed() < peer_timeout,
            "reached only once the link timed out: {:?}",
            losses()
        );
        assert_eq!(losses(), ["restarted"]);
        while frozen_at.elapsed() < peer_timeout * 3 / 2 {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(losses(), ["restarted"], "the link left the old incarnation");
        initiator.close();
        second.close();
    });
}
