//! Sealed control connections (`encrypt`): between two engines that seal, the descriptor
//! fetch (with the segment's access token), the link's notifications and transport control
//! requests (the rdma handshake's path) cross the wire sealed, and a byte flipped on a
//! control connection drops it with `ERR_FERRY_TAMPERED` and changes nothing. The same
//! traffic with `encrypt: false` carries all of it in clear: the capture sees plaintext
//! where there is some.

use std::time::Duration;

use ferry_core::auth::Secret;
use ferry_core::{Encrypt, Engine, EngineConfig, NotifyOutcome, TransportKind};
use ferry_testkit::{within, Flip, Proxy};

const BOUND: Duration = Duration::from_secs(60);
/// A notification's payload, looked for on the wire.
const NOTE: &[u8] = b"notification-payload-PLAINTEXT-7f3a";
/// A transport control request's payload, looked for on the wire.
const CONTROL: &[u8] = b"transport-request-PLAINTEXT-91c2";
/// The descriptor's access-token field, as its JSON names it.
const TOKEN_FIELD: &[u8] = b"\"token\":\"";
/// Where the relay flips a byte of each control connection: past the handshake (144
/// bytes each way), inside the first frame after it (the descriptor request on its way
/// to the target, the descriptor on its way back).
const FLIP_AT: u64 = 200;

fn secret() -> Secret {
    Secret::new(vec![0x3c; 32]).expect("secret")
}

/// A target that advertises `relay` (so every connection to it crosses the relay) and an
/// initiator, both with `encrypt`.
fn engines(relay: &Proxy, encrypt: Encrypt) -> (Engine, Engine) {
    let config = |advertise: Option<String>| EngineConfig {
        transports: vec![TransportKind::Tcp],
        auth_secret: Some(secret()),
        encrypt,
        advertise,
        ..EngineConfig::default()
    };
    let target = Engine::new(config(Some(relay.addr().to_string()))).expect("target");
    relay.forward_to(target.local_addr());
    let initiator = Engine::new(config(None)).expect("initiator");
    (target, initiator)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Sends a transport control request (`control::transport_request`) to `addr` from
/// `from`; its result's code (the tcp transport takes no control requests: the target
/// refuses it, as a protocol error, after reading it).
fn control_request(from: &Engine, addr: &str) -> &'static str {
    let sent = runtime().block_on(ferry_core::control::transport_request(
        addr,
        from.engine_id(),
        TransportKind::Tcp,
        CONTROL,
        Duration::from_secs(10),
    ));
    match sent {
        Ok(_) => "OK",
        Err(e) => e.code(),
    }
}

/// Opens the target, notifies it and sends it a control request, all through a capturing
/// relay; what the relay saw: (the token field, the notification, the control request).
fn seen_on_the_wire(encrypt: Encrypt) -> (bool, bool, bool) {
    let relay = Proxy::start();
    relay.capture();
    let (target, initiator) = engines(&relay, encrypt);
    target.allocate(1 << 16).expect("remote");
    let seg = initiator
        .open_segment_blocking(target.segment_name())
        .expect("open")
        .handle;
    assert_eq!(
        initiator.notify_blocking(seg, NOTE),
        Ok(NotifyOutcome::Queued)
    );
    let notes = target.take_notifications(8).expect("notifications");
    assert_eq!(notes.len(), 1, "the notification arrived");
    assert_eq!(notes[0].data, NOTE);
    let code = control_request(&initiator, target.segment_name());
    assert_eq!(code, "ERR_FERRY_PROTOCOL", "the target read the request");
    assert!(relay.captured_len() > 0, "the relay saw the traffic");
    let seen = (
        relay.relayed(TOKEN_FIELD),
        relay.relayed(NOTE),
        relay.relayed(CONTROL),
    );
    initiator.close();
    target.close();
    seen
}

#[test]
fn sealing_engines_send_no_descriptor_token_notification_or_control_request_in_clear() {
    within(BOUND, "sealed control traffic", || {
        assert_eq!(
            seen_on_the_wire(Encrypt::Always),
            (false, false, false),
            "(token, notification, control request) seen in clear"
        );
    });
}

#[test]
fn without_sealing_the_capture_sees_them_in_clear() {
    within(BOUND, "plaintext control traffic", || {
        assert_eq!(seen_on_the_wire(Encrypt::Never), (true, true, true));
    });
}

/// Opens the target through a relay that flips a byte of each control connection's first
/// frame after the handshake (`to_target`: the request, else the reply): the open's error
/// code; then, the relay intact again, whether the target still serves a fresh open.
fn open_through_a_flip(to_target: bool) -> (&'static str, u64, bool) {
    let relay = Proxy::start();
    relay.corrupt(Some(Flip {
        to_target,
        at: FLIP_AT,
    }));
    let (target, initiator) = engines(&relay, Encrypt::Always);
    target.allocate(1 << 16).expect("remote");
    let code = match initiator.open_segment_blocking(target.segment_name()) {
        Ok(_) => "OK",
        Err(e) => e.code(),
    };
    let flipped = relay.flipped();
    relay.corrupt(None);
    let fresh = initiator
        .open_segment_blocking(target.segment_name())
        .is_ok();
    initiator.close();
    target.close();
    (code, flipped, fresh)
}

#[test]
fn a_flipped_descriptor_request_drops_the_connection_as_tampered() {
    within(BOUND, "flipped descriptor request", || {
        let (code, flipped, fresh) = open_through_a_flip(true);
        assert!(flipped >= 1, "the relay flipped a byte");
        assert_eq!(code, "ERR_FERRY_TAMPERED");
        assert!(fresh, "the target serves the next connection");
    });
}

#[test]
fn a_flipped_descriptor_reply_drops_the_connection_as_tampered() {
    within(BOUND, "flipped descriptor reply", || {
        let (code, flipped, fresh) = open_through_a_flip(false);
        assert!(flipped >= 1, "the relay flipped a byte");
        assert_eq!(code, "ERR_FERRY_TAMPERED");
        assert!(fresh, "the target serves the next connection");
    });
}

#[test]
fn a_flipped_transport_control_request_is_tampered_and_never_served() {
    within(BOUND, "flipped control request", || {
        let relay = Proxy::start();
        let (target, initiator) = engines(&relay, Encrypt::Always);
        relay.corrupt(Some(Flip {
            to_target: true,
            at: FLIP_AT,
        }));
        assert_eq!(
            control_request(&initiator, target.segment_name()),
            "ERR_FERRY_TAMPERED"
        );
        assert!(relay.flipped() >= 1);
        initiator.close();
        target.close();
    });
}
