//! The loopback default: engines given no secret prove the per-user secret (a file only
//! their user can read), so processes of one user work together with no configuration and
//! a process of another uid is refused — through the library, on the raw wire and on the
//! shm socket that hands out memfds.
//!
//! Other processes are this test binary run again (`probe_child`, same uid or `nobody` via
//! `setpriv`) and a python client as `nobody`. Every process is waited for.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use ferry_core::{Engine, EngineConfig, Opcode, Region, TransferStatus, TransportKind};
use ferry_testkit::raw::shm_sockets;
use ferry_testkit::{bytes_of, fill};

/// The environment variable naming the per-user secret's folder.
const SECRET_DIR_ENV: &str = "FERRY_USER_SECRET_DIR";
const NOBODY: u32 = 65534;

fn config() -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

/// A fresh folder under the system's temporary folder, owned by `uid` and private to it;
/// removed on drop.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn new(uid: u32) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ferry-test-secret-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&p).expect("temp dir");
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).expect("chown");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        Self(p)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `program` run as `nobody` (util-linux's setpriv).
fn as_nobody(program: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(program);
    c
}

/// This test binary, running `probe_child` alone.
fn probe_args<'a>(c: &'a mut Command, target: &str, buffer: u64) -> &'a mut Command {
    c.args([
        "--exact",
        "probe_child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("FERRY_PROBE_TARGET", target)
    .env("FERRY_PROBE_BUFFER", buffer.to_string())
}

fn run(c: &mut Command) -> Output {
    let out = c.output().expect("the child runs");
    assert!(
        out.status.success(),
        "child failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What `probe_child` printed: the rest of the line after `PROBE ` (the test harness may
/// have written its own words before it on that line).
fn probe_said(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_once("PROBE ") {
        Some((_, rest)) => rest.lines().next().unwrap_or_default().to_string(),
        None => panic!(
            "no PROBE line: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Run as a child by the tests here: an engine with no secret configured opens the target
/// and writes 4 KiB (`fill`'s pattern 77) into its buffer; prints what happened. Does nothing when run
/// without a target.
#[test]
#[ignore = "a child process of the tests in this file"]
fn probe_child() {
    let (Ok(target), Ok(buffer)) = (
        std::env::var("FERRY_PROBE_TARGET"),
        std::env::var("FERRY_PROBE_BUFFER"),
    ) else {
        return;
    };
    let buffer: u64 = buffer.parse().expect("buffer id");
    let e = match Engine::new(config()) {
        Ok(e) => e,
        Err(e) => {
            println!("PROBE start-failed {} {e}", e.code());
            return;
        }
    };
    let local = e.allocate(4096).expect("local");
    fill(&local, 77);
    let said = match e.open_segment_blocking(&target) {
        Err(err) => format!("refused {} {err}", err.code()),
        Ok(seg) => {
            let req = ferry_core::Request {
                opcode: Opcode::Write,
                local: local.id(),
                local_offset: 0,
                segment: seg.handle,
                remote_buffer: buffer,
                remote_offset: 0,
                length: 4096,
                hint: ferry_core::TransportHint::Auto,
                verify: false,
            };
            match e.transfer_blocking(&[req]) {
                Ok(done) if done[0].status == TransferStatus::Completed => "wrote".to_string(),
                Ok(done) => format!("failed {:?}", done[0].status),
                Err(err) => format!("failed {} {err}", err.code()),
            }
        }
    };
    println!("PROBE {said}");
    e.close();
}

fn target_with_buffer() -> (Engine, std::sync::Arc<Region>) {
    let t = Engine::new(config()).expect("target");
    let buf = t.allocate(4096).expect("alloc");
    fill(&buf, 5);
    (t, buf)
}

#[test]
fn another_process_of_this_user_works_with_no_configuration_and_another_uid_is_refused() {
    let (t, buf) = target_with_buffer();
    let before = bytes_of(&buf);
    let me = std::env::current_exe().expect("test binary");
    // The same user, another process, no setting at all (the per-user secret's folder is
    // the one every test process shares).
    let out = run(probe_args(
        &mut Command::new(&me),
        t.segment_name(),
        buf.id(),
    ));
    assert_eq!(probe_said(&out), "wrote");
    let want = t.allocate(4096).expect("alloc");
    fill(&want, 77);
    assert_eq!(bytes_of(&buf), bytes_of(&want), "the same user wrote");
    // Another uid, with a per-user secret of its own.
    fill(&buf, 5);
    let theirs = PrivateDir::new(NOBODY);
    let out =
        run(probe_args(&mut as_nobody(&me), t.segment_name(), buf.id())
            .env(SECRET_DIR_ENV, &theirs.0));
    let said = probe_said(&out);
    assert!(said.starts_with("refused ERR_FERRY_CONNECT"), "{said}");
    assert_eq!(bytes_of(&buf), before, "another uid wrote nothing");
    t.close();
}

/// A raw client as `nobody`: over tcp, a Hello without the secret and a descriptor request
/// (then, if it got the token, a WRITE with it); over each shm socket, a Hello, the token
/// and the buffer id. Prints what it got as JSON.
const RAW_PROBE: &str = r#"
import json, socket, struct, sys
def header(op, flags=0, req=0, buf=0, off=0, length=0, token=bytes(16)):
    return b'FRRY' + bytes([1, op]) + struct.pack('<HQQQQ', flags, req, buf, off, length) + token
def read_exact(s, n):
    b = b''
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            return None
        b += c
    return b
def frame(s):
    h = read_exact(s, 56)
    if h is None:
        return None, None
    op, length = h[5], struct.unpack('<Q', h[32:40])[0]
    payload = read_exact(s, length) if op in (7, 11) else b''
    return op, payload
addr, buf = sys.argv[1], int(sys.argv[2])
host, port = addr.rsplit(':', 1)
got = {'ops': [], 'descriptor': False, 'write': None, 'fds': 0}
s = socket.create_connection((host, int(port)), timeout=5)
s.sendall(header(1, req=99, buf=1) + header(10))
token = bytes(16)
while True:
    try:
        op, payload = frame(s)
    except OSError:
        break
    if op is None:
        break
    got['ops'].append(op)
    if op == 11:
        got['descriptor'] = True
        token = bytes.fromhex(json.loads(payload)['token'])
        break
    if op == 7:
        break
if got['descriptor']:
    d = socket.create_connection((host, int(port)), timeout=5)
    d.sendall(header(1, req=99, buf=2))
    op, _ = frame(d)
    d.sendall(header(3, buf=buf, length=16, token=token) + b'\xee' * 16)
    op, _ = frame(d)
    got['write'] = op
for name in sys.argv[3:]:
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    u.settimeout(5)
    try:
        u.connect('\0' + name)
        u.sendall(header(1, req=99, buf=3) + token + struct.pack('<Q', buf))
        while True:
            msg, anc, _, _ = u.recvmsg(256, socket.CMSG_LEN(16))
            got['fds'] += sum(len(d) // 4 for (lvl, typ, d) in anc if typ == socket.SCM_RIGHTS)
            if not msg:
                break
    except OSError:
        pass
print(json.dumps(got))
"#;

fn raw_probe(mut c: Command, t: &Engine, buf: &Region) -> serde_json::Value {
    c.args(["-c", RAW_PROBE, t.segment_name(), &buf.id().to_string()])
        .args(shm_sockets());
    let out = run(&mut c);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "probe output: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn a_raw_client_of_another_uid_gets_no_descriptor_no_write_and_no_memfd() {
    // Any uid may connect to the shm socket here: the secret alone must refuse the memfd.
    let t = Engine::new(EngineConfig {
        shm_any_uid: true,
        ..config()
    })
    .expect("target");
    let buf = t.allocate(4096).expect("alloc");
    fill(&buf, 5);
    let before = bytes_of(&buf);
    let python = Path::new("/usr/bin/python3");
    let got = raw_probe(as_nobody(python), &t, &buf);
    assert_eq!(got["descriptor"], false, "{got}");
    assert_eq!(got["ops"], serde_json::json!([7]), "one refusal: {got}");
    assert_eq!(got["fds"], 0, "{got}");
    // Nor does a process of this uid that does not read the secret get one.
    let got = raw_probe(Command::new(python), &t, &buf);
    assert_eq!(
        (&got["descriptor"], &got["fds"]),
        (&false.into(), &0.into())
    );
    assert_eq!(bytes_of(&buf), before, "memory unchanged");
    t.close();
}

#[test]
fn a_per_user_secret_file_readable_by_others_is_refused_with_a_clear_error() {
    let dir = PrivateDir::new(0);
    let file = dir.0.join("secret");
    std::fs::write(&file, format!("{}\n", "ab".repeat(32))).expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let me = std::env::current_exe().expect("test binary");
    let out = run(probe_args(&mut Command::new(&me), "127.0.0.1:1", 1).env(SECRET_DIR_ENV, &dir.0));
    let said = probe_said(&out);
    assert!(
        said.starts_with("start-failed ERR_FERRY_INVALID_ARGUMENT"),
        "{said}"
    );
    assert!(said.contains(&file.display().to_string()), "{said}");
    assert!(said.contains("644"), "{said}");
}
