//! How fast copies go beyond the caches, measured once per process: what one core copies
//! alone, and what every core a copy may take copies together. The copy plan reads the two
//! (`copy_plan::MemorySpeed`) to stop adding copiers to a copy larger than the caches once
//! the memory's bandwidth is full: more only take turns with those that fill it.
//!
//! The probe runs on a thread of its own, started by the first shm transport of a process
//! ([`start_probe`]), so that creating an engine waits for none of it (the start costs a
//! thread spawn); until it lands the plan takes an estimate. It copies blocks that together
//! exceed the last-level cache twice over ([`probe_block`]): each copier touches its own
//! (its pages faulted in beforehand, on its own core), the probe thread then times one
//! block copied alone, from memory (the copiers' blocks, touched after its own, pushed it
//! out of the caches), and then every copier copies its block at once: the bandwidth is
//! what they all copied by the time the first finished. A copier that starts late (its
//! core busy) counts for what it copied while the others ran, so on a loaded machine the
//! figure is what its free cores fill: fewer copiers, never more than fill it.
//!
//! A machine where a copy takes at most two cores needs no probe: the plan always lets a
//! copy larger than the caches take a second core.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use super::copy_plan::MemorySpeed;

/// The least block a copier copies: beyond any core's L2 twice over.
const MIN_BLOCK: u64 = 4 << 20;
/// All copiers' blocks together (sources and destinations) stay within this, whatever the
/// last-level cache: a larger cache leaves part of the blocks in it, and the bandwidth read
/// errs high by that part.
const MAX_FOOTPRINT: u64 = 256 << 20;
/// The last-level cache taken where the system does not say.
const L3_UNKNOWN: u64 = 32 << 20;
/// The pieces a copier copies its block in, counting each as it is done.
const PIECE: usize = 256 << 10;
/// How long the probe thread and the copiers wait for each other at most: past it the probe
/// gives up (a machine too loaded to measure; the estimate stays).
const RENDEZVOUS: Duration = Duration::from_secs(2);

static MEASURED: OnceLock<MemorySpeed> = OnceLock::new();
static STARTED: Once = Once::new();

/// The memory's speed, once the probe measured it; `None` before, or where it could not.
pub(super) fn measured() -> Option<MemorySpeed> {
    MEASURED.get().copied()
}

/// Starts the probe for `copiers` cores copying at once, with a last-level cache of `l3`
/// bytes, on a thread of its own; once per process (later calls do nothing), and not at
/// all where [`probe_block`] says it tells nothing.
pub(super) fn start_probe(copiers: usize, l3: Option<u64>) {
    let Some(block) = probe_block(copiers, l3) else {
        return;
    };
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("ferry-shm-probe".into())
            .spawn(move || {
                if let Some(speed) = probe(copiers, block) {
                    tracing::debug!(
                        one_core_bytes_per_ns = speed.one_core,
                        all_cores_bytes_per_ns = speed.all_cores,
                        copiers,
                        block,
                        "shm: memory copy speed measured"
                    );
                    let _ = MEASURED.set(speed);
                }
            });
        // No thread: the estimate stays.
        drop(spawned);
    });
}

/// The bytes each of `copiers` copies in the probe: enough that all of them, sources and
/// destinations, exceed the last-level cache (`l3`) twice, at least [`MIN_BLOCK`], within
/// [`MAX_FOOTPRINT`] together. `None` where copies take at most two cores: the plan needs
/// no figure there.
pub(super) fn probe_block(copiers: usize, l3: Option<u64>) -> Option<usize> {
    if copiers <= 2 {
        return None;
    }
    let n = copiers as u64;
    let block = (l3.unwrap_or(L3_UNKNOWN) / n)
        .max(MIN_BLOCK)
        .min(MAX_FOOTPRINT / (2 * n))
        .next_multiple_of(4096);
    usize::try_from(block).ok()
}

/// A block of `len` bytes, every page written (faulted in); `None` where memory ran out.
fn touched(len: usize, byte: u8) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.resize(len, byte);
    Some(v)
}

/// Bytes per nanosecond of `bytes` copied in `took`; `None` for a clock that did not move.
fn rate(bytes: u64, took: Duration) -> Option<f64> {
    (!took.is_zero()).then(|| bytes as f64 / took.as_nanos() as f64)
}

/// Measures the memory's speed with `copiers` copiers of `block` bytes each (see the
/// module's words); `None` where memory or a thread ran out, or the copiers did not meet
/// within [`RENDEZVOUS`].
pub(super) fn probe(copiers: usize, block: usize) -> Option<MemorySpeed> {
    let mut own_src = touched(block, 0x5a)?;
    let mut own_dst = touched(block, 0)?;
    // Copiers ready (blocks touched) or failed; the go (or give up) for their copies, and
    // when it was given (nanoseconds after `epoch`); each copier's bytes copied so far;
    // the first to finish: when, and the bytes all had copied by then.
    let ready = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let go = AtomicBool::new(false);
    let epoch = Instant::now();
    let go_at = AtomicU64::new(0);
    let progress: Vec<AtomicU64> = (0..copiers).map(|_| AtomicU64::new(0)).collect();
    let first_done: OnceLock<(u64, u64)> = OnceLock::new();
    let wait = |until: Instant, done: &dyn Fn() -> bool| {
        while !done() {
            if Instant::now() >= until {
                return false;
            }
            std::thread::yield_now();
        }
        true
    };
    let one_core = std::thread::scope(|s| {
        let mut spawned = 0;
        for mine in &progress {
            let (ready, failed, go, go_at) = (&ready, &failed, &go, &go_at);
            let (progress, first_done) = (&progress, &first_done);
            let copier = move || {
                let blocks = touched(block, 0x5a).zip(touched(block, 0));
                if blocks.is_none() {
                    failed.store(true, Ordering::Relaxed);
                }
                ready.fetch_add(1, Ordering::Release);
                let started = wait(Instant::now() + RENDEZVOUS, &|| go.load(Ordering::Acquire));
                let (true, Some((src, mut dst))) = (started, blocks) else {
                    return;
                };
                // In pieces, each counted as it is done: a copier that started late (its
                // core busy) counts for what it copied while the others ran.
                for (from, to) in src.chunks(PIECE).zip(dst.chunks_mut(PIECE)) {
                    to.copy_from_slice(from);
                    mine.fetch_add(from.len() as u64, Ordering::Relaxed);
                }
                std::hint::black_box(&mut dst);
                first_done.get_or_init(|| {
                    let took = nanos(epoch.elapsed()).saturating_sub(go_at.load(Ordering::Relaxed));
                    let copied = progress.iter().map(|p| p.load(Ordering::Relaxed)).sum();
                    (took, copied)
                });
            };
            match std::thread::Builder::new()
                .name("ferry-shm-probe-copier".into())
                .spawn_scoped(s, copier)
            {
                Ok(_) => spawned += 1,
                Err(_) => {
                    failed.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
        let met = wait(Instant::now() + RENDEZVOUS, &|| {
            ready.load(Ordering::Acquire) == spawned
        });
        // This thread's block, touched before the copiers' and pushed out of the caches by
        // them, copied alone.
        let one_core = (met && !failed.load(Ordering::Relaxed)).then(|| {
            let started = Instant::now();
            own_dst.copy_from_slice(&own_src);
            std::hint::black_box(&mut own_dst);
            rate(block as u64, started.elapsed())
        });
        // Let go either way: a copier that did not see the go within its wait copies nothing.
        go_at.store(nanos(epoch.elapsed()), Ordering::Relaxed);
        go.store(true, Ordering::Release);
        one_core.flatten()
    })?;
    own_src.clear();
    let (took, copied) = first_done.get()?;
    let all_cores = rate(*copied, Duration::from_nanos(*took))?;
    reading(one_core, all_cores, copiers)
}

/// The speed read: `None` where the copiers together moved less than one core alone, which
/// says they did not get their cores (a loaded machine), not what the memory does; the
/// plan then keeps its estimate rather than hold every large copy to two cores for the
/// process's life.
fn reading(one_core: f64, all_cores: f64, copiers: usize) -> Option<MemorySpeed> {
    (all_cores >= one_core).then_some(MemorySpeed {
        one_core,
        all_cores,
        copiers,
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn blocks_exceed_the_last_level_cache_twice_within_the_footprint() {
        // Two copiers or fewer: no probe (a copy may always take a second core).
        for copiers in [0, 1, 2] {
            assert_eq!(probe_block(copiers, Some(32 * MIB)), None);
        }
        let block = |copiers, l3| probe_block(copiers, l3).expect("a block") as u64;
        // 32 MiB of L3 over 4 copiers: 8 MiB each, 64 MiB in all.
        assert_eq!(block(4, Some(32 * MIB)), 8 * MIB);
        // Small caches: never below 4 MiB.
        assert_eq!(block(9, Some(8 * MIB)), 4 * MIB);
        assert_eq!(block(9, None), 4 * MIB);
        // A huge cache: the footprint's bound (256 MiB over 9 sources and 9 destinations).
        let capped = block(9, Some(384 * MIB));
        assert!(2 * 9 * capped <= MAX_FOOTPRINT + 2 * 9 * 4096, "{capped}");
        assert_eq!(capped % 4096, 0);
        for copiers in 3..=9 {
            for l3 in [None, Some(MIB), Some(32 * MIB), Some(u64::MAX)] {
                let b = block(copiers, l3);
                assert!(2 * copiers as u64 * b <= MAX_FOOTPRINT + 2 * 9 * 4096);
                assert!(b >= MIN_BLOCK.min(MAX_FOOTPRINT / (2 * copiers as u64)));
            }
        }
    }

    #[test]
    fn the_probe_reads_plausible_rates_on_this_machine() {
        // Small blocks, so the test stays cheap: the rates then are partly the caches'. A
        // figure read is a measured one; none where this machine's load kept the copiers
        // from their cores (`reading`).
        ferry_testkit::within(Duration::from_secs(30), "memory probe", || {
            if let Some(speed) = probe(3, (2 * MIB) as usize) {
                assert_eq!(speed.copiers, 3);
                assert!(speed.all_cores >= speed.one_core, "{speed:?}");
                for r in [speed.one_core, speed.all_cores] {
                    assert!((0.1..2000.0).contains(&r), "{speed:?}");
                }
            }
        });
    }

    #[test]
    fn copiers_slower_together_than_one_alone_tell_nothing() {
        assert_eq!(reading(12.0, 5.0, 9), None);
        let speed = reading(12.0, 47.0, 9).expect("a reading");
        assert_eq!(
            (speed.one_core, speed.all_cores, speed.copiers),
            (12.0, 47.0, 9)
        );
        assert!(reading(12.0, 12.0, 3).is_some());
    }

    #[test]
    fn rate_is_bytes_per_nanosecond_and_none_for_no_time() {
        assert_eq!(rate(4096, Duration::from_nanos(128)), Some(32.0));
        assert_eq!(rate(4096, Duration::ZERO), None);
    }
}
