//! Rail health: pausing a path that keeps failing, and ranking candidates around it.
//!
//! A *rail* is one path a transfer can take: a local NIC/remote NIC pair for RDMA, or a
//! (peer, transport) pair. TENT's rail monitor pauses a rail after 3 errors within 10 s
//! for 30 s, doubling on repeats up to 300 s; one good completion or the cooldown's end
//! brings it back. [`RailMonitor`] is that rule for one rail; [`HealthTable`] keeps one
//! monitor per key and ranks candidates so that paused ones come last.
//!
//! Pure code: nothing here reads a clock, sleeps or touches a socket. Every method that
//! depends on time takes `now` from the caller, so tests drive it with simulated instants
//! (`base + Duration`). Instants that arrive slightly out of order (two threads that read
//! the clock and then race for a lock) are tolerated: all differences saturate at zero
//! and nothing panics.
//!
//! The rules, precisely:
//!
//! - An error counts toward the threshold while it is at most `window` old (inclusive: errors
//!   at `t` and `t + window` are "within" the window). When `error_threshold` errors are
//!   within the window at once, the rail pauses and the window is emptied, so a fresh run of
//!   errors is needed after the pause ends.
//! - An error recorded while the rail is paused is ignored: it is usually work that was in
//!   flight when the pause began, and it neither extends the pause nor counts toward the
//!   next one.
//! - The first pause lasts `base_cooldown`. Each further pause without a success in
//!   between lasts twice the previous one, capped at `max_cooldown`.
//! - A success (one good completion) ends any pause at once, empties the error window and
//!   resets the doubling: the next pause lasts `base_cooldown` again. Errors therefore
//!   pause a rail only when no success comes between them.
//! - A pause ends by itself when its cooldown has elapsed (at exactly `start + cooldown`
//!   the rail is usable again). This alone does not reset the doubling: a rail that fails
//!   again straight after its pause gets a longer one.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// When a rail pauses and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailPolicy {
    /// Errors within `window` that pause the rail (default 3). 0 disables pausing.
    pub error_threshold: u32,
    /// How long an error counts toward the threshold (default 10 s).
    pub window: Duration,
    /// Length of the first pause (default 30 s).
    pub base_cooldown: Duration,
    /// Cap on a pause's length however often it repeats (default 300 s).
    pub max_cooldown: Duration,
}

impl Default for RailPolicy {
    fn default() -> Self {
        Self {
            error_threshold: 3,
            window: Duration::from_secs(10),
            base_cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(300),
        }
    }
}

/// A pause in force (or one that has expired but not yet been noticed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pause {
    since: Instant,
    cooldown: Duration,
}

impl Pause {
    fn active(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) < self.cooldown
    }
}

/// Error tracking and pausing for one rail. See the [module docs](self) for the rules.
///
/// Memory is bounded: at most `error_threshold` error timestamps are kept.
#[derive(Debug, Clone)]
pub struct RailMonitor {
    policy: RailPolicy,
    /// Recent errors, oldest first; never longer than `policy.error_threshold`.
    errors: VecDeque<Instant>,
    /// The latest pause, until a success ends it or a later call notices it expired.
    pause: Option<Pause>,
    /// Length of the latest pause since the last success; drives the doubling.
    last_cooldown: Option<Duration>,
}

impl Default for RailMonitor {
    fn default() -> Self {
        Self::new(RailPolicy::default())
    }
}

impl RailMonitor {
    /// A healthy rail governed by `policy`.
    pub fn new(policy: RailPolicy) -> Self {
        Self {
            policy,
            errors: VecDeque::new(),
            pause: None,
            last_cooldown: None,
        }
    }

    /// The policy this monitor applies.
    pub fn policy(&self) -> &RailPolicy {
        &self.policy
    }

    /// Records a failed completion at `now`. Returns true when this error pauses the rail
    /// (it reached the threshold); false otherwise, including while already paused.
    pub fn record_error(&mut self, now: Instant) -> bool {
        self.expire(now);
        if self.pause.is_some() || self.policy.error_threshold == 0 {
            return false;
        }
        let window = self.policy.window;
        while self
            .errors
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > window)
        {
            self.errors.pop_front();
        }
        self.errors.push_back(now);
        let threshold = usize::try_from(self.policy.error_threshold).unwrap_or(usize::MAX);
        if self.errors.len() < threshold {
            return false;
        }
        let cooldown = self.next_cooldown();
        self.errors.clear();
        self.pause = Some(Pause {
            since: now,
            cooldown,
        });
        self.last_cooldown = Some(cooldown);
        true
    }

    /// Records a good completion at `now`: ends any pause, empties the error window and
    /// resets the doubling. Afterwards the monitor is indistinguishable from a new one.
    pub fn record_success(&mut self, _now: Instant) {
        self.errors.clear();
        self.pause = None;
        self.last_cooldown = None;
    }

    /// Whether the rail is paused at `now`. A pause ends by itself at `start + cooldown`.
    pub fn is_paused(&self, now: Instant) -> bool {
        self.pause.is_some_and(|p| p.active(now))
    }

    /// When the latest pause ends, if there is one that no success has cleared.
    ///
    /// The instant may lie in the past (the pause expired and no call has noticed yet);
    /// [`is_paused`](Self::is_paused) is the answer for a given time. Also `None` in the
    /// degenerate case where the end is beyond what [`Instant`] can represent (an absurd
    /// `max_cooldown`); the rail still counts as paused then.
    pub fn paused_until(&self) -> Option<Instant> {
        self.pause.and_then(|p| p.since.checked_add(p.cooldown))
    }

    /// Length of the pause in force, or of the latest one since the last success;
    /// zero when the rail has not paused since its last success.
    pub fn current_cooldown(&self) -> Duration {
        self.last_cooldown.unwrap_or(Duration::ZERO)
    }

    /// Length the next pause would get: `base_cooldown` after a success (or at the start),
    /// otherwise twice the latest pause, capped at `max_cooldown`.
    pub fn next_cooldown(&self) -> Duration {
        let max = self.policy.max_cooldown;
        match self.last_cooldown {
            None => self.policy.base_cooldown.min(max),
            Some(last) => last.saturating_mul(2).min(max),
        }
    }

    /// Number of errors currently counting toward the threshold (as of the last call).
    pub fn recent_errors(&self) -> usize {
        self.errors.len()
    }

    /// Forgets a pause that has run its course (the doubling memory stays).
    fn expire(&mut self, now: Instant) {
        if self.pause.is_some_and(|p| !p.active(now)) {
            self.pause = None;
        }
    }

    /// Whether the monitor holds nothing a new one would not (so it can be dropped).
    fn is_pristine(&self) -> bool {
        self.errors.is_empty() && self.pause.is_none() && self.last_cooldown.is_none()
    }
}

/// One [`RailMonitor`] per key (a NIC pair, a (peer, transport) pair, …), sharing one
/// policy.
///
/// Thread safety: every method takes `&self` and locks an internal mutex for a short,
/// allocation-light critical section, so a table can be shared (`Arc<HealthTable<K>>`)
/// across threads; it is `Send + Sync` when `K: Send`. A poisoned lock is recovered, as
/// elsewhere in the crate: the state is a cache of recent errors and is valid after any
/// partial update.
///
/// Memory: a key has an entry only while it has recent errors, a pause, or doubling
/// memory; a success removes the entry, since a fresh monitor is equivalent. Call
/// [`forget`](Self::forget) when a key goes away for good (peer lost, NIC removed).
#[derive(Debug)]
pub struct HealthTable<K> {
    policy: RailPolicy,
    rails: Mutex<HashMap<K, RailMonitor>>,
}

impl<K: Hash + Eq + Clone> Default for HealthTable<K> {
    fn default() -> Self {
        Self::new(RailPolicy::default())
    }
}

impl<K: Hash + Eq + Clone> HealthTable<K> {
    /// An empty table whose monitors follow `policy`.
    pub fn new(policy: RailPolicy) -> Self {
        Self {
            policy,
            rails: Mutex::new(HashMap::new()),
        }
    }

    /// The policy every monitor in this table applies.
    pub fn policy(&self) -> &RailPolicy {
        &self.policy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, RailMonitor>> {
        self.rails.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a failed completion on `key`'s rail; true when this error pauses it.
    pub fn record_error(&self, key: &K, now: Instant) -> bool {
        let mut rails = self.lock();
        match rails.get_mut(key) {
            Some(monitor) => monitor.record_error(now),
            None => {
                let mut monitor = RailMonitor::new(self.policy);
                let paused = monitor.record_error(now);
                if !monitor.is_pristine() {
                    rails.insert(key.clone(), monitor);
                }
                paused
            }
        }
    }

    /// Records a good completion on `key`'s rail: un-pauses it and resets its history.
    pub fn record_success(&self, key: &K, now: Instant) {
        let mut rails = self.lock();
        if let Some(monitor) = rails.get_mut(key) {
            monitor.record_success(now);
            if monitor.is_pristine() {
                rails.remove(key);
            }
        }
    }

    /// Whether `key`'s rail is paused at `now`; unknown keys are healthy.
    pub fn is_paused(&self, key: &K, now: Instant) -> bool {
        self.lock().get(key).is_some_and(|m| m.is_paused(now))
    }

    /// When `key`'s latest pause ends; see [`RailMonitor::paused_until`].
    pub fn paused_until(&self, key: &K) -> Option<Instant> {
        self.lock().get(key).and_then(RailMonitor::paused_until)
    }

    /// `candidates` in their given order, except that those whose rail is paused at `now`
    /// move to the end; order within the healthy and the paused group is kept. Nothing is
    /// dropped: a paused rail is still a last resort.
    ///
    /// `key_of` runs before the table is locked, so it may itself use the table.
    pub fn rank<T: Clone>(
        &self,
        candidates: &[T],
        key_of: impl Fn(&T) -> K,
        now: Instant,
    ) -> Vec<T> {
        let keys: Vec<K> = candidates.iter().map(key_of).collect();
        let paused: Vec<bool> = {
            let rails = self.lock();
            keys.iter()
                .map(|k| rails.get(k).is_some_and(|m| m.is_paused(now)))
                .collect()
        };
        let mut out = Vec::with_capacity(candidates.len());
        for want_paused in [false, true] {
            out.extend(
                candidates
                    .iter()
                    .zip(&paused)
                    .filter(|(_, p)| **p == want_paused)
                    .map(|(c, _)| c.clone()),
            );
        }
        out
    }

    /// Drops everything known about `key`.
    pub fn forget(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Number of keys with recorded history (recent errors, a pause or doubling memory).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key has recorded history.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    /// Three errors at `at`, `at + 1 ms`, `at + 2 ms`; returns the third's instant.
    fn burst(m: &mut RailMonitor, at: Instant) -> Instant {
        assert!(!m.record_error(at));
        assert!(!m.record_error(at + ms(1)));
        assert!(m.record_error(at + ms(2)), "third error pauses");
        at + ms(2)
    }

    #[test]
    fn default_policy_matches_tent() {
        let p = RailPolicy::default();
        assert_eq!(p.error_threshold, 3);
        assert_eq!(p.window, secs(10));
        assert_eq!(p.base_cooldown, secs(30));
        assert_eq!(p.max_cooldown, secs(300));
    }

    #[test]
    fn two_errors_do_not_pause() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        assert!(!m.record_error(base));
        assert!(!m.record_error(base + secs(1)));
        assert!(!m.is_paused(base + secs(1)));
        assert_eq!(m.paused_until(), None);
        assert_eq!(m.current_cooldown(), Duration::ZERO);
        assert_eq!(m.recent_errors(), 2);
    }

    #[test]
    fn three_within_window_pause_for_base_cooldown() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        assert!(!m.record_error(base));
        assert!(!m.record_error(base + secs(4)));
        assert!(m.record_error(base + secs(9)));
        let start = base + secs(9);
        assert!(m.is_paused(start));
        assert!(m.is_paused(start + secs(29)));
        assert_eq!(m.paused_until(), Some(start + secs(30)));
        assert_eq!(m.current_cooldown(), secs(30));
        assert_eq!(m.next_cooldown(), secs(60));
    }

    #[test]
    fn window_is_inclusive_at_its_edge() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        m.record_error(base);
        m.record_error(base + secs(5));
        assert!(
            m.record_error(base + secs(10)),
            "exactly 10 s apart is within"
        );
    }

    #[test]
    fn three_spread_over_more_than_window_do_not_pause() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        assert!(!m.record_error(base));
        assert!(!m.record_error(base + secs(5)));
        assert!(!m.record_error(base + secs(10) + ms(1)));
        assert!(!m.is_paused(base + secs(10) + ms(1)));
        // the first has aged out; the other two still count
        assert_eq!(m.recent_errors(), 2);
        assert!(m.record_error(base + secs(12)));
    }

    #[test]
    fn pause_expires_at_exactly_the_cooldown() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        let start = burst(&mut m, base);
        let end = start + secs(30);
        assert!(m.is_paused(end - Duration::from_nanos(1)));
        assert!(!m.is_paused(end));
        assert!(!m.is_paused(end + secs(1000)));
    }

    #[test]
    fn repeated_pauses_double_up_to_the_cap() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        let mut at = base;
        for expected in [30, 60, 120, 240, 300, 300, 300] {
            let start = burst(&mut m, at);
            assert_eq!(m.current_cooldown(), secs(expected));
            assert_eq!(m.paused_until(), Some(start + secs(expected)));
            let end = start + secs(expected);
            assert!(m.is_paused(end - ms(1)), "paused just before {expected} s");
            assert!(!m.is_paused(end), "back at {expected} s");
            at = end; // fail again right after the pause ends
        }
    }

    #[test]
    fn success_unpauses_at_once_and_resets_the_doubling() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        let start = burst(&mut m, base);
        let end = start + secs(30);
        let start = burst(&mut m, end);
        assert_eq!(m.current_cooldown(), secs(60));
        assert!(m.is_paused(start + secs(1)));

        m.record_success(start + secs(1));
        assert!(!m.is_paused(start + secs(1)));
        assert_eq!(m.paused_until(), None);
        assert_eq!(m.current_cooldown(), Duration::ZERO);
        assert_eq!(m.next_cooldown(), secs(30));

        let start = burst(&mut m, start + secs(2));
        assert_eq!(m.current_cooldown(), secs(30), "doubling was reset");
        assert_eq!(m.paused_until(), Some(start + secs(30)));
    }

    #[test]
    fn success_resets_the_error_window() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        m.record_error(base);
        m.record_error(base + secs(1));
        m.record_success(base + secs(2));
        assert_eq!(m.recent_errors(), 0);
        assert!(!m.record_error(base + secs(3)));
        assert!(!m.record_error(base + secs(4)));
        assert!(m.record_error(base + secs(5)));
    }

    #[test]
    fn errors_while_paused_are_ignored() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        let start = burst(&mut m, base);
        for i in 0..10 {
            assert!(!m.record_error(start + secs(i)));
        }
        assert_eq!(m.paused_until(), Some(start + secs(30)), "not extended");
        assert_eq!(m.recent_errors(), 0, "not counted toward the next pause");
        let end = start + secs(30);
        assert!(!m.record_error(end));
        assert!(!m.record_error(end + secs(1)));
        assert!(!m.is_paused(end + secs(1)));
    }

    #[test]
    fn expiry_without_success_keeps_the_doubling() {
        let base = Instant::now();
        let mut m = RailMonitor::default();
        burst(&mut m, base);
        // a long quiet spell, but no good completion in between
        burst(&mut m, base + secs(3600));
        assert_eq!(m.current_cooldown(), secs(60));
    }

    #[test]
    fn window_memory_stays_bounded() {
        let base = Instant::now();
        // errors that keep pausing the rail
        let mut m = RailMonitor::default();
        let mut pauses = 0;
        for i in 0..10_000u64 {
            if m.record_error(base + ms(i * 100)) {
                pauses += 1;
            }
            assert!(m.errors.len() <= 3);
        }
        assert!(pauses > 1);
        assert_eq!(m.current_cooldown(), secs(300));
        // errors too sparse ever to pause: only the ones in the window are kept
        let mut m = RailMonitor::default();
        for i in 0..10_000u64 {
            assert!(!m.record_error(base + secs(i * 6)));
            assert!(m.errors.len() <= 2);
        }
        // a huge threshold and window: bounded by the threshold
        let mut m = RailMonitor::new(RailPolicy {
            error_threshold: 64,
            window: secs(1_000_000),
            ..RailPolicy::default()
        });
        for i in 0..10_000u64 {
            m.record_error(base + ms(i));
            assert!(m.errors.len() <= 64);
        }
    }

    #[test]
    fn zero_threshold_never_pauses() {
        let base = Instant::now();
        let mut m = RailMonitor::new(RailPolicy {
            error_threshold: 0,
            ..RailPolicy::default()
        });
        for i in 0..100 {
            assert!(!m.record_error(base + ms(i)));
        }
        assert!(!m.is_paused(base + secs(1)));
        assert_eq!(m.recent_errors(), 0);
    }

    #[test]
    fn threshold_one_pauses_on_first_error() {
        let base = Instant::now();
        let mut m = RailMonitor::new(RailPolicy {
            error_threshold: 1,
            ..RailPolicy::default()
        });
        assert!(m.record_error(base));
        assert!(m.is_paused(base + secs(29)));
    }

    #[test]
    fn base_above_cap_is_capped() {
        let base = Instant::now();
        let mut m = RailMonitor::new(RailPolicy {
            base_cooldown: secs(500),
            max_cooldown: secs(100),
            ..RailPolicy::default()
        });
        burst(&mut m, base);
        assert_eq!(m.current_cooldown(), secs(100));
    }

    #[test]
    fn huge_cooldowns_do_not_panic() {
        let base = Instant::now();
        let mut m = RailMonitor::new(RailPolicy {
            base_cooldown: Duration::MAX,
            max_cooldown: Duration::MAX,
            ..RailPolicy::default()
        });
        let start = burst(&mut m, base);
        assert!(m.is_paused(start + secs(1_000_000)));
        let _ = m.paused_until();
        assert_eq!(m.next_cooldown(), Duration::MAX);
    }

    #[test]
    fn out_of_order_instants_are_tolerated() {
        let base = Instant::now() + secs(100);
        let mut m = RailMonitor::default();
        m.record_error(base);
        m.record_error(base - ms(5));
        assert!(m.record_error(base - ms(10)));
        // a query slightly before the pause started still reads as paused
        assert!(m.is_paused(base - secs(1)));
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Via {
        Shm,
        Rdma,
        Tcp,
    }

    fn fail(table: &HealthTable<(u32, Via)>, key: (u32, Via), at: Instant) -> bool {
        table.record_error(&key, at);
        table.record_error(&key, at + ms(1));
        table.record_error(&key, at + ms(2))
    }

    #[test]
    fn table_pauses_per_key() {
        let base = Instant::now();
        let table = HealthTable::new(RailPolicy::default());
        assert!(table.is_empty());
        assert!(fail(&table, (1, Via::Rdma), base));
        assert!(table.is_paused(&(1, Via::Rdma), base + secs(1)));
        assert!(!table.is_paused(&(2, Via::Rdma), base + secs(1)));
        assert!(!table.is_paused(&(1, Via::Tcp), base + secs(1)));
        assert_eq!(
            table.paused_until(&(1, Via::Rdma)),
            Some(base + ms(2) + secs(30))
        );
        assert_eq!(table.paused_until(&(1, Via::Tcp)), None);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn rank_moves_paused_last_and_keeps_order() {
        let base = Instant::now();
        let table = HealthTable::new(RailPolicy::default());
        let peer = 7;
        let order = [Via::Shm, Via::Rdma, Via::Tcp];
        let now = base + secs(1);
        // nothing paused: order unchanged
        assert_eq!(table.rank(&order, |v| (peer, *v), now), order);

        fail(&table, (peer, Via::Shm), base);
        assert_eq!(
            table.rank(&order, |v| (peer, *v), now),
            [Via::Rdma, Via::Tcp, Via::Shm]
        );

        fail(&table, (peer, Via::Rdma), base);
        assert_eq!(
            table.rank(&order, |v| (peer, *v), now),
            [Via::Tcp, Via::Shm, Via::Rdma],
            "stable within the paused group"
        );

        // another peer is unaffected
        assert_eq!(table.rank(&order, |v| (peer + 1, *v), now), order);
        // everything paused: given order kept, nothing dropped
        fail(&table, (peer, Via::Tcp), base);
        assert_eq!(table.rank(&order, |v| (peer, *v), now), order);
        // empty input
        assert!(table.rank(&[] as &[Via], |v| (peer, *v), now).is_empty());
    }

    #[test]
    fn rank_recovers_after_expiry_and_success() {
        let base = Instant::now();
        let table = HealthTable::new(RailPolicy::default());
        let order = [Via::Rdma, Via::Tcp];
        fail(&table, (1, Via::Rdma), base);
        let end = base + ms(2) + secs(30);
        assert_eq!(
            table.rank(&order, |v| (1, *v), end - ms(1)),
            [Via::Tcp, Via::Rdma]
        );
        assert_eq!(table.rank(&order, |v| (1, *v), end), order, "expired");

        // pause again, then a good completion brings it back before expiry
        assert!(fail(&table, (1, Via::Rdma), end));
        assert_eq!(
            table.rank(&order, |v| (1, *v), end + secs(1)),
            [Via::Tcp, Via::Rdma]
        );
        table.record_success(&(1, Via::Rdma), end + secs(1));
        assert_eq!(table.rank(&order, |v| (1, *v), end + secs(1)), order);
    }

    #[test]
    fn success_and_forget_drop_entries() {
        let base = Instant::now();
        let table = HealthTable::new(RailPolicy::default());
        table.record_success(&(1, Via::Tcp), base);
        assert!(table.is_empty(), "success on an unknown key stores nothing");
        table.record_error(&(1, Via::Tcp), base);
        table.record_error(&(2, Via::Tcp), base);
        assert_eq!(table.len(), 2);
        table.record_success(&(1, Via::Tcp), base);
        assert_eq!(table.len(), 1);
        table.forget(&(2, Via::Tcp));
        assert!(table.is_empty());

        // after forget a key starts fresh: base cooldown again
        fail(&table, (3, Via::Rdma), base);
        fail(&table, (3, Via::Rdma), base + secs(40));
        assert_eq!(
            table.paused_until(&(3, Via::Rdma)),
            Some(base + secs(40) + ms(2) + secs(60))
        );
        table.forget(&(3, Via::Rdma));
        fail(&table, (3, Via::Rdma), base + secs(50));
        assert_eq!(
            table.paused_until(&(3, Via::Rdma)),
            Some(base + secs(50) + ms(2) + secs(30))
        );
    }

    #[test]
    fn disabled_policy_stores_nothing() {
        let base = Instant::now();
        let table = HealthTable::new(RailPolicy {
            error_threshold: 0,
            ..RailPolicy::default()
        });
        for i in 0..100 {
            assert!(!table.record_error(&i, base));
        }
        assert!(table.is_empty());
    }

    #[test]
    fn table_is_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HealthTable<(u32, Via)>>();
        assert_send_sync::<RailMonitor>();
    }

    #[test]
    fn key_of_may_use_the_table() {
        let base = Instant::now();
        let table = HealthTable::new(RailPolicy::default());
        fail(&table, (1, Via::Tcp), base);
        let ranked = table.rank(
            &[Via::Tcp, Via::Rdma],
            |v| {
                let _ = table.is_paused(&(1, *v), base);
                (1, *v)
            },
            base + secs(1),
        );
        assert_eq!(ranked, [Via::Rdma, Via::Tcp]);
    }
}
