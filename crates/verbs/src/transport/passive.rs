//! The target side of connections: what is held for each peer endpoint that connected here
//! (its queue pair and CQ), keyed by the initiator engine and its endpoint slot, with a cap,
//! and the release of those whose initiator engine has gone. Pure bookkeeping: what is held
//! is opaque here, and time is an argument.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most passive queue pairs kept (a bound against peers that keep reconnecting).
pub(super) const MAX_PASSIVE: usize = 4096;

/// One held endpoint.
struct Held<T> {
    _value: T,
    /// Since when the initiator engine has held no control connection to this engine.
    orphaned_since: Option<Instant>,
}

/// The held endpoints, by (initiator engine, its endpoint slot).
pub(super) struct Passive<T> {
    held: HashMap<(u64, u32), Held<T>>,
}

impl<T> Default for Passive<T> {
    fn default() -> Self {
        Self {
            held: HashMap::new(),
        }
    }
}

impl<T> Passive<T> {
    /// How many endpoints are held.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no more may be held ([`MAX_PASSIVE`]).
    pub(super) fn is_full(&self) -> bool {
        self.held.len() >= MAX_PASSIVE
    }

    /// Holds `value` for endpoint `slot` of engine `engine`; what an earlier connection of
    /// the same endpoint held is dropped (a reconnect replaces it).
    pub(super) fn insert(&mut self, engine: u64, slot: u32, value: T) {
        self.held.insert(
            (engine, slot),
            Held {
                _value: value,
                orphaned_since: None,
            },
        );
    }

    /// Releases what is held for engines that `is_connected` has said no of for `grace`
    /// (measured from the first such `now`; a connected engine's clock starts again).
    /// Returns how many were released.
    pub(super) fn release_orphans(
        &mut self,
        now: Instant,
        grace: Duration,
        is_connected: impl Fn(u64) -> bool,
    ) -> usize {
        let before = self.held.len();
        self.held.retain(|(engine, _), h| {
            if is_connected(*engine) {
                h.orphaned_since = None;
                return true;
            }
            let since = *h.orphaned_since.get_or_insert(now);
            now.duration_since(since) < grace
        });
        before - self.held.len()
    }

    /// Releases everything.
    pub(super) fn clear(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn an_orphan_is_released_once_grace_has_passed_since_it_was_first_seen() {
        let t0 = Instant::now();
        let mut p = Passive::default();
        p.insert(1, 0, ());
        p.insert(1, 1, ());
        p.insert(2, 0, ());
        let only_2 = |e: u64| e == 2;
        assert_eq!(p.release_orphans(t0, GRACE, only_2), 0, "first seen");
        assert_eq!(p.release_orphans(t0 + GRACE / 2, GRACE, only_2), 0);
        let just_before = t0 + GRACE - Duration::from_nanos(1);
        assert_eq!(p.release_orphans(just_before, GRACE, only_2), 0);
        assert_eq!(p.release_orphans(t0 + GRACE, GRACE, only_2), 2);
        assert_eq!(p.len(), 1);
        // A connected engine is never released.
        assert_eq!(p.release_orphans(t0 + GRACE * 10, GRACE, only_2), 0);
    }

    #[test]
    fn a_reconnect_within_grace_starts_the_clock_again() {
        let t0 = Instant::now();
        let mut p = Passive::default();
        p.insert(1, 0, ());
        assert_eq!(p.release_orphans(t0, GRACE, |_| false), 0);
        assert_eq!(p.release_orphans(t0 + GRACE / 2, GRACE, |_| true), 0);
        // Orphaned again at t0 + GRACE: the grace counts from there.
        assert_eq!(p.release_orphans(t0 + GRACE, GRACE, |_| false), 0);
        assert_eq!(
            p.release_orphans(t0 + GRACE * 2 - GRACE / 10, GRACE, |_| false),
            0
        );
        assert_eq!(p.release_orphans(t0 + GRACE * 2, GRACE, |_| false), 1);
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn a_reconnect_of_the_same_endpoint_replaces_what_was_held() {
        let first = Arc::new(());
        let mut p = Passive::default();
        p.insert(1, 0, first.clone());
        p.insert(1, 0, Arc::new(()));
        assert_eq!(p.len(), 1);
        assert_eq!(Arc::strong_count(&first), 1, "the old value was dropped");
        p.insert(1, 1, Arc::new(()));
        assert_eq!(p.len(), 2);
        p.clear();
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn the_cap_is_max_passive() {
        let mut p = Passive::default();
        for slot in 0..MAX_PASSIVE as u32 - 1 {
            p.insert(9, slot, ());
        }
        assert!(!p.is_full());
        p.insert(9, u32::MAX, ());
        assert!(p.is_full());
    }
}
