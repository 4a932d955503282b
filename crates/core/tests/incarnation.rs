//! Peer incarnations: a segment handle follows its name across the peer's restart, finds
//! the buffers the peer allocates later without a reopen, never carries a byte planned for
//! one incarnation into another, and every loss says why (`closed`, `crashed`, `timeout`,
//! `restarted`). `closeSegment` is no loss.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, EngineEvent, Opcode, Region, Request, TaskSnapshot, TransferStatus,
    TransportHint, TransportKind,
};
use ferry_testkit::{bytes_at, fill, one, within, Proxy};

const LEN: u64 = 1 << 20;
const BOUND: Duration = Duration::from_secs(20);

fn config(transports: &[TransportKind]) -> EngineConfig {
    EngineConfig {
        transports: transports.to_vec(),
        peer_timeout: Duration::from_millis(1500),
        ..EngineConfig::default()
    }
}

/// A target listening on `listen`, published as `advertise` when given.
fn target(transports: &[TransportKind], listen: &str, advertise: Option<SocketAddr>) -> Engine {
    Engine::new(EngineConfig {
        listen: listen.into(),
        advertise: advertise.map(|a| a.to_string()),
        ..config(transports)
    })
    .expect("target")
}

/// The initiator's events, recorded.
fn record(engine: &Engine) -> Arc<Mutex<Vec<EngineEvent>>> {
    let events: Arc<Mutex<Vec<EngineEvent>>> = Arc::default();
    let sink = events.clone();
    engine.set_event_sink(Some(Arc::new(move |e| {
        sink.lock().expect("events").push(e);
    })));
    events
}

/// Waits (bounded) until `f` finds something in the events.
fn wait_event<T>(
    events: &Mutex<Vec<EngineEvent>>,
    what: &str,
    mut f: impl FnMut(&[EngineEvent]) -> Option<T>,
) -> T {
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(found) = f(&events.lock().expect("events")) {
            return found;
        }
        assert!(Instant::now() < deadline, "never saw {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn losses(events: &[EngineEvent]) -> Vec<&'static str> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::PeerLost { reason, .. } => Some(reason.kind().name()),
            _ => None,
        })
        .collect()
}

fn recoveries(events: &[EngineEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, EngineEvent::PeerRecovered { .. }))
        .count()
}

fn request_to(local: &Region, segment: u64, buffer: u64, hint: TransportHint) -> Request {
    Request {
        opcode: Opcode::Write,
        local: local.id(),
        local_offset: 0,
        segment,
        remote_buffer: buffer,
        remote_offset: 0,
        length: LEN,
        hint,
        verify: false,
    }
}

fn write(
    initiator: &Engine,
    local: &Region,
    segment: u64,
    buffer: u64,
    hint: TransportHint,
) -> TaskSnapshot {
    let req = request_to(local, segment, buffer, hint);
    one(initiator.transfer_blocking(&[req]).expect("transfer"))
}

fn assert_landed(snap: &TaskSnapshot, local: &Region, remote: &Region) {
    assert_eq!(snap.status, TransferStatus::Completed, "{:?}", snap.error);
    assert_eq!(bytes_at(remote, 0, LEN), bytes_at(local, 0, LEN));
}

const KINDS: [TransportKind; 2] = [TransportKind::Tcp, TransportKind::Shm];

#[test]
fn a_buffer_allocated_after_open_is_usable_without_reopening() {
    within(BOUND * 2, "late buffers", || {
        for kind in KINDS {
            let t = target(&KINDS, "127.0.0.1:0", None);
            let initiator = Engine::new(config(&KINDS)).expect("initiator");
            let local = initiator.allocate(LEN).expect("local");
            fill(&local, 7);
            let seg = initiator
                .open_segment_blocking(t.segment_name())
                .expect("open");
            assert!(seg.buffers.is_empty());
            // Allocated once the segment is open: the handle still finds it.
            let late = t.allocate(LEN).expect("late");
            let snap = write(
                &initiator,
                &local,
                seg.handle,
                late.id(),
                TransportHint::Require(kind),
            );
            assert_landed(&snap, &local, &late);
            assert_eq!(snap.transport, Some(kind));
            // A buffer that does not exist is still refused.
            let mut bogus = request_to(&local, seg.handle, 999, TransportHint::Auto);
            let refused = initiator.transfer_blocking(&[bogus.clone()]);
            assert_eq!(
                refused.map(|_| ()).map_err(|e| e.code()),
                Err("ERR_FERRY_UNKNOWN_BUFFER")
            );
            bogus.remote_buffer = late.id();
            assert!(initiator.transfer_blocking(&[bogus]).is_ok());
            initiator.close();
            t.close();
        }
    });
}

#[test]
fn the_old_handle_reaches_a_restarted_peer_and_the_buffer_it_allocates_after_start() {
    within(BOUND * 2, "restart", || {
        for kind in KINDS {
            // A port the kernel hands to no outgoing connection while the peer is away.
            let listen = format!("127.0.0.1:{}", ferry_testkit::unused_port());
            let first = target(&KINDS, &listen, None);
            let old_buffer = first.allocate(LEN).expect("first buffer");
            let initiator = Engine::new(config(&KINDS)).expect("initiator");
            let events = record(&initiator);
            let local = initiator.allocate(LEN).expect("local");
            fill(&local, 11);
            let seg = initiator.open_segment_blocking(&listen).expect("open");
            let hint = TransportHint::Require(kind);
            assert_landed(
                &write(&initiator, &local, seg.handle, old_buffer.id(), hint),
                &local,
                &old_buffer,
            );
            // The peer closes (its goodbye says so) and starts again on the same address.
            first.close();
            let reason = wait_event(&events, "the loss", |e| losses(e).first().copied());
            assert_eq!(reason, "closed", "a closing engine says goodbye");
            let second = target(&KINDS, &listen, None);
            assert_ne!(second.engine_id(), first.engine_id());
            wait_event(&events, "the recovery", |e| {
                (recoveries(e) > 0).then_some(())
            });
            // Only now does it allocate: the same buffer id, as the first allocation of
            // its incarnation.
            let buffer = second.allocate(LEN).expect("second buffer");
            assert_eq!(buffer.id(), old_buffer.id());
            fill(&local, 12);
            let snap = write(&initiator, &local, seg.handle, buffer.id(), hint);
            assert_landed(&snap, &local, &buffer);
            assert_eq!(snap.transport, Some(kind));
            initiator.close();
            second.close();
        }
    });
}

#[test]
fn close_segment_during_shm_copies_ends_them_as_a_closed_segment_not_a_loss() {
    within(BOUND * 3, "close during shm copies", || {
        let shm = [TransportKind::Shm];
        let t = target(&shm, "127.0.0.1:0", None);
        let remote = t.allocate(64 << 20).expect("remote");
        let initiator = Engine::new(config(&shm)).expect("initiator");
        let events = record(&initiator);
        let local = initiator.allocate(64 << 20).expect("local");
        let mut cut = 0;
        for _round in 0..20 {
            let seg = initiator
                .open_segment_blocking(t.segment_name())
                .expect("(re)open");
            let requests: Vec<Request> = (0..64u64)
                .map(|i| Request {
                    opcode: Opcode::Write,
                    local: local.id(),
                    local_offset: (i % 8) << 23,
                    segment: seg.handle,
                    remote_buffer: remote.id(),
                    remote_offset: (i % 8) << 23,
                    length: 8 << 20,
                    hint: TransportHint::Require(TransportKind::Shm),
                    verify: false,
                })
                .collect();
            // An awaited call: the copies beyond what the submitting thread takes go to the
            // copy threads, and are still queued when it returns.
            let (tx, done) = std::sync::mpsc::channel();
            initiator
                .transfer(&requests, move |snaps| {
                    let _ = tx.send(snaps);
                })
                .expect("transfer");
            initiator.close_segment(seg.handle).expect("close segment");
            for s in done.recv_timeout(BOUND).expect("the call ended") {
                if s.status == TransferStatus::Completed {
                    continue;
                }
                cut += 1;
                let code = s.error.as_ref().map(|e| e.code());
                assert_eq!(code, Some("ERR_FERRY_SEGMENT_CLOSED"), "{:?}", s.error);
            }
            if cut > 0 {
                break;
            }
        }
        assert!(cut > 0, "no copy was in flight at any close");
        assert!(losses(&events.lock().expect("events")).is_empty());
        // Reopened, it works; and its real loss later is reported.
        let seg = initiator
            .open_segment_blocking(t.segment_name())
            .expect("reopen");
        fill(&local, 3);
        let snap = write(
            &initiator,
            &local,
            seg.handle,
            remote.id(),
            TransportHint::Require(TransportKind::Shm),
        );
        assert_eq!(snap.status, TransferStatus::Completed, "{:?}", snap.error);
        t.close();
        let reason = wait_event(&events, "the real loss", |e| losses(e).first().copied());
        assert_eq!(reason, "closed");
        initiator.close();
    });
}

/// A tcp-only target behind a proxy, the initiator with its segment open through it.
struct Proxied {
    proxy: Proxy,
    target: Engine,
    initiator: Engine,
    events: Arc<Mutex<Vec<EngineEvent>>>,
    local: Arc<Region>,
    seg: u64,
}

/// Cuts the proxy's connections until the link had one to cut (it connects on its own
/// after the open) and waits for it to be back: its connection is then up, and a freeze or
/// a cut reaches it. Returns why the link was lost.
fn cut_link(p: &Proxied) -> &'static str {
    let seen = losses(&p.events.lock().expect("events")).len();
    let reason = wait_event(&p.events, "the loss", |e| {
        p.proxy.cut();
        losses(e).get(seen).copied()
    });
    let back = recoveries(&p.events.lock().expect("events"));
    wait_event(&p.events, "the recovery", |e| {
        (recoveries(e) > back).then_some(())
    });
    reason
}

fn proxied() -> Proxied {
    let tcp = [TransportKind::Tcp];
    let proxy = Proxy::start();
    let target = target(&tcp, "127.0.0.1:0", Some(proxy.addr()));
    proxy.forward_to(target.local_addr());
    let initiator = Engine::new(config(&tcp)).expect("initiator");
    let events = record(&initiator);
    let local = initiator.allocate(LEN).expect("local");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    Proxied {
        proxy,
        target,
        initiator,
        events,
        local,
        seg,
    }
}

#[test]
fn a_peer_gone_without_a_goodbye_is_crashed_and_a_silent_one_timed_out() {
    within(BOUND * 2, "crash and silence", || {
        let p = proxied();
        assert_eq!(
            cut_link(&p),
            "crashed",
            "a connection closed without a goodbye"
        );
        p.proxy.freeze();
        let reason = wait_event(&p.events, "the second loss", |e| losses(e).get(1).copied());
        assert_eq!(reason, "timeout");
        p.initiator.close();
        p.target.close();
    });
}

#[test]
fn a_restart_the_link_missed_is_restarted_and_no_byte_planned_for_the_old_incarnation_lands() {
    within(BOUND * 2, "restart unseen", || {
        let p = proxied();
        let buffer = p.target.allocate(LEN).expect("buffer");
        cut_link(&p);
        fill(&p.local, 21);
        let hint = TransportHint::Require(TransportKind::Tcp);
        assert_landed(
            &write(&p.initiator, &p.local, p.seg, buffer.id(), hint),
            &p.local,
            &buffer,
        );
        // Every connection of the old incarnation goes silent: its goodbye never arrives.
        p.proxy.freeze();
        // A write planned against it is stuck on the frozen connection.
        let req = request_to(&p.local, p.seg, buffer.id(), hint);
        let (tx, stale) = std::sync::mpsc::channel();
        p.initiator
            .transfer(&[req], move |snaps| {
                let _ = tx.send(snaps);
            })
            .expect("stale write");
        let listen = p.target.local_addr().to_string();
        let name = p.target.segment_name().to_string();
        p.target.close();
        let second = target(&[TransportKind::Tcp], &listen, Some(p.proxy.addr()));
        let fresh = second.allocate(LEN).expect("fresh buffer");
        assert_eq!(fresh.id(), buffer.id());
        // Reopening the name finds the new incarnation: the old one is lost, restarted.
        let info = p.initiator.open_segment_blocking(&name).expect("reopen");
        assert_eq!(info.handle, p.seg, "the same handle");
        assert_eq!(info.engine_id, second.engine_id());
        let reason = wait_event(&p.events, "the loss", |e| losses(e).get(1).copied());
        assert_eq!(reason, "restarted");
        let stale = stale.recv_timeout(BOUND).expect("the stale write ended");
        let error = stale[0].error.clone().expect("failed");
        assert_eq!(error.code(), "ERR_FERRY_PEER_LOST");
        assert!(
            matches!(&error, ferry_core::Error::PeerLost { reason, .. } if reason.kind().name() == "restarted"),
            "{error:?}"
        );
        assert!(
            bytes_at(&fresh, 0, LEN).iter().all(|b| *b == 0),
            "a byte planned for the old incarnation landed in the new one"
        );
        // New requests go to the new incarnation, through the old handle.
        fill(&p.local, 22);
        assert_landed(
            &write(&p.initiator, &p.local, p.seg, fresh.id(), hint),
            &p.local,
            &fresh,
        );
        // The link left the old incarnation's frozen connection: no silence is declared.
        std::thread::sleep(Duration::from_millis(3000));
        assert_eq!(
            losses(&p.events.lock().expect("events")),
            ["crashed", "restarted"]
        );
        p.initiator.close();
        second.close();
    });
}

#[test]
fn a_restart_only_a_data_connection_saw_moves_the_handle_to_the_new_incarnation() {
    within(BOUND * 2, "restart seen by a data connection", || {
        let tcp = [TransportKind::Tcp];
        let hint = TransportHint::Require(TransportKind::Tcp);
        let peer_timeout = Duration::from_secs(6);
        let proxy = Proxy::start();
        let first = target(&tcp, "127.0.0.1:0", Some(proxy.addr()));
        proxy.forward_to(first.local_addr());
        let buffer = first.allocate(LEN).expect("buffer");
        let initiator = Engine::new(EngineConfig {
            peer_timeout,
            ..config(&tcp)
        })
        .expect("initiator");
        let events = record(&initiator);
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking(first.segment_name())
            .expect("open")
            .handle;
        // The link's connection (the open's) goes silent: the link learns nothing of the
        // restart, neither the goodbye nor the new incarnation, until the peer timeout.
        proxy.freeze();
        let frozen_at = Instant::now();
        fill(&local, 31);
        assert_landed(
            &write(&initiator, &local, seg, buffer.id(), hint),
            &local,
            &buffer,
        );
        let listen = first.local_addr().to_string();
        first.close();
        let second = target(&tcp, &listen, Some(proxy.addr()));
        let fresh = second.allocate(LEN).expect("fresh buffer");
        assert_eq!(fresh.id(), buffer.id());
        // The data connection reconnects to the new incarnation first: the request planned
        // against the old one fails as restarted, and the handle moves to the new one.
        fill(&local, 32);
        let deadline = Instant::now() + BOUND;
        let snap = loop {
            let snap = write(&initiator, &local, seg, fresh.id(), hint);
            if snap.status == TransferStatus::Completed {
                break snap;
            }
            let error = snap.error.clone().expect("failed");
            assert!(
                matches!(&error, ferry_core::Error::PeerLost { reason, .. } if reason.kind().name() == "restarted"),
                "{error:?}"
            );
            assert!(
                Instant::now() < deadline,
                "never reached the new incarnation"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_landed(&snap, &local, &fresh);
        assert!(
            frozen_at.elapsed() < peer_timeout,
            "reached only once the link timed out"
        );
        assert_eq!(losses(&events.lock().expect("events")), ["restarted"]);
        // The link leaves its connection to the old incarnation: no second loss, no
        // silence declared once its peer timeout has passed.
        while frozen_at.elapsed() < peer_timeout * 3 / 2 {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(losses(&events.lock().expect("events")), ["restarted"]);
        assert!(recoveries(&events.lock().expect("events")) >= 1);
        initiator.close();
        second.close();
    });
}
