//! Running out of memory (here: of address space, under `RLIMIT_AS`) while allocating,
//! opening a peer or transferring fails at once with `ERR_FERRY_RESOURCE_LIMIT`, whose
//! message names the mapping's size and the limit; and the engine keeps serving what it
//! already had: its open peers over shm, the new peer over tcp.
//!
//! The limit is the whole process's, so the engines run in a child process (this test
//! binary again, `address_space_child`); the test waits for it, bounded, and passes on
//! its verdict.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, Opcode, Request, TransferStatus, TransportHint, TransportKind,
};
use ferry_testkit::{bytes_at, fill};

/// Set in the child's environment: only there does `address_space_child` run.
const CHILD_ENV: &str = "FERRY_TEST_ADDRESS_SPACE_CHILD";
/// Address space the child may still take once it set its limit.
const HEADROOM: u64 = 1 << 30;
/// The region that cannot be mapped within the headroom.
const BIG: u64 = 2 << 30;
/// How soon a refusal must come.
const PROMPT: Duration = Duration::from_secs(1);

fn config() -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Shm, TransportKind::Tcp],
        ..EngineConfig::default()
    }
}

#[test]
fn out_of_address_space_fails_with_the_limit_and_the_engine_keeps_its_peers() {
    let me = std::env::current_exe().expect("test binary");
    let mut child = Command::new(me)
        .args(["--exact", "address_space_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the child starts");
    let until = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not end within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(status.success(), "the child failed:\n{text}");
    assert!(
        text.contains("CHILD OK"),
        "the child did not run its checks:\n{text}"
    );
}

/// This process's virtual size, in bytes (`VmSize` of `/proc/self/status`).
fn virtual_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmSize");
    kib * 1024
}

/// Lets this process map `headroom` bytes more than it has now.
fn limit_address_space(headroom: u64) -> u64 {
    let soft = virtual_size() + headroom;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one `rlimit` through a valid pointer
    // to a local.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_AS, &mut limit), 0);
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &limit), 0);
    }
    limit.rlim_cur
}

#[test]
#[ignore = "a child process of out_of_address_space_fails_with_the_limit_and_the_engine_keeps_its_peers"]
fn address_space_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let small = Engine::new(config()).expect("small target");
    let small_buf = small.allocate(4 << 20).expect("small buffer");
    // Mapped here at once, touched by nobody: address space, not memory.
    let big = Engine::new(config()).expect("big target");
    let big_buf = big.allocate(BIG).expect("big buffer");
    let e = Engine::new(config()).expect("initiator");
    let local = e.allocate(4 << 20).expect("local");
    fill(&local, 11);
    let small_seg = e
        .open_segment_blocking(small.segment_name())
        .expect("open small");
    // 64 KiB from the start of the local region to `offset` of `remote`.
    let shm_write = |seg: u64, remote: &ferry_core::Region, offset: u64, hint| Request {
        opcode: Opcode::Write,
        local: local.id(),
        local_offset: 0,
        segment: seg,
        remote_buffer: remote.id(),
        remote_offset: offset,
        length: 64 << 10,
        hint,
        verify: false,
    };
    let require_shm = TransportHint::Require(TransportKind::Shm);
    let before = e
        .transfer_blocking(&[shm_write(small_seg.handle, &small_buf, 0, require_shm)])
        .expect("write before the limit");
    assert_eq!(before[0].status, TransferStatus::Completed, "{before:?}");

    let limit = limit_address_space(HEADROOM);
    eprintln!("RLIMIT_AS now {limit} bytes");

    // Allocating a region the address space cannot hold: refused, naming size and limit.
    let t = Instant::now();
    let refused = e.allocate(BIG).expect_err("beyond RLIMIT_AS");
    assert!(t.elapsed() < PROMPT, "refused after {:?}", t.elapsed());
    assert_eq!(refused.code(), "ERR_FERRY_RESOURCE_LIMIT", "{refused}");
    let words = refused.to_string();
    assert!(
        words.contains(&format!("mmap of {BIG} bytes failed: ENOMEM")),
        "{words}"
    );
    assert!(
        words.contains(&format!("RLIMIT_AS {limit} bytes")),
        "{words}"
    );

    // Opening a peer whose buffer cannot be mapped: the open works (tcp serves it), a
    // request that requires shm fails at once with the limit, any other goes over tcp.
    let t = Instant::now();
    let big_seg = e
        .open_segment_blocking(big.segment_name())
        .expect("open big");
    eprintln!("opened the big peer in {:?}", t.elapsed());
    let t = Instant::now();
    let over_shm =
        e.transfer_blocking(&[shm_write(big_seg.handle, &big_buf, 1 << 30, require_shm)]);
    assert!(t.elapsed() < PROMPT, "refused after {:?}", t.elapsed());
    let err = match over_shm {
        Err(err) => err,
        Ok(snaps) => match snaps[0].error.clone() {
            Some(err) => err,
            None => panic!("a write over shm to an unmapped buffer: {snaps:?}"),
        },
    };
    assert_eq!(err.code(), "ERR_FERRY_RESOURCE_LIMIT", "{err}");
    let words = err.to_string();
    assert!(
        words.contains(&format!("mmap of {BIG} bytes failed: ENOMEM")),
        "{words}"
    );
    assert!(
        words.contains(&format!("RLIMIT_AS {limit} bytes")),
        "{words}"
    );
    let over_tcp = e
        .transfer_blocking(&[shm_write(
            big_seg.handle,
            &big_buf,
            1 << 30,
            TransportHint::Auto,
        )])
        .expect("write over tcp");
    assert_eq!(
        over_tcp[0].status,
        TransferStatus::Completed,
        "{over_tcp:?}"
    );
    assert_eq!(over_tcp[0].transport, Some(TransportKind::Tcp));
    assert_eq!(
        bytes_at(&big_buf, 1 << 30, 64 << 10),
        bytes_at(&local, 0, 64 << 10)
    );

    // The peer it had keeps working over shm.
    fill(&local, 12);
    let after = e
        .transfer_blocking(&[shm_write(small_seg.handle, &small_buf, 0, require_shm)])
        .expect("write after the limit");
    assert_eq!(after[0].status, TransferStatus::Completed, "{after:?}");
    assert_eq!(after[0].transport, Some(TransportKind::Shm));
    assert_eq!(
        bytes_at(&small_buf, 0, 64 << 10),
        bytes_at(&local, 0, 64 << 10)
    );
    e.close();
    big.close();
    small.close();
    println!("CHILD OK");
}
