//! Which submitting threads copied a block large enough to split lately: what the copy
//! plan reads to tell whether a core is free for a copy thread
//! (`CopyPolicy::inline_after_all`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::copy_plan::BUSY_WINDOW;
use crate::lanes::{self, Striped};

/// One word per lane, each written by its own lane's threads only (`lanes.rs`): a time,
/// and whether the lane's thread is copying now.
pub(super) struct LargeCopiers {
    epoch: Instant,
    /// Nanoseconds after `epoch` of each lane's latest large copy, shifted left by one,
    /// the low bit set while that copy runs (0: none yet).
    last: Striped<AtomicU64>,
}

/// The low bit of a lane's word: its large copy runs now.
const COPYING: u64 = 1;

/// A large copy of the calling thread's lane, counted as running until this is dropped.
pub(super) struct Copying<'a> {
    copiers: &'a LargeCopiers,
    lane: usize,
}

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.copiers.ended(self.lane, self.copiers.now());
    }
}

impl LargeCopiers {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last: Striped::default(),
        }
    }

    /// Nanoseconds since `epoch`, never 0 (which stands for "none yet").
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX >> 1)
            .clamp(1, u64::MAX >> 1)
    }

    /// Records a large copy of the calling thread, running until the guard returned is
    /// dropped; how many threads of other lanes are making one or ended one within
    /// [`BUSY_WINDOW`].
    ///
    /// A copy counts while it runs, not only for a window after it began: a 16 MiB copy
    /// takes longer than the window, and a thread that planned while another was in the
    /// middle of one counted no other copier, split its own copy and woke copy threads
    /// for cores both submitting threads held (2 threads reading 16 and 32 MiB: 73 and
    /// 83 % of the copies split so, each with no other copier counted).
    pub(super) fn others_copying(&self) -> (usize, Copying<'_>) {
        let me = lanes::current();
        let others = self.note(me, self.now());
        (
            others,
            Copying {
                copiers: self,
                lane: me,
            },
        )
    }

    /// The count of [`LargeCopiers::others_copying`] for a copy of lane `me` starting at
    /// `now`.
    fn note(&self, me: usize, now: u64) -> usize {
        self.last
            .lane(me)
            .store(now << 1 | COPYING, Ordering::Relaxed);
        let window = BUSY_WINDOW.as_nanos() as u64;
        (0..lanes::LANES)
            .filter(|&lane| lane != me)
            .filter(|&lane| {
                let word = self.last.lane(lane).load(Ordering::Relaxed);
                word & COPYING != 0 || (word != 0 && now.saturating_sub(word >> 1) < window)
            })
            .count()
    }

    /// Lane `lane`'s copy ended at `now`: it counts for [`BUSY_WINDOW`] more.
    fn ended(&self, lane: usize, now: u64) {
        self.last.lane(lane).store(now << 1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transports::shm::copy_plan::cores_taken;

    #[test]
    fn copy_threads_help_only_while_other_lanes_leave_a_core_free() {
        let c = LargeCopiers::new();
        let ms = 1_000_000;
        // Each copy here ends as it begins: only the window after it counts.
        let copy = |lane: usize, at: u64| {
            let others = c.note(lane, at);
            c.ended(lane, at);
            others
        };
        // Alone: the other core is free.
        assert!(!cores_taken(copy(0, 10 * ms), 2));
        // A second lane copying within the window: both cores are taken, for either.
        assert!(cores_taken(copy(1, 10 * ms + 10_000), 2));
        assert!(cores_taken(copy(0, 10 * ms + 20_000), 2));
        // Three cores: two copiers still leave one.
        assert!(!cores_taken(copy(0, 10 * ms + 30_000), 3));
        // The other lane went quiet for longer than the window.
        assert!(!cores_taken(copy(0, 12 * ms), 2));
        // The same lane again never counts as another.
        assert!(!cores_taken(copy(0, 12 * ms + 1), 2));
    }

    #[test]
    fn a_copy_longer_than_the_window_counts_until_it_ends_and_for_the_window_after() {
        let c = LargeCopiers::new();
        let ms = 1_000_000;
        // Lane 1 starts a copy that runs 3 ms, longer than the window.
        c.note(1, 10 * ms);
        // Lane 0 plans 2 ms into it: lane 1 still holds its core.
        assert_eq!(c.note(0, 12 * ms), 1);
        c.ended(0, 12 * ms);
        // Lane 1 ends at 13 ms: counted for the window after, then no more.
        c.ended(1, 13 * ms);
        assert_eq!(c.note(0, 13 * ms + ms / 2), 1);
        c.ended(0, 13 * ms + ms / 2);
        assert_eq!(c.note(0, 15 * ms), 0);
    }

    #[test]
    fn the_guard_marks_the_copy_ended_when_dropped() {
        let c = LargeCopiers::new();
        let me = lanes::current();
        let (_, copying) = c.others_copying();
        assert_ne!(c.last.lane(me).load(Ordering::Relaxed) & COPYING, 0);
        drop(copying);
        let word = c.last.lane(me).load(Ordering::Relaxed);
        assert_eq!(word & COPYING, 0);
        assert_ne!(word, 0);
    }
}
