//! The cluster secret, tried as an attacker would: raw sockets that know only the address
//! (or the shm socket's name), while a holder of the secret is served meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::time::Duration;

use ferry_core::auth::{nonce, ClientHandshake, Secret, MAC_LEN};
use ferry_core::segment::SegmentDescriptor;
use ferry_core::wire::{ConnKind, Header, Op, RejectCode, HEADER_LEN};
use ferry_core::{Access, Engine, EngineConfig, Error, Opcode, TransferStatus, TransportKind};
use ferry_testkit::raw::{hello, ops_in, read_to_close, resident_bytes, shm_sockets};
use ferry_testkit::{bytes_of, fill, request, user_region};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-cluster";

fn config(secret: Option<&[u8]>) -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        auth_secret: secret.map(|s| Secret::new(s.to_vec()).expect("secret")),
        ..EngineConfig::default()
    }
}

fn auth_failures(e: &Engine, reason: &str) -> u64 {
    e.metrics()
        .auth_failures
        .iter()
        .find(|(r, _)| *r == reason)
        .map_or(0, |(_, n)| *n)
}

/// A target holding `SECRET` with one filled buffer, and its bytes.
fn target() -> (Engine, std::sync::Arc<ferry_core::Region>, Vec<u8>) {
    let t = Engine::new(config(Some(SECRET))).expect("target");
    let buf = t.allocate(1 << 20).expect("alloc");
    fill(&buf, 5);
    let before = bytes_of(&buf);
    (t, buf, before)
}

/// A holder of the secret writes and reads back: served while the attacks go on.
fn served(target: &Engine, remote: &ferry_core::Region) {
    let i = Engine::new(config(Some(SECRET))).expect("initiator");
    let local = i.allocate(4096).expect("local");
    fill(&local, 9);
    let seg = i
        .open_segment_blocking(target.segment_name())
        .expect("open with the secret");
    let req = request(Opcode::Write, &local, seg.handle, remote, 0, 4096);
    let done = i.transfer_blocking(&[req]).expect("write");
    assert_eq!(done[0].status, TransferStatus::Completed);
    assert_eq!(&bytes_of(remote)[..4096], &bytes_of(&local)[..]);
    i.close();
}

#[test]
fn no_secret_gets_no_descriptor_and_a_holder_is_served() {
    let (t, buf, before) = target();
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    let mut get = Header::new(Op::GetDescriptor);
    get.request_id = 1;
    s.write_all(&hello(false, ConnKind::Control).encode())
        .expect("hello");
    let _ = s.write_all(&get.encode());
    // The refusal alone, not the close after it: a peer that has read its refusal finds
    // the failure counted already (a client reports the refusal at once; an operator's
    // metrics read right then must show it).
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).expect("refusal header");
    let refusal = Header::decode(&head).expect("header");
    assert_eq!(
        (refusal.op, refusal.flags),
        (Op::Error, RejectCode::Auth as u16)
    );
    assert_eq!(
        auth_failures(&t, "no_secret"),
        1,
        "counted before the peer was told"
    );
    let mut text = vec![0u8; refusal.length as usize];
    s.read_exact(&mut text).expect("refusal text");
    let rest = read_to_close(&mut s);
    assert!(rest.is_empty(), "nothing after the refusal");
    assert!(!String::from_utf8_lossy(&text).contains("token"));
    assert_eq!(bytes_of(&buf), before, "memory unchanged");
    assert_eq!(auth_failures(&t, "no_secret"), 1);
    // A write frame straight after Hello, as an outsider would send it: nothing moves.
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    let mut h = hello(false, ConnKind::Control);
    h.buffer_id = ConnKind::Data as u64;
    let mut w = Header::new(Op::WriteReq);
    w.buffer_id = buf.id();
    w.length = 16;
    s.write_all(&h.encode()).expect("hello");
    let _ = s.write_all(&w.encode());
    let _ = s.write_all(&[0xEE; 16]);
    read_to_close(&mut s);
    assert_eq!(bytes_of(&buf), before, "memory unchanged");
    served(&t, &buf);
    t.close();
}

/// Sends an authenticating Hello and returns the server's challenge frame.
fn challenge(s: &mut TcpStream) -> Vec<u8> {
    s.write_all(&hello(true, ConnKind::Control).encode())
        .expect("hello");
    let mut c = vec![0u8; HEADER_LEN + MAC_LEN];
    s.read_exact(&mut c).expect("challenge");
    assert_eq!(Header::decode(&c).expect("header").op, Op::AuthChallenge);
    c
}

#[test]
fn a_wrong_proof_and_a_reflected_challenge_are_refused() {
    let (t, buf, before) = target();
    // A guessed proof.
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    challenge(&mut s);
    let mut proof = Header::new(Op::AuthProof);
    proof.length = MAC_LEN as u64;
    s.write_all(&proof.encode()).expect("proof");
    s.write_all(&[0x42; MAC_LEN]).expect("mac");
    let _ = s.write_all(&Header::new(Op::GetDescriptor).encode());
    assert_eq!(
        ops_in(&read_to_close(&mut s)),
        vec![(Op::Error, RejectCode::Auth as u16)]
    );
    // The server's own MAC sent back as our proof.
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    let c = challenge(&mut s);
    s.write_all(&proof.encode()).expect("proof");
    s.write_all(&c[HEADER_LEN..]).expect("reflected mac");
    let _ = s.write_all(&Header::new(Op::GetDescriptor).encode());
    assert_eq!(
        ops_in(&read_to_close(&mut s)),
        vec![(Op::Error, RejectCode::Auth as u16)]
    );
    // The challenge header itself as the proof frame.
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    let c = challenge(&mut s);
    s.write_all(&c).expect("reflected frame");
    assert_eq!(
        ops_in(&read_to_close(&mut s)),
        vec![(Op::Error, RejectCode::Auth as u16)]
    );
    assert_eq!(auth_failures(&t, "bad_proof"), 2);
    assert_eq!(auth_failures(&t, "protocol"), 1);
    assert!(t
        .metrics()
        .to_prometheus()
        .contains("ferry_auth_failures_total{reason=\"bad_proof\"} 2\n"));
    assert_eq!(bytes_of(&buf), before, "memory unchanged");
    served(&t, &buf);
    t.close();
}

#[test]
fn engines_with_another_secret_or_none_cannot_open_the_segment() {
    let (t, buf, _) = target();
    for secret in [Some(&b"another secret, also 32 bytes long!!"[..]), None] {
        let i = Engine::new(config(secret)).expect("initiator");
        let err = i
            .open_segment_blocking(t.segment_name())
            .expect_err("refused");
        assert!(matches!(err, Error::Connect { .. }), "{err}");
        i.close();
    }
    // A target that does not authenticate at all (no secret, not even the per-user one)
    // is refused by an initiator that holds one.
    let open = Engine::new(EngineConfig {
        allow_unauthenticated: true,
        ..config(None)
    })
    .expect("open target");
    let i = Engine::new(config(Some(SECRET))).expect("initiator");
    let err = i
        .open_segment_blocking(open.segment_name())
        .expect_err("refused");
    assert!(err.to_string().contains("does not authenticate"), "{err}");
    i.close();
    open.close();
    served(&t, &buf);
    t.close();
}

#[test]
fn the_shm_socket_hands_no_memfd_without_proof() {
    let (t, buf, before) = target();
    let sockets = shm_sockets();
    assert!(!sockets.is_empty(), "the target's shm socket is listed");
    for name in sockets {
        let addr = UnixAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let Ok(mut s) = UnixStream::connect_addr(&addr) else {
            continue; // another test's engine that just closed
        };
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        // The old protocol: a (guessed) token, then buffer ids.
        let _ = s.write_all(&[0u8; 16]);
        let _ = s.write_all(&buf.id().to_le_bytes());
        let mut reply = [0u8; 128];
        let (n, fds) = ferry_core::linux::recv_fds(&s, &mut reply, 1).unwrap_or((0, Vec::new()));
        assert!(fds.is_empty(), "no fd");
        let ops = ops_in(&reply[..n]);
        assert!(
            ops.is_empty() || ops == vec![(Op::Error, RejectCode::Auth as u16)],
            "{ops:?}"
        );
    }
    assert_eq!(bytes_of(&buf), before);
    served(&t, &buf);
    t.close();
}

#[test]
fn listening_beyond_loopback_needs_a_secret_or_an_explicit_opt_out() {
    let open = EngineConfig {
        listen: "0.0.0.0:0".into(),
        advertise: Some("127.0.0.1".into()),
        ..config(None)
    };
    let err = Engine::new(open.clone()).expect_err("refused");
    assert_eq!(err.code(), "ERR_FERRY_INVALID_ARGUMENT");
    assert!(err.to_string().contains("authSecret"), "{err}");
    let e = Engine::new(EngineConfig {
        allow_unauthenticated: true,
        ..open.clone()
    })
    .expect("opted out");
    e.close();
    let e = Engine::new(EngineConfig {
        auth_secret: Some(Secret::new(SECRET.to_vec()).expect("secret")),
        ..open
    })
    .expect("with a secret");
    e.close();
}

#[test]
fn connections_over_the_cap_are_refused_at_once_and_counted() {
    let t = Engine::new(EngineConfig {
        connections: ferry_core::ConnLimits {
            total: 1000,
            per_address: 4,
            ..ferry_core::ConnLimits::default()
        },
        ..config(Some(SECRET))
    })
    .expect("target");
    // Connections that have not proved the secret do not count against the cap.
    let idle: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(t.segment_name()).expect("connect"))
        .collect();
    let held: Vec<TcpStream> = (0..4)
        .map(|_| authenticated(t.segment_name(), ConnKind::Control).0)
        .collect();
    // The fifth that proves it is refused at once, told why instead of HelloAck.
    let (mut s, reply) = handshake(t.segment_name(), ConnKind::Control);
    // Told which cap it met, and its value, with the resource-limit code.
    assert_eq!(
        (reply.op, RejectCode::from_raw(reply.flags)),
        (Op::Error, RejectCode::ResourceLimit)
    );
    let mut text = vec![0u8; reply.length as usize];
    s.read_exact(&mut text).expect("refusal text");
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("maxConnectionsPerAddress (4)"), "{text}");
    assert!(read_to_close(&mut s).is_empty(), "closed after the refusal");
    let per_address = t
        .metrics()
        .connections_refused
        .iter()
        .find(|(r, _)| *r == "per_address")
        .map_or(0, |(_, n)| *n);
    assert_eq!(per_address, 1);
    drop(held);
    drop(idle);
    t.close();
}

/// A raw client that holds the secret, speaking the handshake through the library's pure
/// `auth` module: returns the stream and the server's answer to the proof.
fn handshake(addr: &str, kind: ConnKind) -> (TcpStream, Header) {
    let (s, reply, _) = handshake_recorded(addr, kind);
    (s, reply)
}

/// [`handshake`], with the bytes it sent (to replay).
fn handshake_recorded(addr: &str, kind: ConnKind) -> (TcpStream, Header, Vec<u8>) {
    let secret = Secret::new(SECRET.to_vec()).expect("secret");
    let hs = ClientHandshake::new(Some(secret), kind as u64, 77, nonce().expect("nonce"));
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut sent = hs.hello().to_vec();
    s.write_all(hs.hello()).expect("hello");
    let mut c = [0u8; HEADER_LEN + MAC_LEN];
    s.read_exact(&mut c).expect("challenge");
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&c[..HEADER_LEN]);
    let proof = hs.answer(&head, &c[HEADER_LEN..]).expect("server proved");
    s.write_all(&proof).expect("proof");
    sent.extend_from_slice(&proof);
    let mut reply = [0u8; HEADER_LEN];
    s.read_exact(&mut reply).expect("reply");
    (s, Header::decode(&reply).expect("reply"), sent)
}

/// A raw client that holds the secret and was let in: the stream and the bytes it sent.
fn authenticated(addr: &str, kind: ConnKind) -> (TcpStream, Vec<u8>) {
    let (s, ack, sent) = handshake_recorded(addr, kind);
    assert_eq!(ack.op, Op::HelloAck);
    (s, sent)
}

fn descriptor(s: &mut TcpStream) -> SegmentDescriptor {
    s.write_all(&Header::new(Op::GetDescriptor).encode())
        .expect("get");
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).expect("header");
    let h = Header::decode(&head).expect("decode");
    assert_eq!(h.op, Op::Descriptor);
    let mut body = vec![0u8; h.length as usize];
    s.read_exact(&mut body).expect("body");
    serde_json::from_slice(&body).expect("json")
}

#[test]
fn a_recorded_handshake_replayed_gets_nothing() {
    let (t, buf, before) = target();
    let (mut real, recorded) = authenticated(t.segment_name(), ConnKind::Control);
    let desc = descriptor(&mut real);
    assert_eq!(desc.buffers.len(), 1, "the holder of the secret is served");
    drop(real);
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    s.write_all(&recorded).expect("replay");
    let _ = s.write_all(&Header::new(Op::GetDescriptor).encode());
    let got = read_to_close(&mut s);
    let ops = ops_in(&got);
    assert_eq!(ops.first(), Some(&(Op::AuthChallenge, 0)), "{ops:?}");
    assert_eq!(ops.get(1), Some(&(Op::Error, RejectCode::Auth as u16)));
    assert_eq!(ops.len(), 2, "no descriptor: {ops:?}");
    assert!(!String::from_utf8_lossy(&got).contains(&desc.token));
    assert_eq!(auth_failures(&t, "bad_proof"), 1);
    assert_eq!(bytes_of(&buf), before);
    t.close();
}

#[test]
fn read_only_memory_is_refused_to_writes_over_tcp_and_never_offered_over_shm() {
    let t = Engine::new(config(Some(SECRET))).expect("target");
    let ro = user_region(&t, 3, 8192, Access::ReadOnly);
    let (mut s, _) = authenticated(t.segment_name(), ConnKind::Control);
    let desc = descriptor(&mut s);
    let b = desc
        .buffers
        .iter()
        .find(|b| b.id == ro.id())
        .expect("listed");
    assert!(
        !b.transports.contains(&TransportKind::Shm),
        "no memfd for it"
    );
    let token = desc.token_bytes().expect("token");
    // A holder of the secret and the token still cannot write it over tcp.
    let (mut d, _) = authenticated(t.segment_name(), ConnKind::Data);
    let mut w = Header::new(Op::WriteReq);
    w.buffer_id = ro.id();
    w.length = 16;
    w.token = token;
    d.write_all(&w.encode()).expect("write");
    d.write_all(&[0xEE; 16]).expect("payload");
    let mut head = [0u8; HEADER_LEN];
    d.read_exact(&mut head).expect("reply");
    let h = Header::decode(&head).expect("decode");
    assert_eq!((h.op, h.flags), (Op::Error, RejectCode::Permission as u16));
    assert_eq!(bytes_of(&ro), vec![3u8; 8192]);
    // And Ferry's own initiator refuses before sending.
    let i = Engine::new(config(Some(SECRET))).expect("initiator");
    let local = i.allocate(16).expect("local");
    let seg = i.open_segment_blocking(t.segment_name()).expect("open");
    let err = i
        .transfer_blocking(&[request(Opcode::Write, &local, seg.handle, &ro, 0, 16)])
        .expect_err("refused");
    assert_eq!(err.code(), "ERR_FERRY_PERMISSION_DENIED", "{err}");
    i.close();
    t.close();
}

#[test]
fn three_hundred_outsiders_pushing_4_mib_each_hold_almost_nothing() {
    let (t, buf, before) = target();
    let rss0 = resident_bytes();
    let addr = t.segment_name().to_string();
    let floods: Vec<_> = (0..300)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(&addr) else {
                    return false;
                };
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                // Hello with or without the auth flag, then a 4 MiB WRITE announced and sent.
                let _ = s.write_all(&hello(i % 2 == 0, ConnKind::Control).encode());
                let mut w = Header::new(Op::WriteReq);
                w.buffer_id = 1;
                w.length = 4 << 20;
                let _ = s.write_all(&w.encode());
                let chunk = vec![0xAB; 64 << 10];
                for _ in 0..64 {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                }
                true
            })
        })
        .collect();
    served(&t, &buf);
    let mut connected = 0u64;
    for f in floods {
        connected += u64::from(f.join().expect("flood thread"));
    }
    assert!(connected >= 290, "only {connected} of 300 connected");
    // A flood thread can finish while its bytes still sit in loopback's socket buffers,
    // before the target has even accepted it: wait (bounded) until every connection
    // that was made has been judged: refused, none served.
    let judged = |m: &ferry_core::Metrics| -> u64 {
        m.auth_failures.iter().map(|(_, n)| n).sum::<u64>()
            + m.connections_refused.iter().map(|(_, n)| n).sum::<u64>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut m = t.metrics();
    while judged(&m) < connected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        m = t.metrics();
    }
    // At least: the holder's own engine may add one (a connection it gives up on close).
    assert!(
        judged(&m) >= connected,
        "{connected} connected, judged {:?} {:?}",
        m.auth_failures,
        m.connections_refused
    );
    let growth = resident_bytes().saturating_sub(rss0);
    assert!(growth < 64 << 20, "target grew by {growth} bytes");
    let mut after = bytes_of(&buf);
    after[..4096].copy_from_slice(&before[..4096]); // what `served` wrote
    assert_eq!(after, before);
    t.close();
}

#[test]
fn a_process_of_another_uid_gets_no_fd_from_the_shm_socket() {
    // No secret here: the uid check alone must refuse it.
    let t = Engine::new(config(None)).expect("target");
    let buf = t.allocate(4096).expect("alloc");
    let names = shm_sockets();
    assert!(!names.is_empty());
    let probe = r#"
import socket, sys
n = 0
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect('\0' + name)
        hello = b'FRRY' + bytes([1, 1, 0, 0]) + (1).to_bytes(8, 'little') + (3).to_bytes(8, 'little') + bytes(32)
        s.sendall(hello + bytes(16) + (1).to_bytes(8, 'little'))
        while True:
            msg, anc, _, _ = s.recvmsg(256, socket.CMSG_LEN(16))
            n += sum(len(d) // 4 for (lvl, typ, d) in anc if typ == socket.SCM_RIGHTS)
            if not msg:
                break
    except OSError:
        pass
print('fds', n)
"#;
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            probe,
        ])
        .args(&names)
        .output()
        .expect("setpriv (util-linux) and /usr/bin/python3 run the probe as nobody");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.trim(), "fds 0");
    assert!(auth_failures(&t, "uid") >= 1);
    drop(buf);
    t.close();
}

#[test]
fn a_silent_handshake_and_a_trickled_frame_are_dropped_at_the_frame_deadline() {
    let t = Engine::new(EngineConfig {
        frame_timeout: Duration::from_millis(300),
        ..config(Some(SECRET))
    })
    .expect("target");
    // Connected, says nothing: dropped at the deadline, counted as a timeout.
    let mut silent = TcpStream::connect(t.segment_name()).expect("connect");
    let started = std::time::Instant::now();
    assert!(read_to_close(&mut silent).is_empty());
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(4), "dropped after {waited:?}");
    assert_eq!(auth_failures(&t, "timeout"), 1);
    // Authenticated, then half a header and nothing more: dropped at the deadline.
    let (mut d, _) = authenticated(t.segment_name(), ConnKind::Data);
    d.write_all(&Header::new(Op::ReadReq).encode()[..20])
        .expect("half a header");
    let started = std::time::Instant::now();
    assert!(read_to_close(&mut d).is_empty());
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(4), "dropped after {waited:?}");
    // An idle authenticated connection is not a partial frame: it stays open.
    let (mut idle, _) = authenticated(t.segment_name(), ConnKind::Control);
    std::thread::sleep(Duration::from_millis(600));
    let mut ping = Header::new(Op::Ping);
    ping.request_id = 5;
    idle.write_all(&ping.encode()).expect("ping");
    let mut pong = [0u8; HEADER_LEN];
    idle.read_exact(&mut pong).expect("pong");
    assert_eq!(Header::decode(&pong).expect("pong").op, Op::Pong);
    t.close();
}
