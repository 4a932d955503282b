//! A throwaway single-member etcd for a test: whether one can run here, starting it, and
//! its readiness.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Why etcd cannot run here, or `None` when `etcd --version` runs.
///
/// # Panics
/// Instead of returning a reason under CI (`CI` set, other than empty, `false` or `0`): CI
/// installs etcd-server, and there the cluster-mode tests must fail, never be skipped.
pub fn etcd_missing() -> Option<String> {
    let why = match Command::new("etcd")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => return None,
        Ok(status) => format!("`etcd --version` exited with {status}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "`etcd` is not installed".into(),
        Err(e) => format!("`etcd` cannot be started ({e})"),
    };
    assert!(
        !on_ci(),
        "{why}: CI must have etcd to run the cluster-mode tests (install etcd-server)"
    );
    Some(why)
}

/// Whether this runs under CI: `CI` set to anything but empty, `false` or `0`.
fn on_ci() -> bool {
    std::env::var("CI")
        .is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "false" | "0"))
}

/// Returns from the calling test, after saying why on stderr, where etcd cannot run (see
/// [`etcd_missing`], which panics instead under CI). The first line of a test that starts
/// etcd.
#[macro_export]
macro_rules! skip_without_etcd {
    () => {
        if let Some(why) = $crate::etcd_missing() {
            // Straight to stderr: the harness keeps `eprintln!` of a passing test to itself.
            use ::std::io::Write as _;
            let _ = ::std::writeln!(
                ::std::io::stderr(),
                "skipped {}: {why} (install etcd-server, or set CI to make this a failure)",
                ::std::thread::current().name().unwrap_or("test"),
            );
            return;
        }
    };
}

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
/// When `etcd` cannot be started (not installed: tests check [`skip_without_etcd!`] first).
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
