//! Running out of resources: which OS errors mean a limit was reached (open files, the
//! system's file table, kernel memory), worded with the limit that was hit; and the spare
//! descriptor a listener keeps so that it can still accept, and refuse with a reason, a
//! connection waiting while the process is out of descriptors.
//!
//! Without the spare, a listener out of descriptors cannot take a connection out of its
//! backlog at all: the peer's handshake waits there until its connect timeout, and every
//! peer of a storm waits with it. With it, the peer learns at once why, and its open fails
//! with `ERR_FERRY_RESOURCE_LIMIT`.

use std::fs::File;
use std::io;

use crate::wire::{Header, Op, RejectCode, MAX_ERROR_PAYLOAD};

/// How a resource error reads: the limit, and for open files the current `RLIMIT_NOFILE`.
/// Pure: `nofile` is the soft limit the caller read (`None` when unknown).
pub(crate) fn describe_limit(errno: i32, nofile: Option<u64>) -> Option<String> {
    match errno {
        libc::EMFILE => Some(match nofile {
            Some(n) => format!("open files: RLIMIT_NOFILE {n} reached (ulimit -n)"),
            None => "open files: RLIMIT_NOFILE reached (ulimit -n)".to_string(),
        }),
        libc::ENFILE => Some("open files: the system-wide limit fs.file-max reached".to_string()),
        libc::ENOMEM | libc::ENOBUFS => Some(format!(
            "memory: the kernel could not allocate ({})",
            io::Error::from_raw_os_error(errno)
        )),
        _ => None,
    }
}

/// How a refused mapping of `len` bytes reads, for `errno` from `mmap`: `ENOMEM` is memory
/// or the process's address space (`address_space`: the soft `RLIMIT_AS` when finite;
/// without one, the machine's memory or its count of mappings, `vm.max_map_count`). `None`
/// for any other error. Pure.
pub(crate) fn describe_mapping(len: u64, errno: i32, address_space: Option<u64>) -> Option<String> {
    if errno != libc::ENOMEM {
        return None;
    }
    Some(match address_space {
        Some(n) => format!(
            "memory: mmap of {len} bytes failed: ENOMEM (address space: RLIMIT_AS {n} bytes, ulimit -v)"
        ),
        None => format!(
            "memory: mmap of {len} bytes failed: ENOMEM (out of memory, or vm.max_map_count mappings)"
        ),
    })
}

/// How a buffer of `len` bytes that could not be allocated for `what` reads. Pure.
pub(crate) fn describe_allocation(len: usize, what: &str) -> String {
    format!("memory: a buffer of {len} bytes for {what} could not be allocated")
}

/// How a thread that could not be started for `what` reads, for `errno` from
/// `pthread_create` (`EAGAIN`: the process's count of tasks, `RLIMIT_NPROC`, or memory for
/// the thread's stack; `nproc` the soft limit when finite). `None` for any other error.
/// Pure.
pub(crate) fn describe_thread(what: &str, errno: i32, nproc: Option<u64>) -> Option<String> {
    if errno != libc::EAGAIN && errno != libc::ENOMEM {
        return None;
    }
    Some(match nproc {
        Some(n) => format!(
            "threads: {what} could not be started (RLIMIT_NPROC {n}, threads-max, or memory for its stack)"
        ),
        None => format!(
            "threads: {what} could not be started (threads-max, or memory for its stack)"
        ),
    })
}

/// This process's soft limit `resource` (`RLIMIT_AS`, `RLIMIT_NPROC`, …) when it can be
/// read and is finite.
pub(crate) fn soft_limit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid, exclusive pointer to a local.
    let rc = unsafe { libc::getrlimit(resource, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// The limit `err` reached, worded, or `None` when it is no resource error.
pub(crate) fn limit_of(err: &io::Error) -> Option<String> {
    let errno = err.raw_os_error()?;
    let nofile = (errno == libc::EMFILE).then(open_files_limit).flatten();
    describe_limit(errno, nofile)
}

/// This process's soft `RLIMIT_NOFILE`, when it can be read and is finite.
pub(crate) fn open_files_limit() -> Option<u64> {
    soft_limit(libc::RLIMIT_NOFILE)
}

/// The frame that tells a connection it was refused because `limit` was reached: an
/// `Error` with `RejectCode::ResourceLimit`, which the client's handshake reads in place of
/// its answer. Small enough for any socket buffer, so a refusal never waits to be written.
pub(crate) fn refusal_frame(limit: &str) -> Vec<u8> {
    let text = &limit.as_bytes()[..limit.len().min(MAX_ERROR_PAYLOAD as usize)];
    let mut h = Header::new(Op::Error);
    h.flags = RejectCode::ResourceLimit as u16;
    h.length = text.len() as u64;
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(text);
    frame
}

/// A descriptor a listener holds in reserve: given up for the moment it takes a waiting
/// connection out of its backlog while the process is out of descriptors, and taken back
/// after that connection was refused and closed.
pub(crate) struct SpareFd(Option<File>);

impl SpareFd {
    /// Opens the spare (`/dev/null`); a listener without one refuses no worse than before.
    pub(crate) fn new() -> Self {
        Self(File::open("/dev/null").ok())
    }

    /// Frees the spare's descriptor for the next `accept`; whether there was one.
    pub(crate) fn release(&mut self) -> bool {
        self.0.take().is_some()
    }

    /// Takes a descriptor back (it may fail while the process is still out of them: the
    /// next `release` then has nothing to free, and the next refusal waits for one).
    pub(crate) fn restore(&mut self) {
        if self.0.is_none() {
            self.0 = File::open("/dev/null").ok();
        }
    }
}

/// A listener whose waiting connections can be taken and refused without waiting.
pub(crate) trait Backlog {
    /// Takes one waiting connection, if one is there now, writes `frame` to it (what the
    /// socket takes at once) and closes it; whether there was one.
    fn refuse_one(&self, frame: &[u8]) -> bool;
}

/// Polls `accept` once, without waiting: the connection, if one was there.
fn accept_now<T>(
    poll: impl FnOnce(&mut std::task::Context<'_>) -> std::task::Poll<io::Result<T>>,
) -> Option<T> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match poll(&mut cx) {
        std::task::Poll::Ready(Ok(accepted)) => Some(accepted),
        _ => None,
    }
}

impl Backlog for tokio::net::TcpListener {
    fn refuse_one(&self, frame: &[u8]) -> bool {
        accept_now(|cx| self.poll_accept(cx))
            .map(|(stream, _)| stream.try_write(frame))
            .is_some()
    }
}

impl Backlog for tokio::net::UnixListener {
    fn refuse_one(&self, frame: &[u8]) -> bool {
        accept_now(|cx| self.poll_accept(cx))
            .map(|(stream, _)| stream.try_write(frame))
            .is_some()
    }
}

/// A listener's answer to running out of descriptors: its spare, and a log line at most
/// every second.
pub(crate) struct Overflow {
    spare: SpareFd,
    logged: Option<std::time::Instant>,
    refused: u64,
}

impl Overflow {
    /// A listener's, with its spare descriptor taken now.
    pub(crate) fn new() -> Self {
        Self {
            spare: SpareFd::new(),
            logged: None,
            refused: 0,
        }
    }

    /// After `accept` failed with `err`: when the process is out of descriptors, frees the
    /// spare, takes one waiting connection and tells it which limit it met, then takes
    /// the spare back. Whether it refused one (the listener then accepts again at once;
    /// otherwise it backs off).
    pub(crate) fn refuse_waiting(&mut self, err: &io::Error, backlog: &impl Backlog) -> bool {
        let out_of_fds = matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        let limit = limit_of(err).filter(|_| out_of_fds);
        let refused = match limit {
            Some(limit) if self.spare.release() => {
                let frame = refusal_frame(&format!("{limit} in the target's process"));
                backlog.refuse_one(&frame)
            }
            _ => false,
        };
        self.spare.restore();
        self.refused += u64::from(refused);
        let now = std::time::Instant::now();
        if self
            .logged
            .is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(1))
        {
            self.logged = Some(now);
            let refused = std::mem::take(&mut self.refused);
            tracing::warn!(error = %err, refused, "accept failed; connections refused since the last line");
        }
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_limits_name_the_limit_and_its_value() {
        let emfile = describe_limit(libc::EMFILE, Some(256)).expect("a limit");
        assert!(emfile.starts_with("open files"), "{emfile}");
        assert!(emfile.contains("RLIMIT_NOFILE 256 reached"), "{emfile}");
        let unknown = describe_limit(libc::EMFILE, None).expect("a limit");
        assert!(unknown.contains("RLIMIT_NOFILE"), "{unknown}");
        let enfile = describe_limit(libc::ENFILE, Some(256)).expect("a limit");
        assert!(enfile.contains("system-wide"), "{enfile}");
        assert!(describe_limit(libc::ENOMEM, None)
            .expect("a limit")
            .starts_with("memory"));
        assert!(describe_limit(libc::ENOBUFS, None).is_some());
    }

    #[test]
    fn a_refused_mapping_names_its_size_and_the_address_space_limit() {
        let bounded = describe_mapping(1 << 30, libc::ENOMEM, Some(512 << 20)).expect("a limit");
        assert_eq!(
            bounded,
            "memory: mmap of 1073741824 bytes failed: ENOMEM (address space: RLIMIT_AS 536870912 bytes, ulimit -v)"
        );
        let unbounded = describe_mapping(4096, libc::ENOMEM, None).expect("a limit");
        assert!(unbounded.starts_with("memory: mmap of 4096 bytes failed: ENOMEM"));
        assert!(unbounded.contains("vm.max_map_count"), "{unbounded}");
        assert_eq!(describe_mapping(4096, libc::EACCES, Some(1)), None);
        assert!(describe_allocation(4 << 20, "a peer's frame")
            .starts_with("memory: a buffer of 4194304 bytes"));
    }

    #[test]
    fn a_thread_that_cannot_start_names_the_limits_on_threads() {
        let t = describe_thread("the shm copy thread", libc::EAGAIN, Some(64)).expect("a limit");
        assert!(
            t.starts_with("threads: the shm copy thread could not be started"),
            "{t}"
        );
        assert!(t.contains("RLIMIT_NPROC 64"), "{t}");
        assert!(describe_thread("x", libc::ENOMEM, None).is_some());
        assert_eq!(describe_thread("x", libc::EPERM, None), None);
    }

    #[test]
    fn other_errors_are_no_resource_limit() {
        assert_eq!(describe_limit(libc::ECONNREFUSED, Some(256)), None);
        assert_eq!(limit_of(&io::Error::other("no errno")), None);
        assert_eq!(
            limit_of(&io::ErrorKind::ConnectionReset.into()),
            None,
            "a reset is the peer's, not a limit"
        );
    }

    #[test]
    fn this_process_reports_its_open_files_limit() {
        let emfile = limit_of(&io::Error::from_raw_os_error(libc::EMFILE)).expect("a limit");
        match open_files_limit() {
            Some(n) => assert!(
                emfile.contains(&format!("RLIMIT_NOFILE {n} reached")),
                "{emfile}"
            ),
            None => assert!(emfile.contains("RLIMIT_NOFILE"), "{emfile}"),
        }
    }

    #[test]
    fn a_refusal_frame_carries_the_limit_code_and_its_words() {
        let frame = refusal_frame("open files: RLIMIT_NOFILE 256");
        let header: [u8; crate::wire::HEADER_LEN] = frame[..crate::wire::HEADER_LEN]
            .try_into()
            .expect("a header");
        let h = Header::decode(&header).expect("decodes");
        assert_eq!(h.op, Op::Error);
        assert_eq!(RejectCode::from_raw(h.flags), RejectCode::ResourceLimit);
        assert_eq!(
            &frame[crate::wire::HEADER_LEN..],
            b"open files: RLIMIT_NOFILE 256"
        );
        assert_eq!(
            h.payload_len(),
            frame.len() as u64 - crate::wire::HEADER_LEN as u64
        );
    }

    #[test]
    fn the_spare_is_freed_and_taken_back() {
        let mut spare = SpareFd::new();
        assert!(spare.release());
        assert!(!spare.release(), "nothing more to free");
        spare.restore();
        assert!(spare.release());
    }
}
