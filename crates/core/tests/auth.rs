//! The cluster secret, tried as an attacker would: raw sockets that know only the address
//! (or the shm socket's name), while a holder of the secret is served meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::time::Duration;

use ferry_core::auth::{Secret, HELLO_AUTH, MAC_LEN};
use ferry_core::wire::{split_frame, ConnKind, Header, Op, RejectCode, HEADER_LEN};
use ferry_core::{Engine, EngineConfig, Error, Opcode, TransferStatus, TransportKind};
use ferry_testkit::{bytes_of, fill, request};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-cluster";

fn config(secret: Option<&[u8]>) -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        auth_secret: secret.map(|s| Secret::new(s.to_vec()).expect("secret")),
        ..EngineConfig::default()
    }
}

/// Everything the target sends on one raw connection until it closes (bounded by a read
/// timeout).
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

fn ops_in(mut bytes: &[u8]) -> Vec<(Op, u16)> {
    let mut ops = Vec::new();
    while let Ok(Some((h, payload))) = split_frame(bytes) {
        ops.push((h.op, h.flags));
        bytes = &bytes[HEADER_LEN + payload.len()..];
    }
    ops
}

fn hello(auth: bool) -> Header {
    let mut h = Header::new(Op::Hello);
    h.buffer_id = ConnKind::Control as u64;
    h.request_id = 99;
    if auth {
        h.flags = HELLO_AUTH;
        h.token = [7; 16];
    }
    h
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
    s.write_all(&hello(false).encode()).expect("hello");
    let _ = s.write_all(&get.encode());
    let got = read_to_close(&mut s);
    assert_eq!(ops_in(&got), vec![(Op::Error, RejectCode::Auth as u16)]);
    assert!(!String::from_utf8_lossy(&got).contains("token"));
    assert_eq!(bytes_of(&buf), before, "memory unchanged");
    assert_eq!(auth_failures(&t, "no_secret"), 1);
    // A write frame straight after Hello, as an outsider would send it: nothing moves.
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    let mut h = hello(false);
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
    s.write_all(&hello(true).encode()).expect("hello");
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
    // A target without a secret is refused by an initiator that holds one.
    let open = Engine::new(config(None)).expect("open target");
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

/// This process's shm sockets, from /proc/net/unix.
fn shm_sockets() -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    let suffix = format!("-{}", std::process::id());
    let mut names: Vec<String> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@'))
        .filter(|n| n.starts_with("ferry-shm-") && n.ends_with(&suffix))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
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
        },
        ..config(Some(SECRET))
    })
    .expect("target");
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(t.segment_name()).expect("connect"))
        .collect();
    // Accepted in order: the held four are counted first, the fifth closes at once.
    let mut s = TcpStream::connect(t.segment_name()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0)), "closed at once");
    let per_address = t
        .metrics()
        .connections_refused
        .iter()
        .find(|(r, _)| *r == "per_address")
        .map_or(0, |(_, n)| *n);
    assert!(per_address >= 1);
    drop(held);
    t.close();
}
