//! Notifications bound to the data and to the connection: a notification reaches only the
//! incarnation its data went to, a restarted target refuses it and its sender hears so,
//! and a connection that claims another engine's id — with or without the cluster secret —
//! can neither take over that engine's sequence numbers nor silence it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ferry_core::auth::{nonce, ClientHandshake, Secret, MAC_LEN};
use ferry_core::wire::{split_frame, ConnKind, Header, Op, HEADER_LEN};
use ferry_core::{Engine, EngineConfig, NotifyOutcome, Opcode, TransferStatus, TransportKind};
use ferry_testkit::{fill, request, within};

const LIMIT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-cluster";

fn tcp(secret: Option<&[u8]>) -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Tcp],
        auth_secret: secret.map(|s| Secret::new(s.to_vec()).expect("secret")),
        ..EngineConfig::default()
    }
}

/// A raw connection of `kind` (a notification connection, or a link, which carries them
/// too) to `addr` that claims to be engine `claimed`: the handshake (proving `secret` if
/// given), a `NotifyOpen` for receiver `receiver`, then `Notify` frames with the given
/// sequence numbers. Returns every frame the target sent back until it closed, or `None`
/// if the handshake was refused.
fn raw_notify(
    kind: ConnKind,
    addr: &str,
    claimed: u64,
    secret: Option<&[u8]>,
    receiver: u64,
    seqs: &[u64],
) -> Option<Vec<Header>> {
    let secret = secret.map(|s| Secret::new(s.to_vec()).expect("secret"));
    let hs = ClientHandshake::new(secret, kind as u64, claimed, nonce().expect("nonce"));
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(hs.hello()).expect("hello");
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).ok()?;
    if hs.expects_challenge() {
        let mut mac = [0u8; MAC_LEN];
        s.read_exact(&mut mac).ok()?;
        let proof = hs.answer(&head, &mac).ok()?;
        s.write_all(&proof).ok()?;
        s.read_exact(&mut head).ok()?;
    }
    if Header::decode(&head).ok()?.op != Op::HelloAck {
        return None;
    }
    let name = b"mallory:1";
    let mut open = Header::new(Op::NotifyOpen);
    open.buffer_id = receiver;
    open.token = [0x5a; 16];
    open.offset = 1;
    open.length = name.len() as u64;
    let mut out = open.encode().to_vec();
    out.extend_from_slice(name);
    for &seq in seqs {
        let mut n = Header::new(Op::Notify);
        n.request_id = seq;
        n.length = 6;
        out.extend_from_slice(&n.encode());
        out.extend_from_slice(b"forged");
    }
    s.write_all(&out).expect("frames");
    let _ = s.shutdown(Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let mut frames = Vec::new();
    let mut rest = &got[..];
    while let Ok(Some((h, payload))) = split_frame(rest) {
        frames.push(h);
        rest = &rest[HEADER_LEN + payload.len()..];
    }
    Some(frames)
}

fn refused_total(e: &Engine) -> bool {
    e.metrics()
        .to_prometheus()
        .lines()
        .any(|l| l.starts_with("ferry_notifications_refused_total ") && !l.ends_with(" 0"))
}

#[test]
fn a_forged_sender_id_with_the_highest_number_silences_no_one() {
    within(LIMIT, "forged sequence numbers", || {
        let cases = [None, Some(SECRET)]
            .into_iter()
            .flat_map(|s| [(s, ConnKind::Notify), (s, ConnKind::Control)]);
        for (secret, kind) in cases {
            let target = Engine::new(tcp(secret)).expect("target");
            let sender = Engine::new(tcp(secret)).expect("sender");
            let seg = sender
                .open_segment_blocking(target.segment_name())
                .expect("open")
                .handle;
            // The real sender is connected when the forger comes.
            assert_eq!(sender.notify_blocking(seg, b"1"), Ok(NotifyOutcome::Queued));
            let answers = raw_notify(
                kind,
                target.segment_name(),
                sender.engine_id(),
                secret,
                target.engine_id(),
                &[u64::MAX],
            );
            for n in 2..=4u8 {
                assert_eq!(
                    sender.notify_blocking(seg, &[b'0' + n]),
                    Ok(NotifyOutcome::Queued),
                    "secret {} {kind:?}: the real sender's notification {n} is queued",
                    secret.is_some()
                );
            }
            let got: Vec<Vec<u8>> = target
                .take_notifications(100)
                .expect("take")
                .into_iter()
                .map(|n| n.data)
                .collect();
            assert_eq!(
                got,
                [b"1", b"2", b"3", b"4"],
                "{kind:?}: nothing forged, nothing lost"
            );
            if answers.is_some() {
                assert!(refused_total(&target), "the forged number was counted");
            }
            sender.close();
            target.close();
        }
    });
}

#[test]
fn a_session_planned_for_another_incarnation_is_refused_by_the_target() {
    within(LIMIT, "another incarnation", || {
        for kind in [ConnKind::Notify, ConnKind::Control] {
            let target = Engine::new(tcp(Some(SECRET))).expect("target");
            let earlier = target.engine_id().wrapping_add(1);
            let addr = target.segment_name();
            let answers = raw_notify(kind, addr, 77, Some(SECRET), earlier, &[1, 2]);
            assert!(answers.is_some(), "{kind:?}: the handshake itself is fine");
            assert_eq!(
                target.notifications_queued(),
                0,
                "{kind:?}: nothing for the old instance"
            );
            assert!(refused_total(&target), "{kind:?}");
            target.close();
        }
    });
}

/// A tcp proxy in front of a target that hands notification connections to another engine
/// once told to: the target's address "restarts" for notifications while its control link
/// stays up, so the sender's descriptor still names the first incarnation. It plays a
/// target that does not serve notifications on its control connections (it clears
/// `ACK_LINK_NOTIFY` from their `HelloAck`), so the sender opens notification connections
/// of their own, as it does with a build that predates notifications on the link.
struct Proxy {
    addr: String,
    notify_to: Arc<Mutex<String>>,
    notify_pipes: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(backend: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let notify_to = Arc::new(Mutex::new(backend.to_string()));
        let notify_pipes: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (backend, to, pipes) = (backend.to_string(), notify_to.clone(), notify_pipes.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let mut hello = [0u8; HEADER_LEN];
                if client.read_exact(&mut hello).is_err() {
                    continue;
                }
                let kind = Header::decode(&hello).map(|h| h.buffer_id).unwrap_or(0);
                let notify = kind == ConnKind::Notify as u64;
                let dest = if notify {
                    to.lock().expect("to").clone()
                } else {
                    backend.clone()
                };
                let Ok(mut server) = TcpStream::connect(&dest) else {
                    continue;
                };
                if server.write_all(&hello).is_err() {
                    continue;
                }
                if notify {
                    if let Ok(c) = client.try_clone() {
                        pipes.lock().expect("pipes").push(c);
                    }
                }
                if kind == ConnKind::Control as u64 {
                    pipe_without_link_notify(client, server);
                } else {
                    pipe(client, server);
                }
            }
        });
        Self {
            addr,
            notify_to,
            notify_pipes,
        }
    }

    /// New notification connections go to `backend`; the open ones break.
    fn restart_notifications_at(&self, backend: &str) {
        *self.notify_to.lock().expect("to") = backend.to_string();
        for s in self.notify_pipes.lock().expect("pipes").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// `pipe` of a control connection, whose `HelloAck` (after the challenge, if any) is passed
/// on without its feature flags.
fn pipe_without_link_notify(client: TcpStream, mut server: TcpStream) {
    let (mut to_server, mut from_client) = (
        server.try_clone().expect("clone"),
        client.try_clone().expect("clone"),
    );
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(Shutdown::Both);
        let _ = from_client.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        let mut to_client = client;
        let mut head = [0u8; HEADER_LEN];
        loop {
            if server.read_exact(&mut head).is_err() {
                break;
            }
            let Ok(mut h) = Header::decode(&head) else {
                break;
            };
            if h.op == Op::AuthChallenge {
                let mut mac = [0u8; MAC_LEN];
                if server.read_exact(&mut mac).is_err()
                    || to_client.write_all(&head).is_err()
                    || to_client.write_all(&mac).is_err()
                {
                    break;
                }
                continue;
            }
            if h.op == Op::HelloAck {
                h.flags = 0;
            }
            if to_client.write_all(&h.encode()).is_ok() {
                let _ = std::io::copy(&mut server, &mut to_client);
            }
            break;
        }
        let _ = to_client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    });
}

/// Copies bytes both ways until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    for (mut from, mut to) in [
        (a.try_clone().expect("clone"), b.try_clone().expect("clone")),
        (b, a),
    ] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        });
    }
}

#[test]
fn a_restarted_target_never_gets_the_notification_of_data_its_predecessor_took() {
    within(LIMIT, "restarted target", || {
        let first = Engine::new(tcp(None)).expect("first incarnation");
        let second = Engine::new(tcp(None)).expect("second incarnation");
        let remote = first.allocate(1 << 20).expect("remote");
        let proxy = Proxy::start(first.segment_name());
        let sender = Engine::new(EngineConfig {
            peer_timeout: Duration::from_secs(30),
            ..tcp(None)
        })
        .expect("sender");
        let local = sender.allocate(1 << 20).expect("local");
        fill(&local, 3);
        let info = sender.open_segment_blocking(&proxy.addr).expect("open");
        assert_eq!(info.engine_id, first.engine_id());
        assert_eq!(
            sender.notify_blocking(info.handle, b"before"),
            Ok(NotifyOutcome::Queued)
        );
        proxy.restart_notifications_at(second.segment_name());

        // The data lands in the first incarnation; its notification must not reach the
        // second, and the call must not end OK.
        let (tx, rx) = mpsc::channel();
        let req = request(Opcode::Write, &local, info.handle, &remote, 0, 1 << 20);
        sender
            .transfer_notify(&[req], b"0:1048576".to_vec(), move |snaps, err| {
                let _ = tx.send((snaps[0].status, err));
            })
            .expect("submit");
        let (status, err) = rx.recv_timeout(WAIT).expect("call ended");
        assert_eq!(status, TransferStatus::Completed, "the data landed");
        let err = err.expect("the notification was not delivered: the call says so");
        assert_eq!(err.code(), "ERR_FERRY_NOTIFY_REFUSED", "{err}");
        assert!(err.to_string().contains("restarted"), "{err}");

        // A notification without data, planned while the descriptor names the first.
        let e = sender
            .notify_blocking(info.handle, b"alone")
            .expect_err("refused");
        assert_eq!(e.code(), "ERR_FERRY_NOTIFY_REFUSED", "{e}");

        assert_eq!(
            second.notifications_queued(),
            0,
            "the new instance got nothing"
        );
        let got: Vec<Vec<u8>> = first
            .take_notifications(10)
            .expect("take")
            .into_iter()
            .map(|n| n.data)
            .collect();
        assert_eq!(got, [b"before".to_vec()]);
        assert_eq!(sender.metrics().notifications.failed, 2);
        sender.close();
        first.close();
        second.close();
    });
}
