//! The whole shm copy policy: how one copy is made, as a function of the machine and the
//! request. Nothing else in the transport decides it; the shells (`mod.rs`,
//! `copy_threads`, `shared_copy`) carry the plan out.
//!
//! A copy is made in one of three ways:
//! - **inline**: one memcpy on the submitting thread, where a hand-off would cost more than
//!   the copy (a wake-up, another core's cache to fill);
//! - **shared**: cut into jobs that the submitting thread and the copy threads take in turn
//!   (`shared_copy::Shared`), so that a copy thread that wakes late only finds fewer jobs
//!   left and the copy is never slower than the submitting thread alone;
//! - **handed off**: the same jobs left to the copy threads whole, where more copies of the
//!   same submission follow and the submitting thread copies those meanwhile.
//!
//! A split copy (shared or handed off) is made inline after all when other submitting
//! threads copying large blocks already keep every core busy, and the submitting thread may
//! copy it whole ([`CopyPolicy::inline_after_all`]): a copy thread would only take turns
//! with them.
//!
//! Pure: the machine is measured once by the transport ([`Machine`]), the request described
//! by the submitting thread ([`CopyRequest`]), and how many other threads copy large blocks
//! now is counted by `large_copiers`.

use std::time::Duration;

/// What the policy reads of the machine, measured once when the transport is built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Machine {
    /// The cores this process may run on.
    pub(super) cores: usize,
    /// A core's L2 cache in bytes (`cpu_cache`); `None` where the system does not say.
    pub(super) l2: Option<u64>,
    /// Bytes per nanosecond one core copies within its own cache (`copy_speed`); `None`
    /// where it could not be measured.
    pub(super) copy_rate: Option<f64>,
    /// The engine's I/O threads (`EngineConfig::io_threads`): how many copy threads are
    /// asked for.
    pub(super) io_threads: usize,
}

/// Who waits for a copy's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    /// A polled task (the batch API, tebench's native workers): a caller that waits for the
    /// copy anyway.
    Polled,
    /// A Promise's task: its caller is a JS thread, which a long copy would block.
    Promise,
}

/// What the policy reads of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CopyRequest {
    /// Bytes to copy.
    pub(super) length: u64,
    /// A gather of scattered small spans (`request::Gather`), not one span.
    pub(super) gathered: bool,
    /// More attempts of the same submission follow this one (`Attempt::more_follow`).
    pub(super) more_follow: bool,
    pub(super) caller: Caller,
}

/// How one copy is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// One memcpy on the submitting thread.
    Inline,
    /// Cut into jobs for the submitting thread and the copy threads (unless
    /// [`CopyPolicy::inline_after_all`] says otherwise).
    Split(Split),
}

/// A copy cut into jobs: shared with the copy threads, or handed off to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Split {
    /// The size of its jobs: pieces of a single span; runs of whole spans of a gather.
    pub(super) job: u64,
    /// Bytes the submitting thread copies itself before it leaves the rest to the copy
    /// threads: 0 where the copy is handed off whole.
    pub(super) own_bytes: u64,
    /// Whether the whole copy is within `own_bytes`.
    fits_own: bool,
}

/// What a Promise's submitting thread copies itself: a copy up to this size runs on it as
/// one memcpy (a hand-off costs a wake-up that such a copy does not repay); of a larger one
/// it copies this much and leaves the rest to the copy threads.
const INLINE_COPY_MAX: u64 = 1 << 20;
/// The same for a polled task's submitting thread, which waits for the copy anyway: it
/// copies this much of a request itself, beside the copy threads.
const POLLED_INLINE_COPY_MAX: u64 = 8 << 20;

/// The largest job of a split plain copy: copies up to twice this size are cut in two
/// halves, larger ones into jobs of this size that the submitting thread and the copy
/// threads take in turn.
const CHUNK: u64 = 512 << 10;

/// Plain copies up to this size are never shared: a hand-off costs a good part of their
/// time.
const MIN_SHARE_MIN: u64 = 64 << 10;
/// The L2's size never puts the threshold above this ([`plain_share_min`]): a copy this
/// large is shared whatever the cache.
const MAX_SHARE_MIN: u64 = 1 << 20;
/// The threshold where the system does not tell the L2's size.
const PLAIN_SHARE_MIN_UNKNOWN_L2: u64 = 128 << 10;
/// A copy that one core takes longer than this for is worth sharing with another; a
/// shorter one gains less from a second core than the hand-off costs. The threshold is the
/// largest power of two copied within this time, so the shared copies are those that take
/// from about 3 to 6 µs upwards, whatever the probe's error within a factor of two.
const SHARE_COPY_TIME: Duration = Duration::from_micros(6);

/// A copy above this size that more of its submission follow may be handed to the copy
/// threads whole ([`hands_off`]), so that a batch's large copies run beside the submitting
/// thread (which copies the last) instead of one after another on it. Smaller copies stay
/// on it, where a hand-off costs more than the copy.
const HAND_OFF_MIN: u64 = 256 << 10;

/// A gather above this size is shared. Its spans are scattered small copies, bound by
/// memory latency more than bandwidth, so a second core nearly doubles its rate.
const GATHER_SHARE_MIN: u64 = 128 << 10;
/// The runs a shared gather is cut into: small enough that a copy thread that wakes late
/// still finds some left, large enough that taking one costs nothing next to copying it.
const GATHER_RUN: u64 = 64 << 10;

/// Copy threads at most, however many I/O threads the engine runs.
const MAX_COPY_THREADS: usize = 8;

/// A thread that copied a large block (one split) within this long is counted as keeping
/// its core busy (`large_copiers`).
pub(super) const BUSY_WINDOW: Duration = Duration::from_millis(1);

/// The copy policy of one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CopyPolicy {
    cores: usize,
    copy_threads: usize,
    plain_share_min: u64,
}

impl CopyPolicy {
    /// The policy for `machine`.
    pub(super) fn new(machine: &Machine) -> Self {
        Self {
            cores: machine.cores,
            copy_threads: copy_thread_count(machine.io_threads, machine.cores),
            plain_share_min: plain_share_min(machine.l2, machine.copy_rate),
        }
    }

    /// How many copy threads the transport runs.
    pub(super) fn copy_threads(&self) -> usize {
        self.copy_threads
    }

    /// Plain copies above this size are split.
    pub(super) fn plain_share_min(&self) -> u64 {
        self.plain_share_min
    }

    /// How `copy` is made.
    pub(super) fn plan(&self, copy: &CopyRequest) -> Plan {
        let polled = copy.caller == Caller::Polled;
        let (shared, job) = if copy.gathered {
            (copy.length > GATHER_SHARE_MIN, GATHER_RUN)
        } else {
            (copy.length > self.plain_share_min, plain_job(copy.length))
        };
        let hand_off = hands_off(copy.length, copy.more_follow, self.copy_threads, polled);
        if !(shared || hand_off) {
            return Plan::Inline;
        }
        let own_bytes = match (hand_off, copy.caller) {
            (true, _) => 0,
            (false, Caller::Polled) => POLLED_INLINE_COPY_MAX,
            (false, Caller::Promise) => INLINE_COPY_MAX,
        };
        Plan::Split(Split {
            job,
            own_bytes,
            fits_own: copy.length <= own_bytes,
        })
    }

    /// Whether `split` is copied inline after all, with `other_copiers` other threads that
    /// copied a large block within [`BUSY_WINDOW`]: where those and this one take every
    /// core, a copy thread would only take turns with them, so a copy the submitting thread
    /// may make whole it makes alone.
    pub(super) fn inline_after_all(&self, split: &Split, other_copiers: usize) -> bool {
        split.fits_own && cores_taken(other_copiers, self.cores)
    }

    /// How many copy threads are asked to help with a split copy of `jobs` jobs: all of
    /// them, but no more than there are jobs, and at least one (a helper that finds none
    /// left returns at once).
    pub(super) fn helpers(&self, jobs: usize) -> usize {
        self.copy_threads.min(jobs).max(1)
    }
}

/// Whether `other_copiers` threads copying large blocks and this one take every one of
/// `cores`.
pub(super) fn cores_taken(other_copiers: usize, cores: usize) -> bool {
    other_copiers + 1 >= cores
}

/// How many copy threads serve the split copies: as many as the engine's I/O threads (at
/// most [`MAX_COPY_THREADS`]), but no more than leave a core to the submitting thread. A
/// copy thread beyond that has no core of its own: it only takes turns with the threads
/// that copy, a third runnable thread on every shared copy of a 2-core machine (woken each
/// time the first let go of the queue, only to find it taken again). Always one, even on
/// one core: a copy thread that wakes late only finds less to copy.
fn copy_thread_count(io_threads: usize, cores: usize) -> usize {
    io_threads
        .clamp(1, MAX_COPY_THREADS)
        .min(cores.saturating_sub(1))
        .max(1)
}

/// Plain copies above this size are split. A copy is split once it is too large for one
/// core's cache or too long for one core's cache bandwidth, whichever comes first:
/// - above a quarter of a core's L2: below it, source and destination together fit half the
///   L2 and one core copies at cache speed; beyond it, two cores each keep their half in
///   their own L2;
/// - above what one core copies in [`SHARE_COPY_TIME`] at its cache speed: a shorter copy
///   gains less from a second core than the hand-off costs. The size alone does not tell
///   it: a large L2 with a slow core reaches the time well before the size.
fn plain_share_min(l2: Option<u64>, copy_rate: Option<f64>) -> u64 {
    let by_size = l2.map_or(PLAIN_SHARE_MIN_UNKNOWN_L2, |l2| {
        (l2 / 4).clamp(MIN_SHARE_MIN, MAX_SHARE_MIN)
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

/// The size of the jobs a split plain copy of `len` bytes is cut into: two halves up to
/// `2 × CHUNK` (page-aligned), `CHUNK`s beyond.
fn plain_job(len: u64) -> u64 {
    len.div_ceil(2).next_multiple_of(4096).min(CHUNK)
}

/// Whether a copy of `length` bytes is handed to the copy threads whole ([`HAND_OFF_MIN`]):
/// only where more of its submission follow, and only where that puts more cores to work
/// than sharing each copy would. With one copy thread, handing a polled batch's copies off
/// leaves that thread copying all but the last while the submitting thread, having copied
/// the last, waits for it: one core for most of the batch, where shared each copy is split
/// between the two. A Promise's caller is a JS thread, which a shared copy would keep
/// copying (up to [`INLINE_COPY_MAX`] of every request), so its copies are still handed off.
fn hands_off(length: u64, more_follow: bool, copy_threads: usize, polled: bool) -> bool {
    more_follow && length > HAND_OFF_MIN && (copy_threads > 1 || !polled)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    fn machine(cores: usize, l2: Option<u64>, copy_rate: Option<f64>) -> Machine {
        Machine {
            cores,
            l2,
            copy_rate,
            io_threads: 2,
        }
    }

    fn plain(length: u64, caller: Caller) -> CopyRequest {
        CopyRequest {
            length,
            gathered: false,
            more_follow: false,
            caller,
        }
    }

    /// Whether the copy threads copy it all, the submitting thread none.
    fn handed_off(split: &Split) -> bool {
        split.own_bytes == 0
    }

    fn split(plan: Plan) -> Split {
        match plan {
            Plan::Split(split) => split,
            Plan::Inline => panic!("copied inline"),
        }
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
    fn copy_threads_are_at_most_eight_whatever_the_io_threads() {
        assert_eq!(copy_thread_count(8, 64), 8);
        assert_eq!(copy_thread_count(9, 64), 8);
        assert_eq!(copy_thread_count(64, 64), 8);
        assert_eq!(copy_thread_count(64, 16), 8);
        assert_eq!(copy_thread_count(64, 2), 1);
        let big = Machine {
            io_threads: 64,
            ..machine(64, Some(2 * MIB), None)
        };
        assert_eq!(CopyPolicy::new(&big).copy_threads(), 8);
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
        // Never the last copy of a submission, nor one up to HAND_OFF_MIN.
        assert!(!hands_off(mib, false, 4, false));
        assert!(!hands_off(HAND_OFF_MIN, true, 4, false));
        assert!(hands_off(HAND_OFF_MIN + 1, true, 4, false));
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
    fn the_rate_threshold_is_a_power_of_two_at_its_edges() {
        // 256 KiB in 6 µs is 43.69 bytes per ns: a core a hair faster shares above
        // 256 KiB, a hair slower above 128 KiB.
        assert_eq!(plain_share_min(Some(64 * MIB), Some(43.7)), 256 * KIB);
        assert_eq!(plain_share_min(Some(64 * MIB), Some(43.6)), 128 * KIB);
        // A quarter of the L2 at its clamp edges.
        assert_eq!(plain_share_min(Some(256 * KIB), None), 64 * KIB);
        assert_eq!(plain_share_min(Some(256 * KIB + 4), None), 64 * KIB + 1);
        assert_eq!(plain_share_min(Some(4 * MIB), None), MIB);
        assert_eq!(plain_share_min(Some(4 * MIB + 4), None), MIB);
    }

    #[test]
    fn plain_copies_split_just_above_the_threshold() {
        // A 2-core machine with 1 MiB L2s and a fast core: threshold 256 KiB.
        let policy = CopyPolicy::new(&machine(2, Some(MIB), Some(95.0)));
        assert_eq!(policy.plain_share_min(), 256 * KIB);
        assert_eq!(policy.copy_threads(), 1);
        for caller in [Caller::Polled, Caller::Promise] {
            assert_eq!(policy.plan(&plain(256 * KIB, caller)), Plan::Inline);
            let s = split(policy.plan(&plain(256 * KIB + 1, caller)));
            assert_eq!(s.job, 128 * KIB + 4096);
            assert!(!handed_off(&s));
        }
        // What the submitting thread copies itself: 8 MiB of a polled copy, 1 MiB of a
        // Promise's.
        let polled = split(policy.plan(&plain(MIB, Caller::Polled)));
        let promised = split(policy.plan(&plain(MIB, Caller::Promise)));
        assert_eq!((polled.own_bytes, promised.own_bytes), (8 * MIB, MIB));
        assert_eq!((polled.job, promised.job), (CHUNK, CHUNK));
    }

    #[test]
    fn gathers_split_above_128_kib_in_runs_of_64_kib_whatever_the_machine() {
        for m in [
            machine(2, Some(MIB), Some(95.0)),
            machine(16, Some(2 * MIB), Some(39.0)),
            machine(64, None, None),
        ] {
            let policy = CopyPolicy::new(&m);
            let gather = |length| CopyRequest {
                gathered: true,
                ..plain(length, Caller::Polled)
            };
            assert_eq!(policy.plan(&gather(128 * KIB)), Plan::Inline);
            let s = split(policy.plan(&gather(128 * KIB + 1)));
            assert_eq!((s.job, s.own_bytes), (GATHER_RUN, 8 * MIB));
        }
    }

    #[test]
    fn the_last_copies_of_a_batch_are_handed_off_by_machine_and_caller() {
        let batch = |length, caller| CopyRequest {
            more_follow: true,
            ..plain(length, caller)
        };
        // 2 cores, one copy thread, a large L2 (threshold 512 KiB): a polled batch's 384 KiB
        // copies stay inline, a Promise's are handed off.
        let two = CopyPolicy::new(&machine(2, Some(2 * MIB), None));
        assert_eq!(two.plan(&batch(384 * KIB, Caller::Polled)), Plan::Inline);
        let s = split(two.plan(&batch(384 * KIB, Caller::Promise)));
        assert!(handed_off(&s));
        assert_eq!(s.job, 192 * KIB);
        // Above the threshold a polled batch's copy is shared, not handed off.
        assert!(!handed_off(&split(two.plan(&batch(MIB, Caller::Polled)))));
        // 16 cores, two copy threads: handed off either way, above 256 KiB only.
        let sixteen = CopyPolicy::new(&machine(16, Some(2 * MIB), None));
        assert_eq!(sixteen.copy_threads(), 2);
        for caller in [Caller::Polled, Caller::Promise] {
            assert_eq!(sixteen.plan(&batch(HAND_OFF_MIN, caller)), Plan::Inline);
            assert!(handed_off(&split(
                sixteen.plan(&batch(HAND_OFF_MIN + 1, caller))
            )));
        }
    }

    #[test]
    fn split_copies_stay_inline_only_where_busy_cores_leave_no_helper_a_core() {
        let mb = |n: u64| n * MIB;
        // 2 cores: one other large copier takes the free core.
        let two = CopyPolicy::new(&machine(2, Some(MIB), Some(95.0)));
        let promised = split(two.plan(&plain(mb(1), Caller::Promise)));
        assert!(!two.inline_after_all(&promised, 0));
        assert!(two.inline_after_all(&promised, 1));
        // A copy above what the submitting thread copies itself is split anyway.
        let larger = split(two.plan(&plain(mb(1) + 1, Caller::Promise)));
        assert!(!two.inline_after_all(&larger, 1));
        let polled = split(two.plan(&plain(mb(8), Caller::Polled)));
        assert!(two.inline_after_all(&polled, 1));
        let polled = split(two.plan(&plain(mb(8) + 1, Caller::Polled)));
        assert!(!two.inline_after_all(&polled, 1));
        // A handed-off copy is never made inline.
        let handed = split(two.plan(&CopyRequest {
            more_follow: true,
            ..plain(mb(1), Caller::Promise)
        }));
        assert!(!two.inline_after_all(&handed, 100));
        // 16 cores: only fifteen others take every core.
        let sixteen = CopyPolicy::new(&machine(16, Some(MIB), None));
        let s = split(sixteen.plan(&plain(mb(1), Caller::Promise)));
        assert!(!sixteen.inline_after_all(&s, 14));
        assert!(sixteen.inline_after_all(&s, 15));
        // One core: always taken.
        let one = CopyPolicy::new(&machine(1, Some(MIB), None));
        assert!(one.inline_after_all(&split(one.plan(&plain(mb(1), Caller::Polled))), 0));
    }

    #[test]
    fn helpers_are_the_copy_threads_up_to_the_jobs() {
        let sixty_four = CopyPolicy::new(&Machine {
            io_threads: 16,
            ..machine(64, None, None)
        });
        assert_eq!(sixty_four.copy_threads(), 8);
        assert_eq!(sixty_four.helpers(2), 2);
        assert_eq!(sixty_four.helpers(100), 8);
        assert_eq!(sixty_four.helpers(0), 1);
        let two = CopyPolicy::new(&machine(2, None, None));
        assert_eq!(two.helpers(16), 1);
    }

    #[test]
    fn thresholds_follow_the_machine() {
        // (cores, L2, rate) → (plain threshold, copy threads with 2 I/O threads).
        let cases = [
            (2, Some(512 * KIB), Some(35.0), 128 * KIB, 1),
            (2, Some(2 * MIB), Some(39.0), 128 * KIB, 1),
            (16, Some(MIB), Some(95.0), 256 * KIB, 2),
            (16, Some(2 * MIB), None, 512 * KIB, 2),
            (64, Some(64 * MIB), None, MIB, 2),
            (64, None, Some(200.0), 128 * KIB, 2),
        ];
        for (cores, l2, rate, share_min, threads) in cases {
            let policy = CopyPolicy::new(&machine(cores, l2, rate));
            assert_eq!(
                policy.plain_share_min(),
                share_min,
                "{cores} {l2:?} {rate:?}"
            );
            assert_eq!(policy.copy_threads(), threads, "{cores} {l2:?} {rate:?}");
            assert_eq!(
                policy.plan(&plain(share_min, Caller::Promise)),
                Plan::Inline
            );
            assert!(matches!(
                policy.plan(&plain(share_min + 1, Caller::Promise)),
                Plan::Split(_)
            ));
        }
    }
}
