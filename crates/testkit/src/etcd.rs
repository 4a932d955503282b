//! A throwaway single-member etcd for a test: whether one can run here, starting it, and
//! its readiness; [`EtcdServer`] does all three and cleans up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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

/// A throwaway single-member etcd on free loopback ports, ready when [`EtcdServer::start`]
/// returns. Killed by pid (its own child) and its data directory removed on drop.
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    client_port: u16,
}

impl EtcdServer {
    /// Starts one and waits (at most 20 s) until it reports healthy.
    ///
    /// # Panics
    /// When it cannot be started, exits or is not healthy in time (its log is in the panic).
    pub fn start() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferry-etcd-server-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd temp dir");
        let (client_port, peer_port) = (crate::unused_port(), crate::unused_port());
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = spawn_etcd("ferry-test", &dir.join("data"), &client, &peer, &[], log);
        let mut server = Self {
            child,
            dir,
            client_port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !etcd_healthy(client_port) {
            let exited = server.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "etcd not ready within 20 s (exit: {exited:?}); log:\n{}",
                std::fs::read_to_string(server.dir.join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The `metadata` url engines use to reach it (`etcd://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
