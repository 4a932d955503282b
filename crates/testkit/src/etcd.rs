//! A throwaway single-member etcd for a test: starting it, and its readiness.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Whether the etcd serving plain http on loopback `port` (its client port, or the
/// `--listen-metrics-urls` port of one that serves clients over TLS) reports healthy.
pub fn etcd_healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// Starts a single-member etcd named `name` with its data in `data_dir`, serving clients
/// at `client_url` and its (unused) peer port at `peer_url`, plus `extra` flags (TLS);
/// stderr goes to `log`. The caller kills it by pid.
///
/// # Panics
/// When `etcd` cannot be started (not installed).
pub fn spawn_etcd(
    name: &str,
    data_dir: &Path,
    client_url: &str,
    peer_url: &str,
    extra: &[String],
    log: std::fs::File,
) -> Child {
    Command::new("etcd")
        .arg(format!("--name={name}"))
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster={name}={peer_url}"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start `etcd` ({e}): install it (Debian: apt-get install etcd-server)")
        })
}
