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
//! The machine decides how many cores a copy may use: one copy thread per core beside the
//! submitting thread (at most [`MAX_COPY_THREADS`]), a large copy cut into as many jobs as
//! there are cores to take them (no smaller than a core's share of the threshold), and no
//! more copiers on a copy larger than the caches than fill the memory's bandwidth.
//!
//! A split copy (shared or handed off) is made inline after all when other submitting
//! threads copying large blocks already keep every core busy, or the memory's bandwidth,
//! and the submitting thread may copy it whole ([`CopyPolicy::inline_after_all`]): a copy
//! thread would only take turns with them. So is one too small to repay waking a copy
//! thread while none is awake ([`wake_min`]).
//!
//! Pure: the machine is measured once by the transport ([`Machine`]), the request described
//! by the submitting thread ([`CopyRequest`]), how many other threads copy large blocks
//! now is counted by `large_copiers`, and how many copy threads are awake by
//! `copy_threads`.

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
    /// How fast copies beyond the caches go (`memory_speed`, measured once per process
    /// off the engine's start); `None` until then, or where it could not be measured, and
    /// [`SATURATING_COPIERS_UNKNOWN`] copiers are taken to fill the memory's bandwidth.
    pub(super) memory: Option<MemorySpeed>,
}

/// How fast copies of blocks larger than the caches go, as measured (`memory_speed`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct MemorySpeed {
    /// Bytes per nanosecond one core copies alone.
    pub(super) one_core: f64,
    /// Bytes per nanosecond `copiers` cores copy together: the memory's bandwidth, or as
    /// much of it as they fill.
    pub(super) all_cores: f64,
    /// How many cores copied together.
    pub(super) copiers: usize,
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
    /// Larger than the caches: its copiers share the memory's bandwidth with every other
    /// large copy's.
    memory_bound: bool,
    /// Large enough to repay waking a sleeping copy thread ([`wake_min`]); a smaller one is
    /// shared only with a copy thread already awake.
    wakes: bool,
}

/// What a Promise's submitting thread copies itself: a copy up to this size runs on it as
/// one memcpy (a hand-off costs a wake-up that such a copy does not repay); of a larger one
/// it copies this much and leaves the rest to the copy threads.
const INLINE_COPY_MAX: u64 = 1 << 20;
/// The same for a polled task's submitting thread, which waits for the copy anyway: it
/// copies this much of a request itself, beside the copy threads. A copy larger than the
/// caches it copies whole if no copy thread comes ([`own_bytes`]).
const POLLED_INLINE_COPY_MAX: u64 = 8 << 20;

/// The largest job of a split plain copy: a copy is cut into as many jobs as cores may
/// take it, none larger than this, so that the cores that come late still find some.
const CHUNK: u64 = 512 << 10;

/// Plain copies up to this size are never shared: a hand-off costs a good part of their
/// time.
const MIN_SHARE_MIN: u64 = 64 << 10;
/// The L2's size never puts the threshold above this ([`plain_share_min`]): a copy this
/// large is shared whatever the cache.
const MAX_SHARE_MIN: u64 = 1 << 20;
/// The threshold where the system does not tell the L2's size.
const PLAIN_SHARE_MIN_UNKNOWN_L2: u64 = 128 << 10;
/// A copy that one core takes longer than this for is worth waking a sleeping copy thread
/// for ([`wake_min`]): waking one costs microseconds on bare metal, tens on a VM, and a
/// helper that comes that late finds little left of a shorter copy, while the submitting
/// thread pays the wake-up and, when the helper took a job and then lost its core, waits
/// for it.
const WAKE_COPY_TIME: Duration = Duration::from_micros(20);
/// The size above which a sleeping copy thread is woken where the system does not tell the
/// L2's size (half of a common 1 MiB).
const WAKE_MIN_UNKNOWN_L2: u64 = 512 << 10;

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

/// Copy threads at most, however many cores: past this many, a single copy's jobs are
/// shorter than a wake-up, and the memory's bandwidth is full long before.
const MAX_COPY_THREADS: usize = 8;

/// A copy larger than this many L2s (and than [`MEMORY_BOUND_MIN`]) comes from and goes to
/// the shared cache or memory: its rate is the memory's, shared by every core copying.
const MEMORY_BOUND_L2S: u64 = 4;
/// The least size of a copy bound by the memory, whatever the L2.
const MEMORY_BOUND_MIN: u64 = 4 << 20;
/// How many cores copying fill the memory's bandwidth where it is not measured: one core
/// streams about a quarter of a server socket's bandwidth or more.
const SATURATING_COPIERS_UNKNOWN: usize = 4;

/// A thread copying a large block (one split), or that ended one within this long, is
/// counted as keeping its core busy (`large_copiers`).
pub(super) const BUSY_WINDOW: Duration = Duration::from_millis(1);

/// The copy policy of one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CopyPolicy {
    cores: usize,
    copy_threads: usize,
    plain_share_min: u64,
    /// Copies larger than this are bound by the memory's bandwidth.
    memory_bound_min: u64,
    /// Copiers that fill the memory's bandwidth.
    saturating_copiers: usize,
    /// Split copies above this size wake sleeping copy threads.
    wake_min: u64,
}

impl CopyPolicy {
    /// The policy for `machine`.
    pub(super) fn new(machine: &Machine) -> Self {
        let plain_share_min = plain_share_min(machine.cores, machine.l2, machine.copy_rate);
        Self {
            cores: machine.cores,
            copy_threads: copy_thread_count(machine.cores),
            plain_share_min,
            memory_bound_min: memory_bound_min(machine.l2),
            saturating_copiers: saturating_copiers(machine.memory),
            wake_min: wake_min(plain_share_min, machine.l2, machine.copy_rate),
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
            (copy.length > GATHER_SHARE_MIN && self.cores > 1, GATHER_RUN)
        } else {
            (
                copy.length > self.plain_share_min,
                self.plain_job(copy.length),
            )
        };
        let hand_off = hands_off(copy.length, copy.more_follow, self.copy_threads, polled);
        if !(shared || hand_off) {
            return Plan::Inline;
        }
        let memory_bound = copy.length > self.memory_bound_min;
        let own_bytes = own_bytes(hand_off, copy.caller, memory_bound);
        Plan::Split(Split {
            job,
            own_bytes,
            fits_own: copy.length <= own_bytes,
            memory_bound,
            // A gather's runs are latency-bound: a helper repays its wake-up on all of them.
            wakes: copy.gathered || hand_off || copy.length > self.wake_min,
        })
    }

    /// Whether `split` is copied inline after all, with `other_copiers` other threads that
    /// are copying a large block or ended one within [`BUSY_WINDOW`] and `awake` copy
    /// threads looking for work: where those and this one take every core, or fill the memory's bandwidth with
    /// a copy larger than the caches, a copy thread would only take turns with them; where
    /// every copy thread sleeps and the copy does not repay waking one, the submitting
    /// thread would pay the wake-up and wait for a late helper. So a copy the submitting
    /// thread may make whole it then makes alone.
    pub(super) fn inline_after_all(
        &self,
        split: &Split,
        other_copiers: usize,
        awake: usize,
    ) -> bool {
        let saturated = split.memory_bound && other_copiers + 1 >= self.saturating_copiers;
        let asleep = !split.wakes && awake == 0;
        split.fits_own && (cores_taken(other_copiers, self.cores) || saturated || asleep)
    }

    /// How many copy threads are asked to help with a split copy of `jobs` jobs, with
    /// `other_copiers` other threads copying large blocks and `awake` copy threads looking
    /// for work: all of them, but no more than there are jobs the submitting thread leaves,
    /// nor than cores the other copiers and the submitting thread leave free, nor, on a copy
    /// that does not repay a wake-up, than are awake, nor, on a copy larger than the caches,
    /// than fill the memory's bandwidth beside the others; and at least one (a helper that
    /// finds none left returns at once).
    pub(super) fn helpers(
        &self,
        split: &Split,
        jobs: usize,
        other_copiers: usize,
        awake: usize,
    ) -> usize {
        let submitter_copies = usize::from(split.own_bytes > 0);
        // The submitting thread keeps a core whether or not it copies this one (it copies
        // the next of its batch meanwhile), and so does every other copier: a helper beyond
        // the cores they leave only takes turns with them.
        let free_cores = self.cores.saturating_sub(other_copiers + 1);
        let mut helpers = self
            .copy_threads
            .min(jobs.saturating_sub(submitter_copies))
            .min(free_cores);
        if !split.wakes {
            helpers = helpers.min(awake);
        }
        if split.memory_bound {
            let room = self
                .saturating_copiers
                .saturating_sub(other_copiers + submitter_copies);
            helpers = helpers.min(room);
        }
        helpers.max(1)
    }

    /// The size of the jobs a split plain copy of `len` bytes is cut into: as many as the
    /// submitting thread and every copy thread may take, but none smaller than half the
    /// sharing threshold (a job takes a core a few microseconds at least, more than taking
    /// it costs) and none larger than [`CHUNK`]; at least two halves (page-aligned).
    fn plain_job(&self, len: u64) -> u64 {
        let min_job = (self.plain_share_min / 2).max(4096);
        let takers = self.copy_threads as u64 + 1;
        let pieces = (len / min_job).clamp(2, takers.max(2));
        len.div_ceil(pieces).next_multiple_of(4096).min(CHUNK)
    }
}

/// Whether `other_copiers` threads copying large blocks and this one take every one of
/// `cores`.
pub(super) fn cores_taken(other_copiers: usize, cores: usize) -> bool {
    other_copiers + 1 >= cores
}

/// How many copy threads serve the split copies: one per core beside the submitting
/// thread's (at most [`MAX_COPY_THREADS`]). A copy thread beyond that has no core of its
/// own: it only takes turns with the threads that copy, a third runnable thread on every
/// shared copy of a 2-core machine (woken each time the first let go of the queue, only to
/// find it taken again). Always one, even on one core: a Promise's large copies are handed
/// to it, off the JS thread.
fn copy_thread_count(cores: usize) -> usize {
    cores.saturating_sub(1).clamp(1, MAX_COPY_THREADS)
}

/// What the submitting thread copies itself of a split copy: none of one handed off; of a
/// Promise's, what a JS thread may be kept for; of a polled one larger than the caches,
/// all that no copy thread takes first (the copy threads may all be busy with others' and
/// the memory full: waiting for them would only leave this core idle); of another polled
/// one, [`POLLED_INLINE_COPY_MAX`].
fn own_bytes(hand_off: bool, caller: Caller, memory_bound: bool) -> u64 {
    match (hand_off, caller) {
        (true, _) => 0,
        (false, Caller::Promise) => INLINE_COPY_MAX,
        (false, Caller::Polled) if memory_bound => u64::MAX,
        (false, Caller::Polled) => POLLED_INLINE_COPY_MAX,
    }
}

/// Plain copies above this size are split. A copy is split once it is too large for one
/// core's cache or too long for one core's cache bandwidth, whichever comes first:
/// - above a quarter of a core's L2: below it, source and destination together fit half the
///   L2 and one core copies at cache speed; beyond it, two cores each keep their half in
///   their own L2;
/// - above what one core copies in [`SHARE_COPY_TIME`] at its cache speed: a shorter copy
///   gains less from a second core than the hand-off costs. The size alone does not tell
///   it: a large L2 with a slow core reaches the time well before the size.
///
/// On one core nothing is shared: a copy thread there only takes turns with the copier.
fn plain_share_min(cores: usize, l2: Option<u64>, copy_rate: Option<f64>) -> u64 {
    if cores < 2 {
        return u64::MAX;
    }
    let by_size = l2.map_or(PLAIN_SHARE_MIN_UNKNOWN_L2, |l2| {
        (l2 / 4).clamp(MIN_SHARE_MIN, MAX_SHARE_MIN)
    });
    by_size.min(by_time(copy_rate)).max(MIN_SHARE_MIN)
}

/// The largest power of two one core copies within [`SHARE_COPY_TIME`] at `copy_rate`;
/// no bound where the rate is not a positive number (it tells nothing).
fn by_time(copy_rate: Option<f64>) -> u64 {
    largest_power_of_two_within(copy_rate, SHARE_COPY_TIME)
}

/// The largest power of two one core copies within `time` at `copy_rate`; no bound where
/// the rate is not a positive number (it tells nothing).
fn largest_power_of_two_within(copy_rate: Option<f64>, time: Duration) -> u64 {
    copy_rate
        .filter(|r| r.is_finite() && *r > 0.0)
        .map_or(u64::MAX, |bytes_per_ns| {
            // `as` saturates.
            let bytes = (bytes_per_ns * time.as_nanos() as f64) as u64;
            bytes.checked_ilog2().map_or(0, |log| 1 << log)
        })
}

/// Copies above this size are bound by the memory: beyond [`MEMORY_BOUND_L2S`] L2s, and
/// never below [`MEMORY_BOUND_MIN`].
fn memory_bound_min(l2: Option<u64>) -> u64 {
    l2.map_or(MEMORY_BOUND_MIN, |l2| {
        l2.saturating_mul(MEMORY_BOUND_L2S).max(MEMORY_BOUND_MIN)
    })
}

/// How many cores copying fill the memory's bandwidth: what the measured copiers moved
/// together over what one core moves alone beyond the caches, rounded up, at least two (a
/// copy larger than the caches always may take a second core) and no more than copied
/// (more were not seen to add). [`SATURATING_COPIERS_UNKNOWN`] where it was not measured
/// or either figure is not a positive number.
fn saturating_copiers(memory: Option<MemorySpeed>) -> usize {
    let positive = |r: f64| r.is_finite() && r > 0.0;
    match memory {
        Some(m) if positive(m.one_core) && positive(m.all_cores) => {
            // `as` saturates.
            let fill = ((m.all_cores / m.one_core).ceil() as usize).min(m.copiers);
            fill.max(2)
        }
        _ => SATURATING_COPIERS_UNKNOWN,
    }
}

/// Split copies above this size wake a sleeping copy thread; smaller ones are shared only
/// with one already awake (a stream of shared copies keeps them awake). The threshold,
/// never below the sharing threshold, is the smaller of:
/// - what one core copies in [`WAKE_COPY_TIME`] (the largest power of two within it);
/// - half the L2: beyond it source and destination no longer fit one core's cache, and the
///   submitting thread alone falls to the shared cache's rate, so a late helper still
///   repays its wake-up.
fn wake_min(share_min: u64, l2: Option<u64>, copy_rate: Option<f64>) -> u64 {
    let by_time = largest_power_of_two_within(copy_rate, WAKE_COPY_TIME);
    let by_size = l2.map_or(WAKE_MIN_UNKNOWN_L2, |l2| l2 / 2);
    by_time.min(by_size).max(share_min)
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
            memory: None,
        }
    }

    /// Copy threads looking for work: as many as there are.
    const ALL_AWAKE: usize = usize::MAX;

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

    /// How many threads copy a plain copy of `length` bytes of a lone polled thread with
    /// `others` other threads copying large blocks: 1 inline, else the submitting thread
    /// and its helpers.
    fn copiers(policy: &CopyPolicy, length: u64, others: usize) -> usize {
        match policy.plan(&plain(length, Caller::Polled)) {
            Plan::Inline => 1,
            Plan::Split(s) if policy.inline_after_all(&s, others, ALL_AWAKE) => 1,
            Plan::Split(s) => {
                let jobs = usize::try_from(length.div_ceil(s.job)).expect("jobs");
                1 + policy.helpers(&s, jobs, others, ALL_AWAKE)
            }
        }
    }

    /// The default tebench sweep: 4 KiB to 64 MiB, doubling.
    fn sweep() -> impl Iterator<Item = u64> {
        (12..=26).map(|log| 1u64 << log)
    }

    #[test]
    fn copy_threads_are_one_per_core_beside_the_submitting_thread() {
        // 2 cores: one copy thread, none taking turns with it.
        assert_eq!(copy_thread_count(2), 1);
        assert_eq!(copy_thread_count(4), 3);
        assert_eq!(copy_thread_count(8), 7);
        // Always one, even on one core (a Promise's large copies leave the JS thread).
        assert_eq!(copy_thread_count(1), 1);
        assert_eq!(copy_thread_count(0), 1);
        for cores in [2, 8, 16, 64] {
            let policy = CopyPolicy::new(&machine(cores, Some(2 * MIB), Some(39.0)));
            assert_eq!(policy.copy_threads(), (cores - 1).min(8), "{cores} cores");
        }
    }

    #[test]
    fn copy_threads_are_at_most_eight_whatever_the_cores() {
        assert_eq!(copy_thread_count(9), 8);
        assert_eq!(copy_thread_count(16), 8);
        assert_eq!(copy_thread_count(64), 8);
        assert_eq!(
            CopyPolicy::new(&machine(64, Some(2 * MIB), None)).copy_threads(),
            8
        );
    }

    #[test]
    fn one_threads_megabyte_takes_at_least_four_cores_on_eight_or_more() {
        // A lone thread's 1 MiB copy is cut for the idle cores: at least four copy it, so
        // it runs at twice one core's memcpy or more.
        for cores in [8, 16, 64] {
            for (l2, rate) in [
                (Some(2 * MIB), Some(39.0)),
                (Some(MIB), Some(95.0)),
                (None, None),
            ] {
                let policy = CopyPolicy::new(&machine(cores, l2, rate));
                let s = split(policy.plan(&plain(MIB, Caller::Polled)));
                let jobs = usize::try_from(MIB.div_ceil(s.job)).expect("jobs");
                assert!(jobs >= 4, "{cores} cores {l2:?} {rate:?}: {jobs} jobs");
                assert!(
                    copiers(&policy, MIB, 0) >= 4,
                    "{cores} cores {l2:?} {rate:?}"
                );
                // Even with every copy thread asleep: 1 MiB repays waking them.
                assert!(
                    copiers_with(&policy, MIB, 0) >= 4,
                    "{cores} cores {l2:?} {rate:?} asleep"
                );
                assert!(!policy.inline_after_all(&s, 0, ALL_AWAKE));
            }
        }
        // 2 cores: halves, as before.
        let two = CopyPolicy::new(&machine(2, Some(2 * MIB), Some(39.0)));
        assert_eq!(split(two.plan(&plain(MIB, Caller::Polled))).job, CHUNK);
        assert_eq!(copiers(&two, MIB, 0), 2);
    }

    #[test]
    fn jobs_are_no_smaller_than_half_the_threshold() {
        // 16 cores, threshold 128 KiB: a copy just above it is halved, not cut in 9.
        let sixteen = CopyPolicy::new(&machine(16, Some(2 * MIB), Some(39.0)));
        assert_eq!(sixteen.plain_share_min(), 128 * KIB);
        assert_eq!(sixteen.plain_job(128 * KIB + 4096), 68 * KIB);
        assert_eq!(sixteen.plain_job(256 * KIB), 64 * KIB);
        // As many as the cores take, then chunks.
        assert_eq!(sixteen.plain_job(MIB), 116 * KIB);
        assert_eq!(sixteen.plain_job(64 * MIB), CHUNK);
        for len in sweep() {
            let job = sixteen.plain_job(len);
            assert!(job >= 64 * KIB || len < 128 * KIB, "{len}: {job}");
            assert!(job <= CHUNK && job % 4096 == 0, "{len}: {job}");
        }
    }

    /// A machine whose memory was measured: `one_core` bytes/ns alone beyond the caches,
    /// `all_cores` with `copiers` copying together.
    fn measured(cores: usize, one_core: f64, all_cores: f64, copiers: usize) -> Machine {
        Machine {
            memory: Some(MemorySpeed {
                one_core,
                all_cores,
                copiers,
            }),
            ..machine(cores, Some(2 * MIB), Some(25.0))
        }
    }

    #[test]
    fn copiers_stop_where_the_memory_bandwidth_is_full() {
        // 16 cores, one core copying 12 bytes/ns beyond the caches, nine together 47: four
        // fill the memory. A lone 16 MiB copy takes four cores, not nine.
        let policy = CopyPolicy::new(&measured(16, 12.0, 47.0, 9));
        assert_eq!(copiers(&policy, 16 * MIB, 0), 4);
        assert_eq!(copiers(&policy, 64 * MIB, 0), 4);
        // Beside others copying large blocks, only what is left of the four; with three or
        // more others the submitting thread copies alone: no copy thread taking turns with
        // theirs, so 16 MiB does not fall from 4 threads to 8.
        assert_eq!(copiers(&policy, 16 * MIB, 1), 3);
        for others in [3, 7, 15] {
            assert_eq!(copiers(&policy, 16 * MIB, others), 1, "{others} others");
            assert_eq!(copiers(&policy, 64 * MIB, others), 1, "{others} others");
        }
        // A copy within the caches still takes the idle cores.
        assert!(copiers(&policy, MIB, 0) >= 4);
        // A memory that nine copiers do not fill: all of them.
        let wide = CopyPolicy::new(&measured(16, 12.0, 9.0 * 12.0, 9));
        assert_eq!(copiers(&wide, 16 * MIB, 0), 9);
        // Bandwidth not measured (yet): four copiers in all.
        let estimated = CopyPolicy::new(&machine(16, Some(2 * MIB), Some(25.0)));
        assert_eq!(copiers(&estimated, 16 * MIB, 0), 4);
        assert_eq!(copiers(&estimated, 16 * MIB, 1), 3);
        assert_eq!(copiers(&estimated, 16 * MIB, 3), 1);
        assert_eq!(copiers(&estimated, 16 * MIB, 7), 1);
        // 64 cores: the same cap, whatever the copy threads.
        let sixty_four = CopyPolicy::new(&machine(64, None, None));
        assert_eq!(copiers(&sixty_four, 64 * MIB, 0), 4);
        assert_eq!(copiers(&sixty_four, 64 * MIB, 3), 1);
    }

    #[test]
    fn the_measured_bandwidth_sets_the_copiers_on_every_machine() {
        // (cores, one core alone, all together, copiers measured) → copiers that fill it.
        let cases = [
            (8, 10.0, 20.0, 8, 2),
            (8, 10.0, 35.0, 8, 4),
            (16, 12.0, 47.0, 9, 4),
            (16, 12.0, 200.0, 9, 9),
            (64, 20.0, 130.0, 9, 7),
            (64, 20.0, 10.0, 9, 2),
        ];
        for (cores, one, all, copied, fill) in cases {
            let policy = CopyPolicy::new(&measured(cores, one, all, copied));
            let lone = copiers(&policy, 64 * MIB, 0);
            assert_eq!(lone, fill, "{cores} cores {one} {all}");
            // No more copiers than fill it, whoever copies: the others and this one's.
            for others in 0..16 {
                let now = copiers(&policy, 64 * MIB, others);
                assert!(
                    now == 1 || others + now <= fill,
                    "{cores} cores, {others} others: {now}"
                );
            }
        }
        // Two cores, whatever the memory: a copy larger than the caches takes both.
        for (one, all) in [(10.0, 10.0), (10.0, 40.0)] {
            let two = CopyPolicy::new(&measured(2, one, all, 2));
            assert_eq!(copiers(&two, 64 * MIB, 0), 2);
            assert_eq!(copiers(&two, 64 * MIB, 1), 1);
        }
    }

    #[test]
    fn copies_larger_than_the_caches_are_bound_by_memory() {
        assert_eq!(memory_bound_min(Some(2 * MIB)), 8 * MIB);
        assert_eq!(memory_bound_min(Some(512 * KIB)), 4 * MIB);
        assert_eq!(memory_bound_min(None), 4 * MIB);
        assert_eq!(memory_bound_min(Some(u64::MAX)), u64::MAX);
        let speed = |one_core, all_cores, copiers| {
            Some(MemorySpeed {
                one_core,
                all_cores,
                copiers,
            })
        };
        assert_eq!(saturating_copiers(speed(12.0, 47.0, 9)), 4);
        assert_eq!(saturating_copiers(speed(12.0, 48.0, 9)), 4);
        assert_eq!(saturating_copiers(speed(12.0, 48.1, 9)), 5);
        // Never more than measured together, never fewer than two.
        assert_eq!(saturating_copiers(speed(10.0, 200.0, 9)), 9);
        assert_eq!(saturating_copiers(speed(25.0, 10.0, 9)), 2);
        assert_eq!(saturating_copiers(None), 4);
        for nonsense in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(saturating_copiers(speed(nonsense, 47.0, 9)), 4);
            assert_eq!(saturating_copiers(speed(12.0, nonsense, 9)), 4);
        }
    }

    /// How many threads copy a lone polled thread's plain copy of `length` bytes with
    /// `awake` copy threads looking for work (none other copying).
    fn copiers_with(policy: &CopyPolicy, length: u64, awake: usize) -> usize {
        match policy.plan(&plain(length, Caller::Polled)) {
            Plan::Inline => 1,
            Plan::Split(s) if policy.inline_after_all(&s, 0, awake) => 1,
            Plan::Split(s) => {
                let jobs = usize::try_from(length.div_ceil(s.job)).expect("jobs");
                1 + policy.helpers(&s, jobs, 0, awake)
            }
        }
    }

    #[test]
    fn a_sleeping_copy_thread_is_woken_only_for_copies_that_repay_it() {
        // 2 cores, 1 MiB L2s, a core copying 137 bytes/ns within them (this VM): shared
        // above 256 KiB; a sleeping copy thread is woken above 512 KiB only, where source
        // and destination leave the L2 (one core would copy 2 MiB in 20 µs).
        let two = CopyPolicy::new(&machine(2, Some(MIB), Some(137.0)));
        assert_eq!(two.plain_share_min(), 256 * KIB);
        assert_eq!(copiers_with(&two, 512 * KIB, 0), 1);
        assert_eq!(copiers_with(&two, 512 * KIB, 1), 2);
        assert_eq!(copiers_with(&two, 512 * KIB + 4096, 0), 2);
        assert_eq!(copiers_with(&two, MIB, 0), 2);
        // A Xeon with 2 MiB L2s, 39 bytes/ns: shared above 128 KiB with a copy thread
        // awake, woken above 512 KiB (what it copies in 20 µs).
        let xeon = CopyPolicy::new(&machine(16, Some(2 * MIB), Some(39.0)));
        assert_eq!(copiers_with(&xeon, 256 * KIB, 0), 1);
        assert!(copiers_with(&xeon, 256 * KIB, 1) == 2);
        assert_eq!(copiers_with(&xeon, 512 * KIB, 0), 1);
        assert!(copiers_with(&xeon, MIB, 0) >= 4);
        // Below a wake-up's worth, only the copy threads awake help.
        assert_eq!(copiers_with(&xeon, 512 * KIB, 2), 3);
        // Gathers and hand-offs wake them whatever their size.
        let gather = CopyRequest {
            gathered: true,
            ..plain(256 * KIB, Caller::Polled)
        };
        assert!(!xeon.inline_after_all(&split(xeon.plan(&gather)), 0, 0));
        let batch = CopyRequest {
            more_follow: true,
            ..plain(384 * KIB, Caller::Polled)
        };
        assert!(!xeon.inline_after_all(&split(xeon.plan(&batch)), 0, 0));
    }

    #[test]
    fn the_wake_threshold_follows_the_machine() {
        // (share threshold, L2, rate) → wake threshold: never below the sharing threshold;
        // the smaller of half the L2 and what one core copies in 20 µs.
        assert_eq!(wake_min(256 * KIB, Some(MIB), Some(137.0)), 512 * KIB);
        assert_eq!(wake_min(128 * KIB, Some(2 * MIB), Some(39.0)), 512 * KIB);
        assert_eq!(wake_min(128 * KIB, Some(2 * MIB), Some(25.0)), 256 * KIB);
        assert_eq!(wake_min(256 * KIB, Some(MIB), Some(95.0)), 512 * KIB);
        assert_eq!(wake_min(128 * KIB, None, None), 512 * KIB);
        assert_eq!(wake_min(128 * KIB, None, Some(39.0)), 512 * KIB);
        assert_eq!(wake_min(512 * KIB, Some(256 * KIB), Some(1.0)), 512 * KIB);
        // One core shares nothing, so wakes nothing.
        let one = CopyPolicy::new(&machine(1, Some(MIB), Some(39.0)));
        assert_eq!(one.plain_share_min(), u64::MAX);
    }

    #[test]
    fn a_lone_thread_never_gets_fewer_copiers_for_a_larger_copy_within_the_caches() {
        // No step down along the sweep (a dip's cause) until the memory bounds the copy.
        for cores in [2, 8, 16, 64] {
            for (l2, rate) in [
                (Some(2 * MIB), Some(39.0)),
                (Some(MIB), Some(95.0)),
                (None, None),
            ] {
                let policy = CopyPolicy::new(&machine(cores, l2, rate));
                for awake in [0, 1, ALL_AWAKE] {
                    let mut last = 1;
                    for len in sweep().filter(|&len| len <= memory_bound_min(l2)) {
                        let now = copiers_with(&policy, len, awake);
                        assert!(
                            now >= last,
                            "{cores} cores {l2:?} {awake} awake: {len} takes {now} < {last}"
                        );
                        last = now;
                    }
                }
            }
        }
    }

    #[test]
    fn one_core_shares_nothing() {
        let one = CopyPolicy::new(&machine(1, Some(MIB), Some(39.0)));
        assert_eq!(one.plain_share_min(), u64::MAX);
        for len in sweep() {
            assert_eq!(one.plan(&plain(len, Caller::Polled)), Plan::Inline);
            let gather = CopyRequest {
                gathered: true,
                ..plain(len, Caller::Polled)
            };
            assert_eq!(one.plan(&gather), Plan::Inline);
        }
        // A Promise's batch still leaves the JS thread.
        let batch = CopyRequest {
            more_follow: true,
            ..plain(MIB, Caller::Promise)
        };
        assert!(handed_off(&split(one.plan(&batch))));
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
    fn plain_copies_on_two_cores_are_halved_up_to_two_chunks_then_cut_in_chunks() {
        let two = CopyPolicy::new(&machine(2, Some(MIB), Some(95.0)));
        assert_eq!(two.plain_job(256 << 10), 128 << 10);
        assert_eq!(two.plain_job((256 << 10) + 1), (128 << 10) + 4096);
        assert_eq!(two.plain_job(1 << 20), CHUNK);
        assert_eq!(two.plain_job(8 << 20), CHUNK);
    }

    #[test]
    fn copies_are_shared_above_a_quarter_of_the_l2() {
        let share_min = |l2| plain_share_min(2, l2, None);
        assert_eq!(share_min(Some(512 << 10)), 128 << 10);
        assert_eq!(share_min(Some(1 << 20)), 256 << 10);
        assert_eq!(share_min(Some(2 << 20)), 512 << 10);
        // Bounded either way, and a default where the size is unknown.
        assert_eq!(share_min(Some(32 << 10)), 64 << 10);
        assert_eq!(share_min(Some(64 << 20)), 1 << 20);
        assert_eq!(share_min(None), PLAIN_SHARE_MIN_UNKNOWN_L2);
    }

    #[test]
    fn copies_are_shared_above_what_a_core_copies_in_six_microseconds() {
        let share_min = |l2, rate| plain_share_min(16, l2, rate);
        // The machines measured (bytes per ns within the L2): a Xeon with 2 MiB L2s shares
        // above 128 KiB where the L2's size alone said 512 KiB, whether its probe reads
        // 25 or 40; a Zen 5 core, fast enough to copy 256 KiB alone, keeps the L2's
        // threshold; so does a Zen 3.
        assert_eq!(share_min(Some(2 << 20), Some(39.0)), 128 << 10);
        assert_eq!(share_min(Some(2 << 20), Some(25.0)), 128 << 10);
        assert_eq!(share_min(Some(2 << 20), Some(44.0)), 256 << 10);
        assert_eq!(share_min(Some(1 << 20), Some(95.0)), 256 << 10);
        assert_eq!(share_min(Some(512 << 10), Some(35.0)), 128 << 10);
        // Whatever the rate, never below 64 KiB; a rate that is no positive number counts
        // as none; unknown L2 and a fast core: the default.
        assert_eq!(share_min(Some(2 << 20), Some(1.0)), 64 << 10);
        for nonsense in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(share_min(Some(2 << 20), Some(nonsense)), 512 << 10);
        }
        assert_eq!(share_min(None, Some(1e6)), PLAIN_SHARE_MIN_UNKNOWN_L2);
    }

    #[test]
    fn the_rate_threshold_is_a_power_of_two_at_its_edges() {
        let share_min = |l2, rate| plain_share_min(2, l2, rate);
        // 256 KiB in 6 µs is 43.69 bytes per ns: a core a hair faster shares above
        // 256 KiB, a hair slower above 128 KiB.
        assert_eq!(share_min(Some(64 * MIB), Some(43.7)), 256 * KIB);
        assert_eq!(share_min(Some(64 * MIB), Some(43.6)), 128 * KIB);
        // A quarter of the L2 at its clamp edges.
        assert_eq!(share_min(Some(256 * KIB), None), 64 * KIB);
        assert_eq!(share_min(Some(256 * KIB + 4), None), 64 * KIB + 1);
        assert_eq!(share_min(Some(4 * MIB), None), MIB);
        assert_eq!(share_min(Some(4 * MIB + 4), None), MIB);
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
        // Promise's; all of a polled copy larger than the caches.
        let polled = split(policy.plan(&plain(MIB, Caller::Polled)));
        let promised = split(policy.plan(&plain(MIB, Caller::Promise)));
        assert_eq!((polled.own_bytes, promised.own_bytes), (8 * MIB, MIB));
        assert_eq!((polled.job, promised.job), (CHUNK, CHUNK));
        let large = split(policy.plan(&plain(16 * MIB, Caller::Polled)));
        assert_eq!(large.own_bytes, u64::MAX);
        let large = split(policy.plan(&plain(16 * MIB, Caller::Promise)));
        assert_eq!(large.own_bytes, MIB);
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
        // 16 cores, several copy threads: handed off either way, above 256 KiB only.
        let sixteen = CopyPolicy::new(&machine(16, Some(2 * MIB), None));
        assert_eq!(sixteen.copy_threads(), 8);
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
        assert!(!two.inline_after_all(&promised, 0, ALL_AWAKE));
        assert!(two.inline_after_all(&promised, 1, ALL_AWAKE));
        // A copy above what the submitting thread copies itself is split anyway.
        let larger = split(two.plan(&plain(mb(1) + 1, Caller::Promise)));
        assert!(!two.inline_after_all(&larger, 1, ALL_AWAKE));
        let polled = split(two.plan(&plain(mb(4), Caller::Polled)));
        assert!(two.inline_after_all(&polled, 1, ALL_AWAKE));
        // A handed-off copy is never made inline.
        let handed = split(two.plan(&CopyRequest {
            more_follow: true,
            ..plain(mb(1), Caller::Promise)
        }));
        assert!(!two.inline_after_all(&handed, 100, ALL_AWAKE));
        // 16 cores: only fifteen others take every core.
        let sixteen = CopyPolicy::new(&machine(16, Some(MIB), None));
        let s = split(sixteen.plan(&plain(mb(1), Caller::Promise)));
        assert!(!sixteen.inline_after_all(&s, 14, ALL_AWAKE));
        assert!(sixteen.inline_after_all(&s, 15, ALL_AWAKE));
        // One core: a Promise's batch copy is handed off, never made inline.
        let one = CopyPolicy::new(&machine(1, Some(MIB), None));
        let batch = split(one.plan(&CopyRequest {
            more_follow: true,
            ..plain(mb(1), Caller::Promise)
        }));
        assert!(!one.inline_after_all(&batch, 0, ALL_AWAKE));
    }

    #[test]
    fn helpers_are_the_copy_threads_up_to_the_jobs_the_submitting_thread_leaves() {
        let sixty_four = CopyPolicy::new(&machine(64, None, None));
        assert_eq!(sixty_four.copy_threads(), 8);
        let shared = split(sixty_four.plan(&plain(MIB, Caller::Polled)));
        assert_eq!(sixty_four.helpers(&shared, 2, 0, ALL_AWAKE), 1);
        assert_eq!(sixty_four.helpers(&shared, 100, 0, ALL_AWAKE), 8);
        assert_eq!(sixty_four.helpers(&shared, 0, 0, ALL_AWAKE), 1);
        let handed = split(sixty_four.plan(&CopyRequest {
            more_follow: true,
            ..plain(MIB, Caller::Polled)
        }));
        assert_eq!(sixty_four.helpers(&handed, 2, 0, ALL_AWAKE), 2);
        let two = CopyPolicy::new(&machine(2, None, None));
        let shared = split(two.plan(&plain(MIB, Caller::Polled)));
        assert_eq!(two.helpers(&shared, 16, 0, ALL_AWAKE), 1);
    }

    #[test]
    fn helpers_take_no_more_cores_than_the_other_copiers_leave_free() {
        // 16 cores, 8 copy threads, a 4 MiB copy within the caches cut in 9 jobs: alone it
        // takes every copy thread; beside 11 other threads copying large blocks, the 4 cores
        // they and this thread leave take 4 helpers; beside 14, one helper.
        let sixteen = CopyPolicy::new(&machine(16, Some(2 * MIB), Some(39.0)));
        assert_eq!(copiers(&sixteen, 4 * MIB, 0), 9);
        assert_eq!(copiers(&sixteen, 4 * MIB, 11), 5);
        assert_eq!(copiers(&sixteen, 4 * MIB, 14), 2);
        assert_eq!(copiers(&sixteen, 4 * MIB, 15), 1);
        // On every machine, a copy takes only free cores (or, with none, its own alone).
        for cores in [2, 4, 8, 16, 64] {
            for (l2, rate) in [
                (Some(2 * MIB), Some(39.0)),
                (Some(MIB), Some(137.0)),
                (None, None),
            ] {
                let policy = CopyPolicy::new(&machine(cores, l2, rate));
                for others in 0..cores + 2 {
                    for len in sweep() {
                        let now = copiers(&policy, len, others);
                        assert!(
                            now == 1 || others + now <= cores,
                            "{cores} cores {l2:?} {rate:?}, {others} others: {len} takes {now}"
                        );
                    }
                }
            }
        }
        // A lone thread's copy still takes the idle cores.
        assert!(copiers(&sixteen, MIB, 0) >= 4);
    }

    #[test]
    fn thresholds_follow_the_machine() {
        // (cores, L2, rate) → (plain threshold, copy threads).
        let cases = [
            (2, Some(512 * KIB), Some(35.0), 128 * KIB, 1),
            (2, Some(2 * MIB), Some(39.0), 128 * KIB, 1),
            (8, Some(2 * MIB), Some(39.0), 128 * KIB, 7),
            (16, Some(MIB), Some(95.0), 256 * KIB, 8),
            (16, Some(2 * MIB), None, 512 * KIB, 8),
            (64, Some(64 * MIB), None, MIB, 8),
            (64, None, Some(200.0), 128 * KIB, 8),
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
