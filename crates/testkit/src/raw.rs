//! Raw wire clients, as an attacker (or a probe) writes them: a Hello of either kind, what
//! a connection sent back until it closed and the frames in it, this process's shm
//! sockets, and the resident memory they cost the target.

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use ferry_core::auth::HELLO_AUTH;
use ferry_core::wire::{split_frame, ConnKind, Header, Op, HEADER_LEN};

/// How long [`read_to_close`] waits for more bytes.
const READ_BOUND: Duration = Duration::from_secs(5);

/// A client's Hello for a `kind` connection, announcing authentication (`auth`: the flag
/// and a made-up token) or not.
pub fn hello(auth: bool, kind: ConnKind) -> Header {
    let mut h = Header::new(Op::Hello);
    h.buffer_id = kind as u64;
    h.request_id = 99;
    if auth {
        h.flags = HELLO_AUTH;
        h.token = [7; 16];
    }
    h
}

/// Everything the server sends until it closes the connection (or 5 s pass).
pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(READ_BOUND)).expect("timeout");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

/// The whole frames in `bytes`, as (op, flags): an `Error`'s flags are its reject code.
pub fn ops_in(mut bytes: &[u8]) -> Vec<(Op, u16)> {
    let mut ops = Vec::new();
    while let Ok(Some((h, payload))) = split_frame(bytes) {
        ops.push((h.op, h.flags));
        bytes = &bytes[HEADER_LEN + payload.len()..];
    }
    ops
}

/// The abstract names of this process's engines' shm sockets, from /proc/net/unix.
pub fn shm_sockets() -> Vec<String> {
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

/// This process's resident memory, in bytes.
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}
