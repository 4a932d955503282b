//! Which submitting threads copied a block large enough to split lately: what the copy
//! plan reads to tell whether a core is free for a copy thread
//! (`CopyPolicy::inline_after_all`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::copy_plan::BUSY_WINDOW;
use crate::lanes::{self, Striped};

/// One time per lane, each written by its own lane's threads only (`lanes.rs`).
pub(super) struct LargeCopiers {
    epoch: Instant,
    /// Nanoseconds after `epoch` of each lane's latest large copy (0: none yet).
    last: Striped<AtomicU64>,
}

impl LargeCopiers {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last: Striped::default(),
        }
    }

    /// Records a large copy of the calling thread; how many threads of other lanes made
    /// one within [`BUSY_WINDOW`].
    pub(super) fn others_copying(&self) -> usize {
        // Never 0, which stands for "none yet".
        let now = u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        self.note(lanes::current(), now)
    }

    /// [`LargeCopiers::others_copying`] for a copy of lane `me` at `now`.
    fn note(&self, me: usize, now: u64) -> usize {
        self.last.lane(me).store(now, Ordering::Relaxed);
        let window = BUSY_WINDOW.as_nanos() as u64;
        (0..lanes::LANES)
            .filter(|&lane| lane != me)
            .filter(|&lane| {
                let at = self.last.lane(lane).load(Ordering::Relaxed);
                at != 0 && now.saturating_sub(at) < window
            })
            .count()
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
        // Alone: the other core is free.
        assert!(!cores_taken(c.note(0, 10 * ms), 2));
        // A second lane copying within the window: both cores are taken, for either.
        assert!(cores_taken(c.note(1, 10 * ms + 10_000), 2));
        assert!(cores_taken(c.note(0, 10 * ms + 20_000), 2));
        // Three cores: two copiers still leave one.
        assert!(!cores_taken(c.note(0, 10 * ms + 30_000), 3));
        // The other lane went quiet for longer than the window.
        assert!(!cores_taken(c.note(0, 12 * ms), 2));
        // The same lane again never counts as another.
        assert!(!cores_taken(c.note(0, 12 * ms + 1), 2));
    }
}
