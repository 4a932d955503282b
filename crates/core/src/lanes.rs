//! Lanes: what every submitting thread writes (the counters a task bumps as it ends, the
//! batch slots it takes and frees) is split into lanes, each on cache lines of its own, and
//! each thread writes the lane it was given. Two threads submitting at once then write no
//! cache line in common; on a 2-core VM one line bounced between cores costs about as much
//! as a 4 KiB copy, and a 4 KiB op wrote some forty of them before.
//!
//! Readers (metrics, close) visit every lane. A thread's lane is fixed at its first use:
//! the first lane no live thread holds, searched from a round-robin start, which the
//! thread then holds alone until it exits (counters it alone writes need no atomic add:
//! `tally.rs`); when every lane is held, it shares one, round robin, holding none.

use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::sync::{self, RwLock, RwLockReadGuard};

/// How many lanes each striped structure has.
pub(crate) const LANES: usize = 16;

/// Where the next thread starts looking for a lane.
static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);

/// Whether a live thread holds each lane alone. (Loom builds take no lane: their models
/// hand lanes over with [`claim`] on flags of their own.)
#[cfg(not(all(test, ferry_loom)))]
static HELD: [sync::AtomicBool; LANES] = [const { sync::AtomicBool::new(false) }; LANES];

/// The first lane of `held`, from `first` on (round), that nobody held, now held; `None`
/// when every one is. Acquires what the lane's last holder wrote before letting it go.
pub(crate) fn claim(held: &[sync::AtomicBool], first: usize) -> Option<usize> {
    (0..held.len())
        .map(|i| (first + i) % held.len())
        .find(|&l| {
            held[l]
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
}

/// A thread's lane, let go when the thread exits.
struct ThreadLane {
    lane: usize,
    alone: bool,
}

impl ThreadLane {
    fn take() -> Self {
        let first = NEXT_LANE.fetch_add(1, Ordering::Relaxed);
        #[cfg(not(all(test, ferry_loom)))]
        let claimed = claim(&HELD, first);
        #[cfg(all(test, ferry_loom))]
        let claimed = None;
        match claimed {
            Some(lane) => Self { lane, alone: true },
            None => Self {
                lane: first % LANES,
                alone: false,
            },
        }
    }
}

impl Drop for ThreadLane {
    fn drop(&mut self) {
        #[cfg(not(all(test, ferry_loom)))]
        if self.alone {
            // Releases what this thread wrote in its lane to the lane's next holder.
            HELD[self.lane].store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static LANE: ThreadLane = ThreadLane::take();
}

/// The lane of the calling thread, in `0..LANES`.
pub(crate) fn current() -> usize {
    held().0
}

/// The lane of the calling thread, and whether it holds it alone. A thread whose
/// thread-locals are being destroyed has let its lane go: it shares lane 0.
pub(crate) fn held() -> (usize, bool) {
    LANE.try_with(|l| (l.lane, l.alone)).unwrap_or((0, false))
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
    pub(crate) fn new(mut make: impl FnMut(usize) -> T) -> Self {
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
pub struct Lent<T>(sync::Arc<Padded<Arc<T>>>);

impl<T> Lent<T> {
    /// A lane's reference to `value`.
    pub fn new(value: Arc<T>) -> Self {
        Self(sync::Arc::new(Padded(value)))
    }

    /// The shared `Arc` itself (a reference taken on the count every lane shares).
    pub fn shared(&self) -> Arc<T> {
        Arc::clone(&self.0 .0)
    }
}

impl<T> Clone for Lent<T> {
    fn clone(&self) -> Self {
        Self(sync::Arc::clone(&self.0))
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

/// A table read on every request and written rarely (regions registered, segments opened),
/// whose values are handed out as [`Lent`] references. The table itself is one map behind
/// one lock; each lane keeps, behind a lock of its own, the loans its threads took, made
/// the first time one of them asks for a key. A reader that finds its loan takes only its
/// lane's lock, so threads on different lanes take different locks, and a value costs a
/// loan only in the lanes that used it.
pub(crate) struct LentTable<K, T> {
    table: RwLock<FxHashMap<K, Arc<T>>>,
    loans: Striped<RwLock<FxHashMap<K, Lent<T>>>>,
}

impl<K, T> Default for LentTable<K, T> {
    fn default() -> Self {
        Self {
            table: RwLock::new(FxHashMap::default()),
            loans: Striped::new(|_| RwLock::new(FxHashMap::default())),
        }
    }
}

impl<K: Eq + Hash + Clone, T> LentTable<K, T> {
    fn table(&self) -> RwLockReadGuard<'_, FxHashMap<K, Arc<T>>> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    fn loans(&self, lane: usize) -> &RwLock<FxHashMap<K, Lent<T>>> {
        self.loans.lane(lane)
    }

    /// A loan of the value under `key`, from the calling thread's lane.
    pub(crate) fn lend(&self, key: &K) -> Option<Lent<T>> {
        self.lend_in(current(), key)
    }

    /// Runs `f` on the calling thread's loan of the value under `key`, taking no reference
    /// (its lane's lock is held meanwhile: `f` must not lend from this table again); a lane
    /// that has no loan of it yet makes one first. `None` if there is no such key.
    pub(crate) fn with_loan<R>(&self, key: &K, f: impl FnOnce(&Lent<T>) -> R) -> Option<R> {
        let lane = current();
        {
            let loans = self.loans(lane).read().unwrap_or_else(|p| p.into_inner());
            if let Some(l) = loans.get(key) {
                return Some(f(l));
            }
        }
        let l = self.lend_in(lane, key)?;
        Some(f(&l))
    }

    fn lend_in(&self, lane: usize, key: &K) -> Option<Lent<T>> {
        let loans = self.loans(lane);
        if let Some(l) = loans.read().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Some(l.clone());
        }
        // The first loan of `key` in this lane is made under the table's read lock, so a
        // removal (which takes its write lock first) cannot slip in between: no loan of a
        // removed key is ever left in a lane. (`--cfg ferry_seed="lanes"` lets the lock go
        // too early, the race the model must catch.)
        let table = self.table();
        let value = table.get(key)?.clone();
        #[cfg(ferry_seed = "lanes")]
        drop(table);
        let mut loans = loans.write().unwrap_or_else(|p| p.into_inner());
        Some(
            loans
                .entry(key.clone())
                .or_insert_with(|| Lent::new(value))
                .clone(),
        )
    }

    /// The value under `key` itself (a reference on the count every lane shares).
    pub(crate) fn get(&self, key: &K) -> Option<Arc<T>> {
        self.table().get(key).cloned()
    }

    /// Puts `value` under `key`; returns the value it replaced.
    pub(crate) fn insert(&self, key: K, value: Arc<T>) -> Option<Arc<T>> {
        let old = self
            .table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), value);
        if old.is_some() {
            self.drop_loans(&key);
        }
        old
    }

    /// Takes `key` out of the table and every lane; returns its value.
    pub(crate) fn remove(&self, key: &K) -> Option<Arc<T>> {
        let old = self
            .table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.drop_loans(key);
        old
    }

    fn drop_loans(&self, key: &K) {
        for loans in self.loans.iter() {
            loans.write().unwrap_or_else(|p| p.into_inner()).remove(key);
        }
    }

    /// Empties the table and every lane.
    pub(crate) fn clear(&self) {
        self.table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        for loans in self.loans.iter() {
            loans.write().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Every value.
    pub(crate) fn values(&self) -> Vec<Arc<T>> {
        self.table().values().cloned().collect()
    }

    /// How many keys there are.
    pub(crate) fn len(&self) -> usize {
        self.table().len()
    }

    /// How many loans lane `lane` holds (tests).
    #[cfg(test)]
    fn loans_in(&self, lane: usize) -> usize {
        self.loans(lane)
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
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
    #[cfg(not(ferry_loom))] // loom builds take no lane (`HELD`)
    fn a_lane_is_held_by_one_thread_at_a_time_and_taken_again_once_let_go() {
        let flags: Vec<sync::AtomicBool> = (0..4).map(|_| sync::AtomicBool::new(false)).collect();
        // From the round-robin start on, the first lane nobody holds.
        assert_eq!(claim(&flags, 6), Some(2));
        assert_eq!(claim(&flags, 2), Some(3));
        assert_eq!(claim(&flags, 2), Some(0));
        assert_eq!(claim(&flags, 0), Some(1));
        assert_eq!(
            claim(&flags, 1),
            None,
            "every lane held: the thread shares one"
        );
        flags[3].store(false, Ordering::Release);
        assert_eq!(claim(&flags, 0), Some(3), "let go, taken again");
        // This thread holds its own lane alone, as long as it lives.
        let (lane, alone) = held();
        assert!(lane < LANES);
        if alone {
            assert!(HELD[lane].load(Ordering::Relaxed));
        }
    }

    #[test]
    fn a_loan_used_in_place_takes_no_reference() {
        let t: LentTable<u32, &str> = LentTable::default();
        t.insert(1, Arc::new("a"));
        assert_eq!(t.with_loan(&2, |_| ()), None, "no such key");
        // The first use in this lane makes its loan (and holds it for that use); later
        // uses take no reference to it.
        let counts = || t.with_loan(&1, |l| (***l, sync::Arc::strong_count(&l.0)));
        assert_eq!(counts().map(|(v, _)| v), Some("a"));
        assert_eq!(counts(), Some(("a", 1)));
        assert_eq!(counts(), Some(("a", 1)));
        assert_eq!(t.loans_in(current()), 1);
        t.remove(&1);
        assert_eq!(t.with_loan(&1, |_| ()), None, "removed from every lane");
    }

    #[test]
    fn a_lent_table_lends_per_lane_and_only_in_the_lanes_that_asked() {
        let t: LentTable<u32, &str> = LentTable::default();
        assert_eq!(t.insert(1, Arc::new("a")), None);
        assert_eq!(t.insert(2, Arc::new("c")), None);
        assert!(
            (0..LANES).all(|lane| t.loans_in(lane) == 0),
            "no loan before a lend"
        );
        let a0 = t.lend_in(0, &1).expect("lent");
        let again = t.lend_in(0, &1).expect("lent");
        assert!(
            sync::Arc::ptr_eq(&a0.0, &again.0),
            "one loan per lane and key"
        );
        let a3 = t.lend_in(3, &1).expect("lent");
        assert!(!sync::Arc::ptr_eq(&a0.0, &a3.0), "each lane its own count");
        assert_eq!((**a0, **a3), ("a", "a"));
        assert_eq!((t.loans_in(0), t.loans_in(3), t.loans_in(5)), (1, 1, 0));
        assert_eq!(t.lend_in(0, &9).map(|l| **l), None);
        // Replacing a value drops the loans of the old one.
        assert_eq!(t.insert(1, Arc::new("b")).map(|v| *v), Some("a"));
        assert_eq!((t.loans_in(0), t.loans_in(3)), (0, 0));
        assert_eq!(t.lend_in(3, &1).map(|l| **l), Some("b"));
        assert_eq!(t.get(&1).map(|v| *v), Some("b"));
        assert_eq!(t.lend(&2).map(|l| **l), Some("c"));
        assert_eq!(t.remove(&1).map(|v| *v), Some("b"));
        assert_eq!(t.remove(&1), None);
        // Lane 3 keeps no loan of the removed key; it holds the loan of key 2 just made if
        // it is this test thread's own lane (which lane a thread gets depends on the other
        // tests' threads).
        assert!(t.lend_in(3, &1).is_none());
        assert_eq!(t.loans_in(3), usize::from(current() == 3));
        let mut values: Vec<&str> = t.values().iter().map(|v| **v).collect();
        values.sort_unstable();
        assert_eq!(values, ["c"]);
        t.clear();
        assert_eq!(t.len(), 0);
        assert!((0..LANES).all(|lane| t.loans_in(lane) == 0));
    }

    #[test]
    fn a_lent_value_lives_while_the_table_or_any_loan_holds_it() {
        let value = Arc::new(5);
        let weak = Arc::downgrade(&value);
        let t: LentTable<u8, i32> = LentTable::default();
        t.insert(1, value);
        let loan = t.lend_in(0, &1).expect("lent");
        let other = t.lend_in(1, &1).expect("lent");
        // The table's reference, and one per lane that lent it.
        assert_eq!(weak.strong_count(), 3);
        drop(other);
        t.remove(&1);
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

/// Loom models of the lent table (`npm run test:model`): loans made in lanes while another
/// thread replaces or removes their value.
#[cfg(all(test, ferry_loom))]
mod model {
    use std::sync::Arc;

    use loom::thread;

    use super::{sync, Lent, LentTable, LANES};

    /// A value whose halves always agree: a lane that showed a mix of two would differ.
    type Pair = (u32, u32);

    const KEY: u8 = 7;

    /// What a loan shows, its halves checked.
    fn pair(loan: &Lent<Pair>) -> Pair {
        let pair: Pair = ***loan;
        assert_eq!(pair.0, pair.1, "a torn value");
        pair
    }

    fn table_with(value: &Arc<Pair>) -> sync::Arc<LentTable<u8, Pair>> {
        let table = sync::Arc::new(LentTable::default());
        table.insert(KEY, value.clone());
        table
    }

    /// A thread that lends `KEY` in `lane`, checks what it got, and hands the loan back.
    fn lender(
        table: &sync::Arc<LentTable<u8, Pair>>,
        lane: usize,
    ) -> thread::JoinHandle<Option<Lent<Pair>>> {
        let table = table.clone();
        thread::spawn(move || {
            let loan = table.lend_in(lane, &KEY);
            if let Some(l) = &loan {
                pair(l);
            }
            loan
        })
    }

    #[test]
    fn no_loan_of_a_removed_key_is_left_in_any_lane() {
        loom::model(|| {
            let value = Arc::new((1, 1));
            let table = table_with(&value);
            let lending = [lender(&table, 1), lender(&table, 2)];
            let removed = table.remove(&KEY).expect("was there");
            assert!(Arc::ptr_eq(&removed, &value));
            drop(removed);
            let loans = lending.map(|l| l.join().expect("lender"));
            assert!(
                (0..LANES).all(|lane| table.loans_in(lane) == 0),
                "a lane kept a loan of a removed key"
            );
            assert!(table.lend_in(1, &KEY).is_none());
            // Counts add up: ours, and each lender's loan if it got one in time.
            let mut lent = 0;
            for loan in loans.iter().flatten() {
                assert_eq!(pair(loan), (1, 1));
                lent += 1;
            }
            assert_eq!(Arc::strong_count(&value), 1 + lent);
            // A loan keeps the value alive after the table let go of it.
            for loan in loans.into_iter().flatten() {
                let shared = loan.shared();
                drop(loan);
                assert_eq!(*shared, (1, 1));
            }
            assert_eq!(Arc::strong_count(&value), 1);
        });
    }

    #[test]
    fn once_a_value_is_replaced_every_lane_lends_the_new_one() {
        loom::model(|| {
            let old = Arc::new((1, 1));
            let new = Arc::new((2, 2));
            let table = table_with(&old);
            // Two threads of one lane: their first loans race each other too.
            let lending = [lender(&table, 1), lender(&table, 1)];
            let replaced = table.insert(KEY, new.clone()).expect("was there");
            assert!(Arc::ptr_eq(&replaced, &old));
            drop(replaced);
            let [a, b] = lending.map(|l| l.join().expect("lender"));
            let (a, b) = (a.expect("lent"), b.expect("lent"));
            // Lent before the replacement, both under the table's read lock: one loan. (Two
            // loans of the new value can be: the replacement may drop the first one made.)
            if pair(&a) == (1, 1) && pair(&b) == (1, 1) {
                assert!(sync::Arc::ptr_eq(&a.0, &b.0), "two loans in one lane");
            }
            for lane in [0, 1] {
                let again = table.lend_in(lane, &KEY).as_ref().map(pair);
                assert_eq!(again, Some((2, 2)), "lane {lane} lent a replaced value");
            }
            // Counts add up: the old value is held by ours and the loans the lenders got of
            // it; the new one by ours, the table's and one loan in each of the two lanes.
            let of_old = [&a, &b].iter().filter(|l| pair(l) == (1, 1)).count();
            assert_eq!(Arc::strong_count(&old), 1 + usize::from(of_old > 0));
            drop((a, b));
            assert_eq!(Arc::strong_count(&old), 1);
            assert_eq!(Arc::strong_count(&new), 1 + 1 + 2);
            table.clear();
            assert_eq!(Arc::strong_count(&new), 1);
        });
    }
}
