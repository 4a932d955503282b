//! Lanes: what every submitting thread writes (the counters a task bumps as it ends, the
//! batch slots it takes and frees) is split into lanes, each on cache lines of its own, and
//! each thread writes the lane it was given. Two threads submitting at once then write no
//! cache line in common; on a 2-core VM one line bounced between cores costs about as much
//! as a 4 KiB copy, and a 4 KiB op wrote some forty of them before.
//!
//! Readers (metrics, close) visit every lane. A thread's lane is fixed at its first use,
//! handed out round robin, so up to [`LANES`] threads never share one.

use std::cell::Cell;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rustc_hash::FxHashMap;

/// How many lanes each striped structure has.
pub(crate) const LANES: usize = 16;

/// The next lane to hand out.
static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LANE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The lane of the calling thread, in `0..LANES`.
pub(crate) fn current() -> usize {
    LANE.with(|lane| match lane.get() {
        Some(l) => l,
        None => {
            let l = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % LANES;
            lane.set(Some(l));
            l
        }
    })
}

/// A value alone on its cache lines (128 bytes: a pair of 64-byte lines, which x86's
/// adjacent-line prefetcher moves together).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One `T` per lane.
#[derive(Debug)]
pub(crate) struct Striped<T> {
    lanes: Box<[Padded<T>]>,
}

impl<T: Default> Default for Striped<T> {
    fn default() -> Self {
        Self::new(|_| T::default())
    }
}

impl<T> Striped<T> {
    /// Lane `i` holds `make(i)`.
    pub(crate) fn new(make: impl FnMut(usize) -> T) -> Self {
        let mut make = make;
        Self {
            lanes: (0..LANES).map(|i| Padded(make(i))).collect(),
        }
    }

    /// The calling thread's lane.
    pub(crate) fn local(&self) -> &T {
        &self.lanes[current()]
    }

    /// Lane `i` (`i < LANES`).
    pub(crate) fn lane(&self, i: usize) -> &T {
        &self.lanes[i % LANES]
    }

    /// Every lane, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.lanes.iter().map(|p| &p.0)
    }
}

/// A reference to a `T` that every thread uses (a region, a peer), taken from the calling
/// thread's lane of a table: each lane holds an `Arc` of its own of the `Arc<T>`, on a
/// cache line of its own, so that taking and dropping a reference writes only that lane's
/// count; the `T` lives while any lane or any `Lent` holds it. Derefs to the `Arc<T>`.
pub struct Lent<T>(Arc<Padded<Arc<T>>>);

impl<T> Lent<T> {
    /// A lane's reference to `value`.
    pub fn new(value: Arc<T>) -> Self {
        Self(Arc::new(Padded(value)))
    }

    /// The shared `Arc` itself (a reference taken on the count every lane shares).
    pub fn shared(&self) -> Arc<T> {
        Arc::clone(&self.0 .0)
    }
}

impl<T> Clone for Lent<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> std::ops::Deref for Lent<T> {
    type Target = Arc<T>;
    fn deref(&self) -> &Arc<T> {
        &self.0 .0
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Lent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0 .0.fmt(f)
    }
}

/// A map read on every request and written rarely (regions registered, segments opened,
/// peers attached): one copy per lane, each behind its own lock, so readers on different
/// threads take different locks. A write takes every lane's lock in turn; a reader sees the
/// change once the writer passed its lane.
pub(crate) struct ReadMostly<K, V> {
    lanes: Striped<RwLock<FxHashMap<K, V>>>,
}

impl<K, V> Default for ReadMostly<K, V> {
    fn default() -> Self {
        Self {
            lanes: Striped::new(|_| RwLock::new(FxHashMap::default())),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> ReadMostly<K, V> {
    fn read(&self, lane: usize) -> RwLockReadGuard<'_, FxHashMap<K, V>> {
        self.lanes
            .lane(lane)
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn each_lane(&self, mut f: impl FnMut(&mut FxHashMap<K, V>)) {
        for lane in self.lanes.iter() {
            f(&mut lane.write().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// Runs `f` on the value under `key` (or `None`), under the calling thread's lane's
    /// read lock: nothing is cloned.
    pub(crate) fn with<R>(&self, key: &K, f: impl FnOnce(Option<&V>) -> R) -> R {
        f(self.read(current()).get(key))
    }

    /// A clone of the value under `key`.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.with(key, |v| v.cloned())
    }

    /// Puts `make(lane)` under `key` in each lane; returns the value lane 0 had.
    pub(crate) fn insert_with(&self, key: K, mut make: impl FnMut(usize) -> V) -> Option<V> {
        let mut old = None;
        let mut lane = 0;
        self.each_lane(|map| {
            let replaced = map.insert(key.clone(), make(lane));
            if lane == 0 {
                old = replaced;
            }
            lane += 1;
        });
        old
    }

    /// Takes `key` out of every lane; returns what lane 0 had.
    pub(crate) fn remove(&self, key: &K) -> Option<V> {
        let mut old = None;
        let mut first = true;
        self.each_lane(|map| {
            let removed = map.remove(key);
            if std::mem::take(&mut first) {
                old = removed;
            }
        });
        old
    }

    /// Empties every lane.
    pub(crate) fn clear(&self) {
        self.each_lane(|map| map.clear());
    }

    /// Every value (of lane 0, which every write reaches first).
    pub(crate) fn values(&self) -> Vec<V> {
        self.read(0).values().cloned().collect()
    }

    /// How many keys there are.
    pub(crate) fn len(&self) -> usize {
        self.read(0).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_lane_and_threads_get_different_lanes() {
        let here = current();
        assert_eq!(current(), here, "a thread's lane is fixed");
        assert!(here < LANES);
        let others: Vec<usize> = (0..LANES - 1)
            .map(|_| std::thread::spawn(current).join().expect("thread"))
            .collect();
        let mut all = others.clone();
        all.push(here);
        all.sort_unstable();
        all.dedup();
        // Handed out round robin: LANES threads in a row get LANES lanes, unless other
        // tests' threads took some in between (then at least two differ).
        assert!(all.len() >= 2, "{others:?} and {here}");
    }

    #[test]
    fn a_read_mostly_map_reads_in_every_lane_what_was_written() {
        let m: ReadMostly<u32, &str> = ReadMostly::default();
        assert_eq!(m.insert_with(1, |_| "a"), None);
        assert_eq!(m.insert_with(1, |_| "b"), Some("a"));
        assert_eq!(m.insert_with(2, |_| "c"), None);
        // Every lane has every write, whichever thread reads.
        for lane in 0..LANES {
            assert_eq!(m.read(lane).get(&1), Some(&"b"));
            assert_eq!(m.read(lane).len(), 2);
        }
        let other = std::thread::scope(|s| s.spawn(|| m.get(&2)).join().expect("reader"));
        assert_eq!(other, Some("c"));
        assert_eq!(m.with(&1, |v| v.copied()), Some("b"));
        assert_eq!(m.remove(&1), Some("b"));
        assert_eq!(m.remove(&1), None);
        assert!((0..LANES).all(|lane| m.read(lane).get(&1).is_none()));
        assert_eq!(m.values(), vec!["c"]);
        m.clear();
        assert_eq!(m.len(), 0);
        // Each lane may hold a value of its own (per-lane reference counts).
        m.insert_with(7, |lane| if lane == 0 { "zero" } else { "other" });
        assert_eq!(m.read(0).get(&7), Some(&"zero"));
        assert_eq!(m.read(LANES - 1).get(&7), Some(&"other"));
    }

    #[test]
    fn a_lent_value_lives_while_any_lane_or_loan_holds_it() {
        let value = Arc::new(5);
        let weak = Arc::downgrade(&value);
        let m: ReadMostly<u8, Lent<i32>> = ReadMostly::default();
        m.insert_with(1, |_| Lent::new(value.clone()));
        drop(value);
        let loan = m.get(&1).expect("lent");
        assert_eq!(**loan, 5);
        // One reference per lane; the loan shares its lane's.
        assert_eq!(weak.strong_count(), LANES);
        // Each lane its own count.
        assert!(!Arc::ptr_eq(&m.read(0)[&1].0, &m.read(1)[&1].0));
        m.remove(&1);
        assert_eq!(weak.strong_count(), 1, "held by the loan alone");
        let shared = loan.shared();
        drop(loan);
        assert_eq!(*shared, 5);
        drop(shared);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn lanes_sit_on_cache_lines_of_their_own() {
        let s: Striped<std::sync::atomic::AtomicU64> = Striped::default();
        let a = s.lane(0) as *const _ as usize;
        let b = s.lane(1) as *const _ as usize;
        assert_eq!(b - a, 128);
        assert_eq!(a % 128, 0);
        assert_eq!(s.iter().count(), LANES);
    }
}
