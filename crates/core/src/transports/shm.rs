//! The shared-memory transport, for peers on the same host (same machine id and boot id).
//!
//! Engine-owned regions are memfds sealed against resizing. A same-host initiator connects
//! to the target's abstract unix socket, proves the segment token, and receives each
//! buffer's memfd over SCM_RIGHTS; it maps every buffer once and copies straight into or out
//! of the mapping: one copy, no target CPU. Copies up to what one core copies quickly within
//! its own cache ([`plain_share_min`]: 128 KiB to 1 MiB by machine; gathers of scattered
//! blocks up to 128 KiB) run on the submitting thread; larger ones are cut into jobs that
//! the submitting thread and a small pool of copy threads take in turn, so that a copy
//! thread that wakes late never slows the copy down.
//!
//! A dead process's memory stays mapped, so a copy into it would "succeed" silently. The
//! transport therefore watches the target: a pidfd (exit) and the unix connection (EOF)
//! report its death at once, after which every copy fails; each copy also checks the pidfd
//! after it finishes (the one syscall of a copy: the checks before it read a flag), so no
//! attempt completes into a dead target.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream as StdUnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::auth::{Failure, Secret};
use crate::error::{Error, Result};
use crate::kind::Opcode;
use crate::kind::TransportKind;
use crate::lanes::{Lent, Striped};
use crate::life_word::{self, PeerLifeWord};
use crate::linux::{peer_pid, send_fds_async, Pidfd, RemoteMapping};
use crate::memory::{Region, RegionTable};
use crate::net::{client_handshake, server_handshake, Refused};
use crate::request::{Span, ValidatedRequest};
use crate::segment::{Peer, SegmentDescriptor};
use crate::task::{Observer, Task};
use crate::transport::{Attempt, BoxFuture, Transport, TransportContext, TransportFactory};
use crate::wire::{token_eq, ConnKind, Token};

/// What the submitting thread of a Promise's task copies itself: a copy up to this size
/// runs on it as one memcpy (a hand-off costs a wake-up that such a copy does not repay);
/// of a larger one it copies this much and leaves the rest to the copy threads. Its caller
/// is a JS thread, which a long copy would block.
const INLINE_COPY_MAX: u64 = 1 << 20;
/// The same for a polled task (the batch API, the native tebench workers: a caller that
/// waits for it anyway): it copies up to 8 MiB of a request itself, beside the copy
/// threads.
const POLLED_INLINE_COPY_MAX: u64 = 8 << 20;
/// Plain copies of more than twice this size are cut into jobs of this size that the
/// submitting thread and the copy threads take in turn ([`Shared`]). Measured on a 2-core VM
/// (tebench shm WRITE, 1 thread, fixed addressing), against a 1-thread memcpy of the same
/// block and working set in the same minutes: 1/2/4 MiB moved 28.6/29/28 GB/s as one
/// memcpy on the submitting thread and 40/42.6/35 shared (memcpy: 32.9/33/28.2); 8 and
/// 16 MiB moved 18 and 12 inline, 22.9 and 12.6 shared (memcpy: 12.3 and 7.5).
const CHUNK: u64 = 512 << 10;
/// Plain copies above `plain_share_min` are shared, while a core is free for a copy thread
/// (`LargeCopiers`): in two halves up to `2 × CHUNK`, in `CHUNK`s beyond. A copy is shared
/// once it is too large for one core's cache or too long for one core's cache bandwidth,
/// whichever comes first:
/// - above a quarter of a core's L2: below it, source and destination together fit half
///   the L2 and one core copies at cache speed; beyond it, two cores each keep their half
///   in their own L2 (a Xeon with 2 MiB L2s: 1 MiB moved 25 GB/s as one memcpy and 49-52
///   shared);
/// - above what one core copies in [`SHARE_COPY_TIME`] at its cache speed
///   (`copy_speed`): a shorter copy gains less from a second core than the hand-off costs.
///
/// Measured with tebench shm WRITE, 1 thread, fixed addressing, runs alternated with a
/// 1-thread memcpy of the same block and working set:
/// - 512 KiB L2 (a Zen 3 VM): 256 KiB moved 26-30 GB/s inline and 27-36 shared, 512 KiB
///   28-31 and 34-41 (memcpy: 35-37 and 33-34); halving 128 KiB copies gained nothing
///   (22-28 GB/s against 25-29). Threshold 128 KiB.
/// - 1 MiB L2 (a Zen 5 VM): 256 KiB moved 67-74 GB/s inline and 54-64 shared (memcpy
///   88-103), 512 KiB 63-69 inline and 91 shared (memcpy 79-81). Threshold 256 KiB.
/// - 2 MiB L2 (a Xeon VM whose L2 moves 35-39 GB/s): 512 KiB moved 32-33 GB/s inline and
///   35-43 shared (memcpy: 35-37). 256 KiB moved 25-30 inline and 26-32 shared with two copy
///   threads taking turns (P99 40 µs: see [`copy_thread_count`]), and with one copy thread
///   (runs alternated, same minutes) 32-35 inline and 41.5-42.5 shared, P99 10 µs; 128 KiB
///   30-31 either way, and 64 KiB lost a third shared. Threshold 128 KiB, where a quarter
///   of the L2 alone gave 512 KiB.
fn plain_share_min(l2: Option<u64>, copy_rate: Option<f64>) -> u64 {
    let by_size = l2.map_or(PLAIN_SHARE_MIN_UNKNOWN_L2, |l2| {
        (l2 / 4).clamp(MIN_SHARE_MIN, 1 << 20)
    });
    // A rate that is not a positive number tells nothing: the L2's size decides alone.
    let by_time =
        copy_rate
            .filter(|r| r.is_finite() && *r > 0.0)
            .map_or(u64::MAX, |bytes_per_ns| {
                // The largest power of two copied within the time (`as` saturates).
                let bytes = (bytes_per_ns * SHARE_COPY_TIME.as_nanos() as f64) as u64;
                bytes.checked_ilog2().map_or(0, |log| 1 << log)
            });
    by_size.min(by_time).max(MIN_SHARE_MIN)
}

/// Copies up to this size are never shared: a hand-off costs a good part of their time.
const MIN_SHARE_MIN: u64 = 64 << 10;
/// A copy that one core takes longer than this for is worth sharing with another (see
/// [`plain_share_min`]: 512 KiB at 35-39 GB/s, 13-15 µs, gained 15-30 %; 256 KiB at the same
/// rate, 6.7-7.5 µs, gained 20-30 % once one copy thread served the copies; 128 KiB, 3.3 µs,
/// gained nothing; 256 KiB at 95 GB/s, 2.8 µs, lost). The threshold is the largest power of
/// two copied within this time, so the shared copies are those that take from about 3 to
/// 6 µs upwards, whatever the probe's error within a factor of two.
const SHARE_COPY_TIME: Duration = Duration::from_micros(6);

/// The threshold where sysfs does not tell the L2's size.
const PLAIN_SHARE_MIN_UNKNOWN_L2: u64 = 128 << 10;

/// The size of the jobs a shared plain copy of `len` bytes is cut into.
fn plain_job(len: u64) -> u64 {
    len.div_ceil(2).next_multiple_of(4096).min(CHUNK)
}

/// A copy above this size that more of its submission follow (`Attempt::more_follow`) may
/// be handed to the copy threads whole ([`hands_off`]), so that a batch's large copies run
/// beside the submitting thread (which copies the last) instead of one after another on
/// it: copied inline, a batch of 1 MiB writes moves at one core's memcpy speed. Smaller
/// copies stay inline, where a hand-off costs more than the copy.
const SHARE_MIN: u64 = 256 << 10;

/// Whether a copy of `length` bytes is handed to the copy threads whole ([`SHARE_MIN`]):
/// only where more of its submission follow, and only where that puts more cores to work
/// than sharing each copy would.
///
/// With one copy thread (2 cores), handing a polled batch's copies off left that thread
/// copying all but the last while the submitting thread, having copied the last, waited
/// for it: one core for most of the batch. Shared instead, each copy is split between the
/// two. Measured on a 2-vCPU Xeon VM (tebench shm WRITE, 1 thread, fixed addressing, runs
/// alternated): batches of 8 × 1 MiB moved 11.2-11.4 GB/s handed off and 22.9 shared,
/// 4 × 512 KiB 12.2-16.9 and 29.3-33.8 (a 1-thread memcpy of 1 MiB blocks over the same
/// 8 MiB: 12.5-13). A Promise's caller is a JS thread, which a shared copy would keep
/// copying (up to [`INLINE_COPY_MAX`] of every request), so its copies are still handed off.
fn hands_off(length: u64, more_follow: bool, helpers: usize, polled: bool) -> bool {
    more_follow && length > SHARE_MIN && (helpers > 1 || !polled)
}

/// A gather (`request::Gather`) above this size is copied by the submitting thread and
/// the copy threads together ([`Shared`]). Its spans are scattered small copies, bound by
/// memory latency more than bandwidth, so a second core nearly doubles the rate: a C loop
/// over 4 KiB pages in a seeded shuffle of 64 MiB moved 1.1-1.2 M pages/s on one thread
/// and 2.2 M on two, on a 2-core VM.
const GATHER_SHARE_MIN: u64 = 128 << 10;
/// The runs a shared gather is cut into: small enough that a copy thread that wakes late
/// still finds some left, large enough that taking one costs nothing next to copying it.
const SHARED_RUN: u64 = 64 << 10;
/// How long the submitting thread waits, once no job is left to take, for the jobs a
/// copy thread is still copying: about what a few runs take, so that the outcome is
/// usually there before the submitting call returns (handed back at once, no wake-up of
/// the caller), yet a copy thread that stalls costs the caller no more than this.
const SHARED_JOIN_WAIT: Duration = Duration::from_micros(100);

/// How long the server waits for a client's token.
const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

// ---- serving side ---------------------------------------------------------------------

/// Binds the abstract unix socket that serves this engine's memfds.
fn bind(engine_id: u64) -> Result<(UnixListener, String)> {
    let name = format!("ferry-shm-{engine_id:016x}-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::io("shm socket name", &e))?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)
        .map_err(|e| Error::io("bind shm socket", &e))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("bind shm socket", &e))?;
    let listener =
        UnixListener::from_std(std_listener).map_err(|e| Error::io("bind shm socket", &e))?;
    Ok((listener, name))
}

/// Who may have this engine's memfds, and what they must prove.
struct Gate {
    engine_id: u64,
    regions: Arc<RegionTable>,
    token: Token,
    secret: Option<Secret>,
    admission: Arc<Admission>,
    any_uid: bool,
    timeout: Duration,
}

/// Serves fd requests until `cancel` fires.
async fn serve(listener: UnixListener, gate: Arc<Gate>, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let Ok(slot) = gate.admission.enter(None) else {
                    continue;
                };
                let gate = gate.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => {}
                        r = serve_one(stream, &gate) => {
                            if let Err(e) = r {
                                tracing::debug!(error = %e, "shm connection ended");
                            }
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "shm accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Checks the peer's uid (unless any uid may connect) and runs the handshake.
async fn admit_peer(stream: &mut UnixStream, gate: &Gate) -> std::result::Result<(), Refused> {
    if !gate.any_uid {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let ours = unsafe { libc::geteuid() };
        if crate::linux::peer_uid(&*stream).ok() != Some(ours) {
            return Err(Refused::silent(Failure::Uid));
        }
    }
    let handshake = server_handshake(stream, gate.secret.as_ref(), gate.engine_id);
    let hello = tokio::time::timeout(gate.timeout, handshake)
        .await
        .unwrap_or(Err(Refused::silent(Failure::Timeout)))?;
    if hello.buffer_id != ConnKind::Shm as u64 {
        return Err(Refused::silent(Failure::Protocol));
    }
    Ok(())
}

/// One client: the handshake, a 16-byte token, then 8-byte buffer ids, each answered with
/// 16 bytes (status u32, reserved u32, length u64) and, on success, the buffer's memfd.
async fn serve_one(mut stream: UnixStream, gate: &Gate) -> Result<()> {
    if let Err(refused) = admit_peer(&mut stream, gate).await {
        refused
            .settle(&mut stream, &gate.admission, None, gate.timeout)
            .await;
        return Err(Error::Protocol(format!(
            "shm peer refused: {}",
            refused.why.label()
        )));
    }
    let (regions, token) = (&gate.regions, &gate.token);
    let io = |e: std::io::Error| Error::io("shm serve", &e);
    let mut got = [0u8; 16];
    tokio::time::timeout(AUTH_TIMEOUT, stream.read_exact(&mut got))
        .await
        .map_err(|_| Error::Protocol("no shm token in time".into()))?
        .map_err(io)?;
    if !token_eq(&got, token) {
        return Err(Error::Protocol("shm client sent a wrong token".into()));
    }
    // The reply carries this process's life word, when it has one: peers then check that
    // it still runs with a load instead of a syscall (see `life_word`).
    match life_word::share() {
        Ok(word) => send_fds_async(&stream, &[1], &[word.as_fd()])
            .await
            .map_err(io)?,
        Err(e) => {
            tracing::debug!(error = %e, "no life word: peers poll this process's pidfd");
            stream.write_all(&[1]).await.map_err(io)?;
        }
    }
    loop {
        let mut id = [0u8; 8];
        match stream.read_exact(&mut id).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        }
        let id = u64::from_le_bytes(id);
        let mut reply = [0u8; 16];
        match regions.get(id).ok().filter(|r| r.mapping().is_some()) {
            Some(region) => {
                reply[8..].copy_from_slice(&(region.len() as u64).to_le_bytes());
                let fd = region
                    .mapping()
                    .ok_or_else(|| Error::Protocol("region lost its mapping".into()))?
                    .dup_fd()?;
                send_fds_async(&stream, &reply, &[fd.as_fd()])
                    .await
                    .map_err(io)?;
            }
            None => {
                reply[..4].copy_from_slice(&1u32.to_le_bytes());
                stream.write_all(&reply).await.map_err(io)?;
            }
        }
    }
}

// ---- initiator side -------------------------------------------------------------------

/// What the transport knows about one same-host peer.
struct ShmPeer {
    peer: Arc<Peer>,
    pidfd: Pidfd,
    /// The target's life word, when it sent one: read after each copy instead of polling
    /// `pidfd`.
    life: Option<PeerLifeWord>,
    /// Read on every copy without a lock or a reference taken (`ArcSwap`: nothing another
    /// submitting thread writes); emptied when the peer goes.
    maps: ArcSwap<Mappings>,
    dead: AtomicBool,
    cancel: CancellationToken,
}

impl ShmPeer {
    /// Whether the target's death is not known yet: a flag read, no syscall. The watcher
    /// (pidfd, connection EOF), `fail_peer` and [`ShmPeer::confirm_alive`] set it. Good for
    /// the checks before a copy: copying into a dead target's memory is harmless as long as
    /// the copy is not reported done, and the check after it ([`ShmPeer::confirm_alive`])
    /// is what decides that.
    fn known_alive(&self) -> bool {
        !self.dead.load(Ordering::Acquire)
    }

    /// Whether the target still runs: its life word (a load; the kernel marks it as the
    /// process ends, before it counts as exited), else asked of the kernel (one `poll` of
    /// the pidfd). Run once after each copy, so no copy that ends after the target exited
    /// completes; the first that sees the death records it for every later check.
    fn confirm_alive(&self) -> bool {
        if !self.known_alive() {
            return false;
        }
        let running = match &self.life {
            Some(word) => word.is_alive(),
            None => self.pidfd.is_alive(),
        };
        if running {
            return true;
        }
        self.dead.store(true, Ordering::Release);
        false
    }
}

/// Called when a same-host peer's process is seen to exit.
pub(crate) type DeathHook = Arc<dyn Fn(&Arc<Peer>, String) + Send + Sync>;

/// What one copy job moves: a piece of a request's one span, or a run of a gather's spans.
enum Work {
    Span(Span),
    Run {
        spans: Arc<[Span]>,
        range: std::ops::Range<usize>,
    },
}

impl Work {
    /// A request cut into jobs of about `chunk` bytes: a single span into pieces of at most
    /// `chunk`, a gather into runs of whole spans (its spans are small, `blocks::GATHER`)
    /// of at most `chunk` bytes each, or one span where a span alone is larger.
    ///
    /// The list is sized once (no growth as it fills): a single span makes
    /// `length / chunk` pieces (rounded up); two consecutive runs of a gather hold more
    /// than `chunk` bytes together (the second's first span did not fit the first), so a
    /// gather makes at most `2 * length / chunk + 1` runs (rounded up), and never more
    /// than its spans.
    fn cut(req: &ValidatedRequest, chunk: u64) -> Vec<Self> {
        let chunk = chunk.max(1);
        let pieces = usize::try_from(req.length.div_ceil(chunk)).unwrap_or(usize::MAX);
        match req.gathered() {
            Some(spans) => {
                let mut works =
                    Vec::with_capacity(pieces.saturating_mul(2).saturating_add(1).min(spans.len()));
                works.extend(runs(spans, chunk).map(|range| Self::Run {
                    spans: spans.clone(),
                    range,
                }));
                works
            }
            None => {
                let mut works = Vec::with_capacity(pieces);
                works.extend(req.slices(chunk).map(Self::Span));
                works
            }
        }
    }

    fn spans(&self) -> &[Span] {
        match self {
            Self::Span(s) => std::slice::from_ref(s),
            Self::Run { spans, range } => &spans[range.clone()],
        }
    }

    fn bytes(&self) -> u64 {
        self.spans().iter().map(|s| s.length).sum()
    }
}

/// Consecutive runs of `spans` of at most `chunk` bytes each (a span larger than `chunk`
/// is a run of its own), covering every span once, in order.
fn runs(spans: &[Span], chunk: u64) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= spans.len() {
            return None;
        }
        let mut end = start + 1;
        let mut bytes = spans[start].length;
        while let Some(next) = spans.get(end) {
            match bytes.checked_add(next.length) {
                Some(b) if b <= chunk => bytes = b,
                _ => break,
            }
            end += 1;
        }
        let run = start..end;
        start = end;
        Some(run)
    })
}

/// Which threads copied a block large enough to share lately: one time per lane, each
/// written by its own lane's threads only (`lanes.rs`).
struct LargeCopiers {
    epoch: Instant,
    /// Nanoseconds after `epoch` of each lane's latest large copy (0: none yet).
    last: Striped<AtomicU64>,
}

/// A thread that copied a large block within this long is counted as keeping its core.
const COPIER_WINDOW: Duration = Duration::from_millis(1);

impl LargeCopiers {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last: Striped::default(),
        }
    }

    /// Records a large copy of the calling thread; whether, with the threads of other
    /// lanes that made one within [`COPIER_WINDOW`], every one of `cores` is taken.
    fn others_busy(&self, cores: usize) -> bool {
        // Never 0, which stands for "none yet".
        let now = u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        self.note(crate::lanes::current(), now, cores)
    }

    /// [`LargeCopiers::others_busy`] for a copy of lane `me` at `now`.
    fn note(&self, me: usize, now: u64, cores: usize) -> bool {
        self.last.lane(me).store(now, Ordering::Relaxed);
        let window = COPIER_WINDOW.as_nanos() as u64;
        let others = (0..crate::lanes::LANES)
            .filter(|&lane| lane != me)
            .filter(|&lane| {
                let at = self.last.lane(lane).load(Ordering::Relaxed);
                at != 0 && now.saturating_sub(at) < window
            })
            .count();
        others + 1 >= cores
    }
}

/// The parts of a copy this thread does at once, borrowed from the tables it looked them up
/// in (a shared copy holds its own, [`Shared`]). Borrowing them takes no reference: the
/// peer, its mapping and the region are shared by every thread that copies to that peer,
/// and each reference taken and dropped would write their count's cache line.
struct Copy<'a> {
    task: &'a Arc<Task>,
    attempt: u32,
    peer: &'a ShmPeer,
    mapping: &'a RemoteMapping,
    opcode: Opcode,
    region: &'a Region,
    spans: &'a [Span],
}

impl Copy<'_> {
    /// Copies every span, then reports the outcome to the task.
    fn run(&self) {
        match copy_spans(
            self.peer,
            self.mapping,
            self.region,
            self.opcode,
            self.spans,
        ) {
            Ok(bytes) => self.task.slice_done(self.attempt, bytes),
            Err(e) => self.task.attempt_failed(self.attempt, e),
        }
    }
}

/// Copies `spans` between `region` and `mapping` (direction by `opcode`), checking that
/// the target is alive before and after: the bytes copied, or why the copy does not count.
fn copy_spans(
    peer: &ShmPeer,
    mapping: &RemoteMapping,
    region: &Region,
    opcode: Opcode,
    spans: &[Span],
) -> Result<u64> {
    if !peer.known_alive() {
        return Err(peer.peer.lost_error_or("target process exited"));
    }
    let mut bytes = 0;
    for span in spans {
        let (Some(remote), Ok(local)) = (
            mapping.range_ptr(span.remote_offset, span.length),
            region.range_ptr(span.local_offset, span.length),
        ) else {
            return Err(Error::OutOfRange(format!(
                "shm copy [{}+{}) outside the mapping",
                span.remote_offset, span.length
            )));
        };
        let (src, dst) = match opcode {
            Opcode::Write => (local.cast_const(), remote),
            Opcode::Read => (remote.cast_const(), local),
        };
        // SAFETY: both ranges were bounds-checked just above against mappings that are
        // alive while borrowed (`mapping`, `region`); they belong to different mappings, so
        // they do not overlap. Concurrent access by the peers is the transfer contract,
        // as with RDMA.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, span.length as usize) };
        bytes += span.length;
    }
    if peer.confirm_alive() {
        Ok(bytes)
    } else {
        Err(peer.peer.lost_error_or("target process exited"))
    }
}

/// How a request is copied ([`ShmTransport::sharing`]).
struct Sharing {
    /// Cut into jobs of `run` bytes that the submitting thread and the copy threads take
    /// in turn ([`Shared`]).
    shared: bool,
    /// Handed to the copy threads whole, as more of its submission follow ([`SHARE_MIN`]).
    hand_off: bool,
    /// The size of a shared copy's jobs.
    run: u64,
}

/// A copy cut into jobs that the submitting thread and the copy threads take in turn: each
/// job is taken once, whoever is free takes the next. A copy thread that wakes late only
/// finds fewer jobs left: the copy is never slower than the submitting thread alone,
/// whatever a wake-up costs (on a VM, tens of microseconds).
///
/// Only the copying is shared. The parts of the copy are held here once, not by each job;
/// a job's outcome is folded into `copied` or `error`; the task hears once, from whoever
/// ends last, which is the submitting thread whenever the copy threads finished within its
/// wait ([`Shared::join`]): the task's state, its lane's counters and its batch's wake stay
/// in that thread's cache instead of crossing to a copy thread's core and back.
///
/// The submitting thread takes jobs from the front, copy threads from the back: a block
/// copied again and again (a page rewritten in place, tebench's fixed addressing) is split
/// the same way each time, so each core finds its part still in its own L2.
///
/// Measured on a 2-vCPU Xeon VM (tebench shm WRITE, 1 thread, fixed addressing), 512 KiB
/// blocks in two halves: 35-43 GB/s this way, 35 when each job held its own references,
/// told the task itself and went to whichever thread came first (inline: 32-33; memcpy of
/// the same blocks: 35-37). A C loop handing half to one spinning thread moved 67: the rest
/// is the queue, the copy thread being preempted on a machine this small, and the
/// submitting thread's own per-operation work.
struct Shared {
    task: Arc<Task>,
    attempt: u32,
    peer: Arc<ShmPeer>,
    mapping: Arc<RemoteMapping>,
    opcode: Opcode,
    region: Lent<Region>,
    works: Box<[Work]>,
    /// Jobs taken: from the front (low 32 bits) and from the back (high 32 bits); the two
    /// never add up to more than `works.len()`, which `share` bounds by `u32::MAX`.
    taken: AtomicU64,
    /// Jobs not yet finished, plus one held by the submitting thread until it stops
    /// waiting for them: whoever brings it to zero tells the task.
    left: AtomicUsize,
    /// Bytes the finished jobs copied.
    copied: AtomicU64,
    /// The first job's failure, if one failed.
    error: Mutex<Option<Error>>,
}

/// Which end of a [`Shared`] copy's jobs a thread takes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// The submitting thread.
    Front,
    /// The copy threads.
    Back,
}

const BACK_ONE: u64 = 1 << 32;

impl Shared {
    /// Index of the job taken at `end`, or `None` once all are taken.
    fn take(&self, end: End) -> Option<usize> {
        take_from(&self.taken, self.works.len(), end)
    }

    /// Whether every job was taken.
    fn all_taken(&self) -> bool {
        ends_met(self.taken.load(Ordering::Relaxed), self.works.len())
    }

    /// Takes and runs jobs at `end` until none is left to take, or until it copied
    /// `budget` bytes.
    fn work(&self, budget: u64, end: End) {
        let mut copied = 0u64;
        while copied < budget {
            let Some(work) = self.take(end).and_then(|i| self.works.get(i)) else {
                return;
            };
            let outcome = copy_spans(
                &self.peer,
                &self.mapping,
                &self.region,
                self.opcode,
                work.spans(),
            );
            copied = copied.saturating_add(work.bytes());
            match outcome {
                Ok(bytes) => {
                    self.copied.fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => {
                    self.error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
            self.one_done();
        }
    }

    /// Counts one job (or the submitting thread's wait) as ended; the last tells the task.
    fn one_done(&self) {
        // AcqRel: the last one sees every other job's `copied` and `error`.
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let error = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        match error {
            Some(e) => self.task.attempt_failed(self.attempt, e),
            None => self
                .task
                .slice_done(self.attempt, self.copied.load(Ordering::Relaxed)),
        }
    }

    /// Waits up to `bound` for the jobs others still run, then stops waiting (whoever ends
    /// last tells the task).
    fn join(&self, bound: Duration) {
        let until = std::time::Instant::now() + bound;
        while self.left.load(Ordering::Acquire) > 1 && std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        self.one_done();
    }
}

/// Whether the two ends of a count of jobs taken ([`Shared::taken`]) met: all `len` taken.
fn ends_met(taken: u64, len: usize) -> bool {
    (taken & (BACK_ONE - 1)) + (taken >> 32) >= len as u64
}

/// Takes one of `len` jobs at `end` of the count `taken` ([`Shared::taken`]): its index,
/// or `None` once the two ends met.
fn take_from(taken: &AtomicU64, len: usize, end: End) -> Option<usize> {
    let mut cur = taken.load(Ordering::Relaxed);
    loop {
        if ends_met(cur, len) {
            return None;
        }
        let (front, back) = (cur & (BACK_ONE - 1), cur >> 32);
        let (next, index) = match end {
            End::Front => (cur + 1, front),
            End::Back => (cur + BACK_ONE, len as u64 - 1 - back),
        };
        match taken.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return usize::try_from(index).ok(),
            Err(seen) => cur = seen,
        }
    }
}

/// How long a copy thread that just finished a job keeps looking for the next before it
/// sleeps. Waking a sleeping thread costs tens of microseconds on a VM (more than
/// copying 64 KiB): a stream of calls, each shared with the copy threads, finds them
/// still awake.
const COPY_THREAD_SPIN: Duration = Duration::from_micros(100);

/// How many copy threads serve the shared copies: as many as are asked to help with one
/// (`configured`, the engine's I/O threads), but no more than leave a core to the
/// submitting thread. A copy thread beyond that has no core of its own: it only takes
/// turns with the threads that copy. On 2 cores with two copy threads, the second slept
/// on the queue's lock and was woken each time the first let go of it (a futex wake on
/// the copying thread's path), only to find it taken again: a third runnable thread on
/// every shared copy. Measured on a 2-vCPU Xeon VM (tebench shm WRITE 256 KiB, 1 thread,
/// shared in halves): 30-37 GB/s and a P99 of 34-38 µs with two copy threads, 41.5-42.5
/// GB/s and a P99 of 10 µs with one.
fn copy_thread_count(configured: usize, cores: usize) -> usize {
    configured.min(cores.saturating_sub(1)).max(1)
}

/// The next shared copy for a copy thread: looked for during [`COPY_THREAD_SPIN`], then
/// waited for. An error once the transport shut down.
///
/// One copy thread at a time looks, holding the queue's lock; the lock is let go before
/// the copy is returned, so that another copy thread takes the next copy (or the next
/// helper's turn at this one) while this one copies. Held through the copy, as it was
/// when the caller locked the queue in a `match` on this call, it left one copy thread
/// copying at a time, however many a copy asked to help.
fn next_shared<T>(queue: &Mutex<mpsc::Receiver<T>>) -> std::result::Result<T, mpsc::RecvError> {
    let rx = queue.lock().unwrap_or_else(|p| p.into_inner());
    let until = std::time::Instant::now() + COPY_THREAD_SPIN;
    // The clock is read every few tries only: a look at the queue costs a few
    // nanoseconds, a clock read several times that, and the sooner a copy is seen the
    // more of it this thread takes.
    let mut tries = 0u32;
    loop {
        match rx.try_recv() {
            Ok(m) => return Ok(m),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) => {
                tries = tries.wrapping_add(1);
                if tries % 64 == 0 && std::time::Instant::now() >= until {
                    return rx.recv();
                }
                std::hint::spin_loop();
            }
        }
    }
}

/// The shared-memory transport.
pub struct ShmTransport {
    /// This transport, for the futures of `attach`.
    me: std::sync::Weak<ShmTransport>,
    machine_id: String,
    local_engine_id: u64,
    /// Served to same-host peers (their memfds), behind the handshake and `token`.
    gate: Arc<Gate>,
    /// The abstract socket's name once `install` bound it.
    socket: std::sync::OnceLock<String>,
    /// Read on every request, without a lock or a reference taken (two threads submitting
    /// must write no cache line in common); replaced whole on the rare attach and forget.
    peers: ArcSwap<FxHashMap<u64, Arc<ShmPeer>>>,
    /// Where shared copies are offered to the copy threads; `None` once shut down.
    jobs: Mutex<Option<mpsc::Sender<Arc<Shared>>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Copy threads asked to help with one shared copy: all of them
    /// ([`copy_thread_count`]).
    helpers: usize,
    rt: Handle,
    shutdown: CancellationToken,
    /// Which threads copied large blocks lately: copy threads help only while a core is
    /// free for them.
    large_copiers: LargeCopiers,
    /// The cores this process may run on.
    cores: usize,
    /// Plain copies above this size are shared with the copy threads ([`plain_share_min`]).
    plain_share_min: u64,
    /// Set by `shutdown`: what a submit checks (`CancellationToken::is_cancelled` takes a
    /// mutex, which threads submitting side by side queue on).
    closed: AtomicBool,
    on_death: DeathHook,
}

impl ShmTransport {
    /// A transport with `copy_threads` copy threads, for the engine of `context`.
    fn new(context: TransportContext, copy_threads: usize) -> Result<Arc<Self>> {
        let (tx, rx) = mpsc::channel::<Arc<Shared>>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let copy_threads = copy_thread_count(copy_threads, cores);
        for i in 0..copy_threads {
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("ferry-shm-copy-{i}"))
                .spawn(move || {
                    // Until the transport shuts down.
                    while let Ok(shared) = next_shared(&rx) {
                        shared.work(u64::MAX, End::Back);
                    }
                })
                .map_err(|e| Error::io("start shm copy thread", &e))?;
            threads.push(handle);
        }
        let (l2, copy_rate) = (
            crate::cpu_cache::l2_bytes(),
            crate::copy_speed::cached_copy_rate(),
        );
        let share_min = plain_share_min(l2, copy_rate);
        tracing::debug!(
            l2,
            copy_rate_bytes_per_ns = copy_rate,
            share_min,
            "shm: plain copies above share_min bytes are shared with the copy threads"
        );
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            machine_id: context.machine_id,
            local_engine_id: context.engine_id,
            gate: Arc::new(Gate {
                engine_id: context.engine_id,
                regions: context.regions,
                token: context.token,
                secret: context.secret,
                admission: context.admission,
                any_uid: context.shm_any_uid,
                timeout: context.frame_timeout,
            }),
            socket: std::sync::OnceLock::new(),
            peers: ArcSwap::default(),
            closed: AtomicBool::new(false),
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
            helpers: copy_threads,
            large_copiers: LargeCopiers::new(),
            cores,
            plain_share_min: share_min,
            rt: context.handle,
            shutdown: context.shutdown,
            on_death: context.lost,
        }))
    }

    fn peer(&self, handle: u64) -> Option<Arc<ShmPeer>> {
        self.peers.load().get(&handle).cloned()
    }

    /// Puts `peer` under `handle` in the table (`None`: takes it out); returns the peer it
    /// replaced.
    fn replace_peer(&self, handle: u64, peer: Option<Arc<ShmPeer>>) -> Option<Arc<ShmPeer>> {
        let mut old = None;
        self.peers.rcu(|peers| {
            let mut peers = FxHashMap::clone(peers);
            old = match &peer {
                Some(p) => peers.insert(handle, p.clone()),
                None => peers.remove(&handle),
            };
            peers
        });
        old
    }

    /// Connects to a same-host peer and maps its buffers (again, on refresh). Peers on
    /// another host, or without shm, are left alone.
    async fn attach_peer(&self, peer: &Arc<Peer>) -> Result<()> {
        let desc = peer.descriptor();
        let Some(socket) = socket_of(&desc) else {
            return Ok(());
        };
        if desc.machine_id != self.machine_id || desc.engine_id == self.local_engine_id {
            return Ok(());
        }
        let token = desc.token_bytes()?;
        let attached = connect_and_map(&socket, self.local_engine_id, &token, &desc).await?;
        let Attached {
            stream,
            pidfd,
            maps,
            life,
        } = attached;
        let shm_peer = Arc::new(ShmPeer {
            peer: peer.clone(),
            pidfd,
            life,
            maps: ArcSwap::from_pointee(maps),
            dead: AtomicBool::new(false),
            cancel: self.shutdown.child_token(),
        });
        if let Some(old) = self.replace_peer(peer.handle(), Some(shm_peer.clone())) {
            old.cancel.cancel();
            old.maps.store(Arc::default());
        }
        self.rt
            .spawn(watch(shm_peer, stream, self.on_death.clone()));
        Ok(())
    }

    /// Runs `f` on the peer and the mapping that `req` is copied with, once the transport
    /// is open, the target not known dead, its buffer mapped and every span inside the
    /// mapping; why not otherwise. Borrowed from the tables: no reference taken.
    fn with_target<R>(
        &self,
        req: &ValidatedRequest,
        f: impl FnOnce(&Arc<ShmPeer>, &Arc<RemoteMapping>) -> R,
    ) -> Result<R> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let peers = self.peers.load();
        let peer = peers.get(&req.peer.handle()).ok_or_else(|| {
            Error::TransportUnavailable(format!("no shared memory with {}", req.peer.name()))
        })?;
        if !peer.known_alive() {
            return Err(req.peer.lost_error_or("target process exited"));
        }
        let maps = peer.maps.load();
        let mapping = maps.get(&req.remote_buffer).ok_or_else(|| {
            Error::TransportUnavailable(format!(
                "buffer {} of {} is not mapped",
                req.remote_buffer,
                req.peer.name()
            ))
        })?;
        if let Some(s) = req
            .spans()
            .iter()
            .find(|s| mapping.range_ptr(s.remote_offset, s.length).is_none())
        {
            return Err(Error::OutOfRange(format!(
                "[{}+{}) outside the {}-byte mapping of buffer {}",
                s.remote_offset,
                s.length,
                mapping.len(),
                req.remote_buffer
            )));
        }
        Ok(f(peer, mapping))
    }

    /// How `req` would be copied: shared with the copy threads, handed to them, or by the
    /// submitting thread alone. `polled`: its task is polled (the batch API), not a
    /// Promise's.
    fn sharing(&self, req: &ValidatedRequest, more_follow: bool, polled: bool) -> Sharing {
        let (shared, run) = match req.gathered() {
            Some(_) => (req.length > GATHER_SHARE_MIN, SHARED_RUN),
            None => (req.length > self.plain_share_min, plain_job(req.length)),
        };
        Sharing {
            shared,
            hand_off: hands_off(req.length, more_follow, self.helpers, polled),
            run,
        }
    }

    fn submit_attempt(&self, a: &Attempt) -> Result<()> {
        let req = a.task.request();
        let observer = a.task.observer();
        self.with_target(req, |peer, mapping| {
            let Sharing {
                shared,
                hand_off,
                run,
            } = self.sharing(req, a.more_follow, observer == Observer::Poll);
            // What this thread may copy itself: a Promise's caller is a JS thread, which
            // a long copy would block.
            let budget = match (hand_off, observer) {
                (true, _) => 0,
                (false, Observer::Poll) => POLLED_INLINE_COPY_MAX,
                (false, Observer::Progress) => INLINE_COPY_MAX,
            };
            // Copy threads help only while a core is free for them. With as many threads
            // copying large blocks as there are cores, a helper takes turns with them
            // instead: two tebench threads of 1 MiB blocks on 2 cores moved 30-43 GB/s
            // shared, with 4-8 ms tails where a worker was preempted, against 55-59 GB/s
            // of 256-512 KiB blocks copied inline.
            let cores_busy = (shared || hand_off) && self.large_copiers.others_busy(self.cores);
            if !(shared || hand_off) || (cores_busy && req.length <= budget) {
                a.task.expect_slices(a.attempt, 1);
                Copy {
                    task: &a.task,
                    attempt: a.attempt,
                    peer,
                    mapping,
                    opcode: req.opcode,
                    region: &req.local,
                    spans: req.spans(),
                }
                .run();
                return Ok(());
            }
            let shared = Shared {
                task: a.task.clone(),
                attempt: a.attempt,
                peer: peer.clone(),
                mapping: mapping.clone(),
                opcode: req.opcode,
                region: req.local.clone(),
                works: Work::cut(req, run).into_boxed_slice(),
                taken: AtomicU64::new(0),
                left: AtomicUsize::new(0),
                copied: AtomicU64::new(0),
                error: Mutex::new(None),
            };
            self.share(shared, budget)
        })?
    }

    /// Runs `shared`'s jobs on the copy threads that come to help and on this thread,
    /// which takes jobs until it copied `budget` bytes; when none is left to take, it waits
    /// a little for the ones still being copied, so that the outcome is usually there (and
    /// told by this thread) when the call returns.
    fn share(&self, mut shared: Shared, budget: u64) -> Result<()> {
        let jobs = shared.works.len();
        if u32::try_from(jobs).is_err() {
            return Err(Error::InvalidArgument("request too large".into()));
        }
        // Every job, and this thread's wait.
        *shared.left.get_mut() = jobs + 1;
        // At least one (there is a job, and this thread may leave jobs to them, `budget`);
        // a helper that finds none left returns at once.
        let helpers = self.helpers.min(jobs).max(1);
        let shared = Arc::new(shared);
        {
            let queue = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let Some(tx) = queue.as_ref() else {
                return Err(Error::Closed);
            };
            shared.task.expect_slices(shared.attempt, 1);
            for _ in 0..helpers {
                if tx.send(shared.clone()).is_err() {
                    break;
                }
            }
        }
        shared.work(budget, End::Front);
        if shared.all_taken() {
            shared.join(SHARED_JOIN_WAIT);
        } else {
            // Left to the copy threads (this thread copied its budget): the last of
            // them tells the task.
            shared.one_done();
        }
        Ok(())
    }
}

/// Connects, proves the token, and maps every shm buffer of `desc`.
///
/// Everything that blocks runs on tokio's blocking pool, never on a runtime worker: the
/// connect, the fd exchange (blocking reads with a timeout) and above all the mapping,
/// whose `MAP_POPULATE` allocates and zeroes every page of a fresh memfd (about 1 s per
/// GiB on an idle machine, several under load). A worker blocked that long starves the
/// tasks queued on it, the heartbeats of every peer among them, until the engine declares
/// a healthy peer silent.
async fn connect_and_map(
    socket: &str,
    local_engine_id: u64,
    token: &Token,
    desc: &SegmentDescriptor,
) -> Result<Attached> {
    let io = |what: &'static str| move |e: std::io::Error| Error::io(what, &e);
    let name = socket.to_string();
    let (std_stream, pidfd) = off_runtime(move || {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(io("shm address"))?;
        let std_stream = StdUnixStream::connect_addr(&addr).map_err(io("connect shm socket"))?;
        let pid = peer_pid(&std_stream).map_err(io("shm peer pid"))?;
        let pidfd = Pidfd::open(pid).map_err(io("pidfd_open"))?;
        Ok((std_stream, pidfd))
    })
    .await?;
    // The handshake, as on tcp; then the token and fd requests, blocking with a timeout.
    std_stream.set_nonblocking(true).map_err(io("shm socket"))?;
    let mut tokio_stream = UnixStream::from_std(std_stream).map_err(io("shm socket"))?;
    let shake = client_handshake(&mut tokio_stream, ConnKind::Shm, local_engine_id);
    tokio::time::timeout(AUTH_TIMEOUT, shake)
        .await
        .map_err(|_| Error::Protocol("shm handshake timed out".into()))?
        .map_err(|reason| Error::Connect {
            peer: format!("shm socket {socket}"),
            reason,
        })?;
    let std_stream = tokio_stream.into_std().map_err(io("shm socket"))?;
    let (token, desc) = (*token, desc.clone());
    let (std_stream, (maps, life)) = off_runtime(move || {
        let got = fetch_and_map(&std_stream, &token, &desc)?;
        Ok((std_stream, got))
    })
    .await?;
    std_stream.set_nonblocking(true).map_err(io("shm socket"))?;
    let stream = UnixStream::from_std(std_stream).map_err(io("shm socket"))?;
    Ok(Attached {
        stream,
        pidfd,
        maps,
        life,
    })
}

/// A peer's shm buffers, mapped, by buffer id.
/// By the peer's own buffer ids (an authenticated peer's, read per copy: a fast hash).
type Mappings = FxHashMap<u64, Arc<RemoteMapping>>;

/// What an attach gives: the connection the target's death is watched on, its pidfd, its
/// shm buffers mapped, and its life word when it sent one.
struct Attached {
    stream: UnixStream,
    pidfd: Pidfd,
    maps: Mappings,
    life: Option<PeerLifeWord>,
}

/// Runs blocking work on tokio's blocking pool and waits for it.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Io(format!("shm attach: {e}")))?
}

/// The blocking part of an attach, after the handshake: the token, then one fd request
/// per shm buffer of `desc`, each mapped as it comes. Reads time out after
/// [`AUTH_TIMEOUT`]: a peer that stops answering costs a blocking-pool thread that long.
fn fetch_and_map(
    std_stream: &StdUnixStream,
    token: &Token,
    desc: &SegmentDescriptor,
) -> Result<(Mappings, Option<PeerLifeWord>)> {
    let io = |what: &'static str| move |e: std::io::Error| Error::io(what, &e);
    std_stream
        .set_nonblocking(false)
        .map_err(io("shm socket"))?;
    std_stream
        .set_read_timeout(Some(AUTH_TIMEOUT))
        .map_err(io("shm socket"))?;
    let mut s = std_stream;
    s.write_all(token).map_err(io("shm token"))?;
    let mut ok = [0u8; 1];
    let (n, mut word) =
        crate::linux::recv_fds(std_stream, &mut ok, 1).map_err(io("shm token reply"))?;
    if n != 1 {
        return Err(Error::Protocol(
            "the shm socket closed before the token reply".into(),
        ));
    }
    let life = word.pop().and_then(|fd| {
        PeerLifeWord::map(fd)
            .map_err(|e| tracing::debug!(error = %e, "life word refused: the pidfd is polled"))
            .ok()
    });
    let mut maps = FxHashMap::default();
    for b in desc
        .buffers
        .iter()
        .filter(|b| b.transports.contains(&TransportKind::Shm))
    {
        s.write_all(&b.id.to_le_bytes())
            .map_err(io("shm fd request"))?;
        let mut reply = [0u8; 16];
        let (n, mut fds) =
            crate::linux::recv_fds(std_stream, &mut reply, 1).map_err(io("shm fd reply"))?;
        if n != reply.len() {
            return Err(Error::Protocol(format!("short shm reply ({n} bytes)")));
        }
        let status = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&reply[8..]);
        let len = u64::from_le_bytes(len);
        match (status, fds.pop()) {
            (0, Some(fd)) if len == b.length => {
                let len =
                    usize::try_from(len).map_err(|_| Error::Protocol("buffer too large".into()))?;
                let mapping = RemoteMapping::map(fd, len).map_err(io("map shm buffer"))?;
                if !mapping.is_shrink_sealed() {
                    return Err(Error::Protocol(format!(
                        "buffer {} is not sealed against shrinking; refusing to map it",
                        b.id
                    )));
                }
                maps.insert(b.id, Arc::new(mapping));
            }
            (0, _) => {
                return Err(Error::Protocol(format!(
                    "bad shm reply for buffer {}",
                    b.id
                )))
            }
            _ => {} // released since the descriptor was made: not mapped, tcp serves it
        }
    }
    std_stream
        .set_read_timeout(None)
        .map_err(io("shm socket"))?;
    Ok((maps, life))
}

/// Reports the peer dead when its process exits or its unix connection closes.
async fn watch(peer: Arc<ShmPeer>, mut stream: UnixStream, on_death: DeathHook) {
    let mut byte = [0u8; 1];
    let why = tokio::select! {
        biased;
        _ = peer.cancel.cancelled() => return,
        r = peer.pidfd.exited() => match r {
            Ok(()) => "target process exited".to_string(),
            Err(e) => format!("pidfd failed: {e}"),
        },
        r = stream.read(&mut byte) => match r {
            Ok(0) => "shm connection closed by the target".to_string(),
            Ok(_) => "unexpected bytes on the shm connection".to_string(),
            Err(e) => format!("shm connection failed: {e}"),
        },
    };
    peer.dead.store(true, Ordering::Release);
    tracing::warn!(peer = peer.peer.name(), reason = %why, "same-host peer gone");
    on_death(&peer.peer, why);
}

/// The abstract socket a peer serves its memfds on, from its descriptor.
fn socket_of(desc: &SegmentDescriptor) -> Option<String> {
    desc.transport_info
        .get(TransportKind::Shm.name())?
        .get("socket")?
        .as_str()
        .map(str::to_string)
}

/// Builds the shared-memory transport.
#[derive(Debug, Clone, Copy)]
pub struct ShmFactory {
    /// Copy threads for large copies.
    pub copy_threads: usize,
}

impl TransportFactory for ShmFactory {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>> {
        Ok(ShmTransport::new(context, self.copy_threads)?)
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    /// Binds the abstract socket that serves this engine's memfds to same-host peers.
    fn install(&self) -> Result<()> {
        let _guard = self.rt.enter();
        let (listener, name) = bind(self.local_engine_id)?;
        self.rt
            .spawn(serve(listener, self.gate.clone(), self.shutdown.clone()));
        let _ = self.socket.set(name);
        Ok(())
    }

    fn describe(&self) -> Option<serde_json::Value> {
        let socket = self.socket.get()?;
        Some(serde_json::json!({ "socket": socket }))
    }

    /// Connects to a same-host peer and maps its buffers (again, on refresh).
    fn attach(&self, peer: &Arc<Peer>) -> Option<BoxFuture<Result<()>>> {
        let me = self.me.upgrade()?;
        let peer = peer.clone();
        Some(Box::pin(async move { me.attach_peer(&peer).await }))
    }

    fn reachable(&self, peer: &Peer) -> std::result::Result<(), String> {
        // Asked for every request: looked at under the lock, no reference taken.
        let alive = self
            .peers
            .load()
            .get(&peer.handle())
            .map(|p| p.known_alive());
        match alive {
            Some(true) => Ok(()),
            Some(false) => Err("the target process exited".into()),
            None => {
                let desc = peer.descriptor();
                if desc.machine_id != self.machine_id {
                    Err(format!(
                        "{} is on another host (machine/boot id {:?}, here {:?})",
                        peer.name(),
                        desc.machine_id,
                        self.machine_id
                    ))
                } else if socket_of(&desc).is_none() {
                    Err(format!("{} does not offer shared memory", peer.name()))
                } else {
                    Err(format!("shared memory with {} is not set up", peer.name()))
                }
            }
        }
    }

    fn serves(&self, region: &crate::memory::Region) -> bool {
        // Only engine-owned (memfd) regions can be shared; user Buffers are served over
        // the network transports.
        region.mapping().is_some()
    }

    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>> {
        attempts.iter().map(|a| self.submit_attempt(a)).collect()
    }

    fn submit_one(&self, attempt: &Attempt) -> Result<()> {
        self.submit_attempt(attempt)
    }

    /// A copy that an attempt would make on the submitting thread alone (neither shared
    /// nor handed off), made now. Whatever would stop an attempt before its copy (no
    /// mapping, a target known dead, a range outside the mapping) is left to the attempt
    /// to report: `None`, nothing copied.
    fn complete_now(&self, request: &ValidatedRequest, more_follow: bool) -> Option<Result<()>> {
        // Only a polled submission asks (`Transport::complete_now`).
        let sharing = self.sharing(request, more_follow, true);
        if sharing.shared || sharing.hand_off {
            return None;
        }
        let copy = |peer: &Arc<ShmPeer>, mapping: &Arc<RemoteMapping>| {
            copy_spans(
                peer,
                mapping,
                &request.local,
                request.opcode,
                request.spans(),
            )
        };
        self.with_target(request, copy)
            .ok()
            .map(|copied| copied.map(drop))
    }

    fn fail_peer(&self, peer: &Peer, _error: Error) {
        // Copies are synchronous or queued; queued ones re-check liveness before copying.
        if let Some(p) = self.peer(peer.handle()) {
            p.dead.store(true, Ordering::Release);
        }
    }

    fn forget_peer(&self, peer: &Peer, error: Error) {
        self.fail_peer(peer, error);
        if let Some(p) = self.replace_peer(peer.handle(), None) {
            p.cancel.cancel();
            // Unmap now: only copies already in flight keep their mapping until they end.
            p.maps.store(Arc::default());
        }
    }

    fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.shutdown.cancel();
        let peers = self.peers.swap(Arc::default());
        for p in peers.values() {
            p.dead.store(true, Ordering::Release);
            p.cancel.cancel();
            p.maps.store(Arc::default());
        }
        // Closing the queue ends the copy threads once they finish their current job.
        drop(self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take());
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_threads_help_only_while_other_lanes_leave_a_core_free() {
        let c = LargeCopiers::new();
        let ms = 1_000_000;
        // Alone: the other core is free.
        assert!(!c.note(0, 10 * ms, 2));
        // A second lane copying within the window: both cores are taken, for either.
        assert!(c.note(1, 10 * ms + 10_000, 2));
        assert!(c.note(0, 10 * ms + 20_000, 2));
        // Three cores: two copiers still leave one.
        assert!(!c.note(0, 10 * ms + 30_000, 3));
        // The other lane went quiet for longer than the window.
        assert!(!c.note(0, 12 * ms, 2));
        // The same lane again never counts as another.
        assert!(!c.note(0, 12 * ms + 1, 2));
    }

    #[test]
    fn copy_threads_leave_a_core_to_the_submitting_thread() {
        // The default (2 I/O threads) on 2 cores: one copy thread, none taking turns with it.
        assert_eq!(copy_thread_count(2, 2), 1);
        assert_eq!(copy_thread_count(2, 8), 2);
        assert_eq!(copy_thread_count(8, 4), 3);
        // Always one, even on one core (a copy thread that wakes late only finds less).
        assert_eq!(copy_thread_count(2, 1), 1);
        assert_eq!(copy_thread_count(0, 16), 1);
    }

    #[test]
    fn a_copy_thread_lets_go_of_the_queue_while_it_copies() {
        ferry_testkit::within(Duration::from_secs(10), "copy threads' queue", || {
            let (tx, rx) = mpsc::channel::<u32>();
            let queue = Arc::new(Mutex::new(rx));
            tx.send(1).expect("send");
            tx.send(2).expect("send");
            // This thread took a copy and is still copying it: another copy thread takes
            // the next one meanwhile.
            let taken = next_shared(&queue).expect("first");
            let other = {
                let queue = queue.clone();
                std::thread::spawn(move || next_shared(&queue))
            };
            assert_eq!(other.join().expect("join").expect("second"), 2);
            assert_eq!(taken, 1);
            // Shut down: a waiting copy thread hears it.
            drop(tx);
            assert!(next_shared(&queue).is_err());
        });
    }

    #[test]
    fn a_polled_batch_hands_large_copies_off_only_to_more_than_one_copy_thread() {
        let mib = 1 << 20;
        // One copy thread: a polled batch's copies are shared, a Promise's handed off.
        assert!(!hands_off(mib, true, 1, true));
        assert!(hands_off(mib, true, 1, false));
        // Several: handed off either way.
        assert!(hands_off(mib, true, 2, true));
        assert!(hands_off(mib, true, 2, false));
        // Never the last copy of a submission, nor one up to SHARE_MIN.
        assert!(!hands_off(mib, false, 4, false));
        assert!(!hands_off(SHARE_MIN, true, 4, false));
        assert!(hands_off(SHARE_MIN + 1, true, 4, false));
    }

    #[test]
    fn plain_copies_are_halved_up_to_two_chunks_then_cut_in_chunks() {
        assert_eq!(plain_job(256 << 10), 128 << 10);
        assert_eq!(plain_job((256 << 10) + 1), (128 << 10) + 4096);
        assert_eq!(plain_job(1 << 20), CHUNK);
        assert_eq!(plain_job(8 << 20), CHUNK);
    }

    #[test]
    fn copies_are_shared_above_a_quarter_of_the_l2() {
        assert_eq!(plain_share_min(Some(512 << 10), None), 128 << 10);
        assert_eq!(plain_share_min(Some(1 << 20), None), 256 << 10);
        assert_eq!(plain_share_min(Some(2 << 20), None), 512 << 10);
        // Bounded either way, and a default where the size is unknown.
        assert_eq!(plain_share_min(Some(32 << 10), None), 64 << 10);
        assert_eq!(plain_share_min(Some(64 << 20), None), 1 << 20);
        assert_eq!(plain_share_min(None, None), PLAIN_SHARE_MIN_UNKNOWN_L2);
    }

    #[test]
    fn copies_are_shared_above_what_a_core_copies_in_six_microseconds() {
        // The machines measured (bytes per ns within the L2): a Xeon with 2 MiB L2s shares
        // above 128 KiB where the L2's size alone said 512 KiB, whether its probe reads
        // 25 or 40; a Zen 5 core, fast enough to copy 256 KiB alone, keeps the L2's
        // threshold; so does a Zen 3.
        assert_eq!(plain_share_min(Some(2 << 20), Some(39.0)), 128 << 10);
        assert_eq!(plain_share_min(Some(2 << 20), Some(25.0)), 128 << 10);
        assert_eq!(plain_share_min(Some(2 << 20), Some(44.0)), 256 << 10);
        assert_eq!(plain_share_min(Some(1 << 20), Some(95.0)), 256 << 10);
        assert_eq!(plain_share_min(Some(512 << 10), Some(35.0)), 128 << 10);
        // Whatever the rate, never below 64 KiB; a rate that is no positive number counts
        // as none; unknown L2 and a fast core: the default.
        assert_eq!(plain_share_min(Some(2 << 20), Some(1.0)), 64 << 10);
        for nonsense in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(plain_share_min(Some(2 << 20), Some(nonsense)), 512 << 10);
        }
        assert_eq!(plain_share_min(None, Some(1e6)), PLAIN_SHARE_MIN_UNKNOWN_L2);
    }

    #[test]
    fn the_submitting_thread_takes_jobs_from_the_front_copy_threads_from_the_back() {
        let taken = AtomicU64::new(0);
        assert_eq!(take_from(&taken, 4, End::Front), Some(0));
        assert_eq!(take_from(&taken, 4, End::Back), Some(3));
        assert_eq!(take_from(&taken, 4, End::Back), Some(2));
        assert_eq!(take_from(&taken, 4, End::Front), Some(1));
        assert_eq!(take_from(&taken, 4, End::Front), None);
        assert_eq!(take_from(&taken, 4, End::Back), None);
        // Two halves: each end always gets the same one, whoever comes first.
        let taken = AtomicU64::new(0);
        assert_eq!(take_from(&taken, 2, End::Front), Some(0));
        assert_eq!(take_from(&taken, 2, End::Back), Some(1));
        let taken = AtomicU64::new(0);
        assert_eq!(take_from(&taken, 2, End::Back), Some(1));
        assert_eq!(take_from(&taken, 2, End::Front), Some(0));
        assert_eq!(take_from(&AtomicU64::new(0), 0, End::Front), None);
    }

    #[test]
    fn threads_taking_at_both_ends_take_every_job_exactly_once() {
        const JOBS: usize = 10_000;
        let taken = AtomicU64::new(0);
        let seen: Vec<AtomicUsize> = (0..JOBS).map(|_| AtomicUsize::new(0)).collect();
        std::thread::scope(|s| {
            for end in [End::Front, End::Back, End::Back] {
                let (taken, seen) = (&taken, &seen);
                s.spawn(move || {
                    while let Some(i) = take_from(taken, JOBS, end) {
                        seen[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert!(seen.iter().all(|n| n.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn an_attach_waiting_on_its_peer_leaves_the_runtime_running() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (listener, name) = {
            let _guard = rt.enter();
            bind(0x5eed).expect("bind")
        };
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = ticks.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticker.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The peer, on its own thread and runtime.
        let seen = ticks.clone();
        let peer = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("peer runtime");
            rt.block_on(async move {
                let listener =
                    UnixListener::from_std(listener.into_std().expect("std")).expect("listener");
                let (mut stream, _) = listener.accept().await.expect("accept");
                server_handshake(&mut stream, None, 0x5eed)
                    .await
                    .expect("handshake");
                let mut token = [0u8; 16];
                stream.read_exact(&mut token).await.expect("token");
                // The initiator now waits for the reply. Did its runtime tick meanwhile?
                let before = seen.load(Ordering::Relaxed);
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                let ticked = loop {
                    if seen.load(Ordering::Relaxed) >= before + 3 {
                        break true;
                    }
                    if std::time::Instant::now() > deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                stream.write_all(&[1]).await.expect("reply");
                ticked
            })
        });
        let desc = SegmentDescriptor {
            engine_id: 0x5eed,
            name: "127.0.0.1:1".into(),
            machine_id: String::new(),
            pid: std::process::id(),
            tcp_addr: "127.0.0.1:1".into(),
            token: String::new(),
            buffers: Vec::new(),
            transport_info: Default::default(),
        };
        let attached = rt.block_on(connect_and_map(&name, 1, &[7; 16], &desc));
        let ticked = peer.join().expect("peer thread");
        assert!(attached.is_ok(), "{:?}", attached.err());
        assert!(
            ticked,
            "the runtime stopped while the attach waited for its peer"
        );
    }

    #[test]
    fn runs_group_whole_spans_up_to_a_chunk_and_cover_each_once() {
        let spans: Vec<Span> = [4, 4, 4, 10, 3, 3, 1]
            .iter()
            .map(|&length| Span {
                local_offset: 0,
                remote_offset: 0,
                length,
            })
            .collect();
        let got: Vec<_> = runs(&spans, 8).collect();
        // 4+4 | 4 | 10 (alone: larger than a chunk) | 3+3+1
        assert_eq!(got, vec![0..2, 2..3, 3..4, 4..7]);
        assert_eq!(runs(&spans, u64::MAX).collect::<Vec<_>>(), vec![0..7]);
        assert_eq!(runs(&[], 8).count(), 0);
    }

    #[test]
    fn a_gather_makes_no_more_runs_than_cut_sizes_its_list_for() {
        // Deterministic pseudo-random span lengths (xorshift), many lists and chunks.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let chunk = 1 + next() % 64;
            let spans: Vec<Span> = (0..1 + next() % 40)
                .map(|_| Span {
                    local_offset: 0,
                    remote_offset: 0,
                    length: 1 + next() % 100,
                })
                .collect();
            let total: u64 = spans.iter().map(|s| s.length).sum();
            let bound = (2 * total.div_ceil(chunk) + 1).min(spans.len() as u64);
            let made = runs(&spans, chunk).count() as u64;
            assert!(
                made <= bound,
                "{made} runs > {bound} for {spans:?} by {chunk}"
            );
        }
    }
}
