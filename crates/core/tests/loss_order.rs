//! `PeerLost` comes before the failures it explains: work in flight towards a peer that
//! goes away fails only after the engine has emitted the event, whichever of the data
//! connections and the control link notices first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
