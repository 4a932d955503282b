//! A busy peer is not a dead one: the link counts every authenticated reply from the peer's
//! incarnation as a sign of life, not only its pongs. A peer whose link connection is
//! silent while its data replies flow stays up; once everything it sends stops, it is lost
//! for its silence within the bound.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, EngineEvent, Opcode, Request, TransferStatus, TransportHint,
    TransportKind,
};
use ferry_testkit::{one, within, Proxy};

const BOUND: Duration = Duration::from_secs(30);
const PEER_TIMEOUT: Duration = Duration::from_millis(400);
const LEN: u64 = 64 << 10;

fn losses(events: &[EngineEvent]) -> Vec<&'static str> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::PeerLost { reason, .. } => Some(reason.kind().name()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_peer_whose_data_replies_flow_is_not_lost_while_its_link_is_silent() {
    within(BOUND, "a silent link with data flowing", || {
        let tcp = vec![TransportKind::Tcp];
        let proxy = Proxy::start();
        let target = Engine::new(EngineConfig {
            transports: tcp.clone(),
            listen: "127.0.0.1:0".into(),
            advertise: Some(proxy.addr().to_string()),
            peer_timeout: PEER_TIMEOUT,
            ..EngineConfig::default()
        })
        .expect("target");
        proxy.forward_to(target.local_addr());
        let remote = target.allocate(LEN).expect("remote");
        let initiator = Engine::new(EngineConfig {
            transports: tcp,
            peer_timeout: PEER_TIMEOUT,
            ..EngineConfig::default()
        })
        .expect("initiator");
        let events: Arc<Mutex<Vec<EngineEvent>>> = Arc::default();
        let sink = events.clone();
        initiator.set_event_sink(Some(Arc::new(move |e| {
            sink.lock().expect("events").push(e);
        })));
        let local = initiator.allocate(LEN).expect("local");
        let seg = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open")
            .handle;
        // The only connection so far is the one the descriptor came on, which the link
        // keeps: from now on no ping and no pong crosses it. Data connections, made
        // afterwards, are forwarded.
        proxy.freeze();
        let write = || Request {
            opcode: Opcode::Write,
            local: local.id(),
            local_offset: 0,
            segment: seg,
            remote_buffer: remote.id(),
            remote_offset: 0,
            length: LEN,
            hint: TransportHint::Require(TransportKind::Tcp),
            verify: false,
        };
        // Writes, each answered, for many times the peer timeout: the peer is heard.
        let busy_until = Instant::now() + PEER_TIMEOUT * 6;
        let mut writes = 0;
        while Instant::now() < busy_until {
            let snap = one(initiator.transfer_blocking(&[write()]).expect("write"));
            assert_eq!(
                snap.status,
                TransferStatus::Completed,
                "write {writes} while the link was silent: {:?}",
                snap.error
            );
            writes += 1;
        }
        assert!(
            losses(&events.lock().expect("events")).is_empty(),
            "a peer answering {writes} writes was declared lost"
        );
        // Nothing more comes from it: lost for its silence, within the bound.
        let quiet = Instant::now();
        let reason = loop {
            if let Some(r) = losses(&events.lock().expect("events")).first().copied() {
                break r;
            }
            assert!(quiet.elapsed() < BOUND / 2, "a silent peer was never lost");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(reason, "timeout");
        // No sign older than its last reply keeps it: lost by twice the timeout, plus the
        // time this loaded machine may take to run the link.
        assert!(
            quiet.elapsed() < PEER_TIMEOUT * 2 + Duration::from_secs(2),
            "lost only {:?} after its last reply",
            quiet.elapsed()
        );
        initiator.close();
        target.close();
    });
}
