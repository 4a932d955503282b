//! Attempt deadlines: when each attempt in flight expires, for the engine's sweeper
//! (`dispatch::sweep_deadlines`). Generic over what an entry points at (a task), so that
//! the task can hold its own registration.
//!
//! An attempt's deadline is `timeout` after it starts: after its submission for most
//! transports, and after its bytes start moving for one that queues them and says when
//! (`Transport::reports_starts`). Such an attempt may travel on several connections at
//! once, each starting on its share in its own time (one may lag the others by seconds in
//! a long list); its deadline runs from the last of those starts (`Task::started`,
//! [`Deadlines::started`]), so that no part of it is timed while it still waits behind
//! other work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A registered deadline: the task (not kept alive) and its attempt number.
pub type DeadlineEntry<T> = (Weak<T>, u32);

/// Identifies a registered deadline, for `Deadlines::remove`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeadlineKey {
    bucket: u64,
    seq: u64,
}

/// Attempt deadlines, ordered by coarse time bucket: registering and removing are map
/// operations under a lock, and the sweeper takes only the entries that have expired.
///
/// An attempt that ends removes its entry (`Task` does so as it ends or moves to another
/// attempt), so the map holds the attempts in flight, not every attempt of the last
/// timeout period: an entry's `Weak<Task>` keeps the task's allocation, and at a few
/// hundred thousand transfers a second and a 10 s deadline that was hundreds of MB.
pub struct Deadlines<T> {
    epoch: Instant,
    tick: Duration,
    timeout: Duration,
    next: AtomicU64,
    entries: Mutex<BTreeMap<DeadlineKey, DeadlineEntry<T>>>,
}

impl<T> std::fmt::Debug for Deadlines<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadlines")
            .field("tick", &self.tick)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<T> Deadlines<T> {
    /// Deadlines `timeout` after their attempts start, resolved to `tick`.
    pub fn new(epoch: Instant, tick: Duration, timeout: Duration) -> Self {
        Self {
            epoch,
            tick: tick.max(Duration::from_millis(1)),
            timeout,
            next: AtomicU64::new(0),
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// The sweep period.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// How long after its start an attempt expires.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn bucket(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch);
        // Round up: an entry never fires before its deadline.
        since.as_nanos().div_ceil(self.tick.as_nanos()) as u64
    }

    /// Registers `attempt` of `task` to expire at `deadline`.
    pub fn add(&self, task: Weak<T>, attempt: u32, deadline: Instant) -> DeadlineKey {
        let key = DeadlineKey {
            bucket: self.bucket(deadline),
            seq: self.next.fetch_add(1, Ordering::Relaxed),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.insert(key, (task, attempt));
        key
    }

    /// Times `attempt` of `task` from `at`, when (a share of) its bytes started moving:
    /// registers its deadline `timeout` later, or moves its registration so far
    /// (`current`) there. A start never brings a deadline forward: shares that start
    /// later push it back, earlier reports change nothing. Returns the registration.
    pub fn started(
        &self,
        current: Option<DeadlineKey>,
        task: &Arc<T>,
        attempt: u32,
        at: Instant,
    ) -> DeadlineKey {
        let bucket = self.bucket(at + self.timeout);
        if let Some(key) = current.filter(|k| k.bucket >= bucket) {
            return key;
        }
        let key = DeadlineKey {
            bucket,
            seq: self.next.fetch_add(1, Ordering::Relaxed),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = current {
            entries.remove(&old);
        }
        entries.insert(key, (Arc::downgrade(task), attempt));
        key
    }

    /// Forgets a deadline (its attempt ended); returns whether it was still registered.
    pub fn remove(&self, key: DeadlineKey) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(&key).is_some()
    }

    /// Takes every entry whose deadline is at or before `now`.
    pub fn expired(&self, now: Instant) -> Vec<DeadlineEntry<T>> {
        let cut = now.saturating_duration_since(self.epoch).as_nanos() / self.tick.as_nanos();
        let first_later = DeadlineKey {
            bucket: cut as u64 + 1,
            seq: 0,
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let later = entries.split_off(&first_later);
        let due = std::mem::replace(&mut *entries, later);
        due.into_values().collect()
    }

    /// Entries still waiting (for tests and metrics).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One attempt's deadline as its task holds it: the table, its registration there, and
/// how it runs. The task keeps it under its lock and drops the registration
/// ([`AttemptDeadline::remove`]) when the attempt ends.
pub(crate) struct AttemptDeadline<T> {
    table: Arc<Deadlines<T>>,
    /// `None` until an attempt timed from its start has every share moving.
    key: Option<DeadlineKey>,
    /// Timed from when its bytes start moving, not from submission.
    from_start: bool,
    /// Shares not yet moving: its clock starts with the last of them.
    unstarted: u32,
}

impl<T> AttemptDeadline<T> {
    /// Registered at `key` of `table`: timed from submission.
    pub(crate) fn registered(table: &Arc<Deadlines<T>>, key: DeadlineKey) -> Self {
        Self {
            table: table.clone(),
            key: Some(key),
            from_start: false,
            unstarted: 0,
        }
    }

    /// Timed from when its bytes start moving, in `table`: nothing registered until
    /// then. One share unless [`AttemptDeadline::expect_shares`] says more.
    pub(crate) fn from_start(table: &Arc<Deadlines<T>>) -> Self {
        Self {
            table: table.clone(),
            key: None,
            from_start: true,
            unstarted: 1,
        }
    }

    /// The attempt travels in `shares` shares (before any of them started).
    pub(crate) fn expect_shares(&mut self, shares: u32) {
        if self.from_start && self.key.is_none() {
            self.unstarted = shares.max(1);
        }
    }

    /// A share of `attempt` of `task` started moving at `at`: once every share has, the
    /// attempt expires `timeout` after the last start. Ignored for a deadline timed from
    /// submission.
    pub(crate) fn share_started(&mut self, task: &Arc<T>, attempt: u32, at: Instant) {
        if !self.from_start {
            return;
        }
        self.unstarted = self.unstarted.saturating_sub(1);
        if self.unstarted == 0 {
            self.key = Some(self.table.started(self.key, task, attempt, at));
        }
    }

    /// Forgets the registration, if any (the attempt ended).
    pub(crate) fn remove(self) {
        if let Some(k) = self.key {
            self.table.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_fire_at_or_after_their_time_only() {
        let epoch = Instant::now();
        let d = Deadlines::<()>::new(epoch, Duration::from_millis(10), Duration::ZERO);
        d.add(Weak::new(), 1, epoch + Duration::from_millis(25));
        d.add(Weak::new(), 2, epoch + Duration::from_millis(95));
        assert!(d.expired(epoch + Duration::from_millis(24)).is_empty());
        assert_eq!(d.expired(epoch + Duration::from_millis(30)).len(), 1);
        assert!(d.expired(epoch + Duration::from_millis(90)).is_empty());
        assert_eq!(d.len(), 1);
        assert_eq!(d.expired(epoch + Duration::from_millis(100)).len(), 1);
        assert!(d.is_empty());
    }

    #[test]
    fn removed_deadlines_never_fire_and_hold_nothing() {
        let epoch = Instant::now();
        let d = Deadlines::<()>::new(epoch, Duration::from_millis(10), Duration::ZERO);
        let at = epoch + Duration::from_millis(25);
        let keys: Vec<_> = (0..1000).map(|i| d.add(Weak::new(), i, at)).collect();
        let kept = d.add(Weak::new(), 7, at);
        for k in &keys {
            assert!(d.remove(*k));
        }
        assert!(!d.remove(keys[0]), "removed once");
        assert_eq!(d.len(), 1);
        let due = d.expired(epoch + Duration::from_millis(30));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1, 7);
        assert!(!d.remove(kept), "an expired entry is gone");
        assert!(d.is_empty());
    }

    #[test]
    fn a_start_moves_a_deadline_later_never_earlier() {
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        let d = Deadlines::<()>::new(epoch, ms(10), ms(100));
        let task = Arc::new(());
        // Started at 5 ms: due at 105 ms.
        let first = d.started(None, &task, 1, epoch + ms(5));
        assert!(d.expired(epoch + ms(104)).is_empty());
        // Started again at 50 ms: the deadline moves to 150 ms, one entry still.
        let moved = d.started(Some(first), &task, 1, epoch + ms(50));
        assert_ne!(moved, first);
        assert_eq!(d.len(), 1);
        // A start reported late, or in the same tick, changes nothing.
        assert_eq!(d.started(Some(moved), &task, 1, epoch + ms(20)), moved);
        assert_eq!(d.started(Some(moved), &task, 1, epoch + ms(49)), moved);
        assert!(d.expired(epoch + ms(149)).is_empty(), "not before 150 ms");
        let due = d.expired(epoch + ms(150));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1, 1);
        assert!(d.is_empty());
        assert!(!d.remove(moved));
    }

    #[test]
    fn an_attempt_in_shares_runs_its_clock_once_the_last_share_moves() {
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        let table = Arc::new(Deadlines::<()>::new(epoch, ms(10), ms(100)));
        let task = Arc::new(());
        let mut d = AttemptDeadline::from_start(&table);
        d.expect_shares(3);
        d.share_started(&task, 1, epoch);
        d.share_started(&task, 1, epoch + ms(400));
        assert!(table.is_empty(), "a share still waits behind other work");
        d.share_started(&task, 1, epoch + ms(900));
        assert_eq!(table.len(), 1);
        assert!(table.expired(epoch + ms(999)).is_empty());
        // A deadline timed from submission ignores starts; removing drops either kind.
        let key = table.add(Weak::new(), 2, epoch + ms(50));
        let mut fixed = AttemptDeadline::registered(&table, key);
        fixed.expect_shares(2);
        fixed.share_started(&task, 2, epoch + ms(5000));
        assert_eq!(table.len(), 2);
        fixed.remove();
        d.remove();
        assert!(table.is_empty());
    }
}
