//! The budget of connections that have not proved the cluster secret yet: at most
//! `per_source` from one source address and `total` in all, apart from what authenticated
//! peers hold.
//!
//! A connection over the budget is not refused: it takes the place of the oldest handshake
//! of the source that holds the most (its own source, when that one is full). Refusing it
//! instead would let whoever fills the budget first — with connections that never send a
//! byte, and reopen as fast as they time out — lock every later peer out. Pushing the
//! oldest out means idle and slow connections age out as new ones arrive, one source's
//! flood pushes out only its own, and a peer's handshake is lost only if `per_source`
//! newer connections from its address (or `total` from everywhere) arrive before it
//! completes, which takes a round trip or two.
//!
//! The budget never takes more than a quarter of the process's open-file limit
//! (`fitted_to_open_files`): a handshake holds a descriptor, and the rest must stay for the
//! authenticated peers, their data connections and the engine's own files.
//!
//! Pure: no sockets and no clock; arrival order is the only time it knows, and the
//! open-file limit is passed in.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// The share of the soft open-file limit (`RLIMIT_NOFILE`) handshakes may hold: one in
/// `OPEN_FILES_SHARE`.
pub(crate) const OPEN_FILES_SHARE: u64 = 4;
/// The budget's floor, whatever the limit: a process allowed so few descriptors still
/// lets peers in, a few at a time.
pub(crate) const MIN_HANDSHAKES: usize = 16;

/// The budget (`total`, `per_source`) that fits a process allowed `nofile` open files (its
/// soft `RLIMIT_NOFILE`; `None`: unlimited or unknown): the configured caps, lowered to a
/// quarter of the limit (at least `MIN_HANDSHAKES`, never above what was configured), and
/// the per-source cap to the total.
pub(crate) fn fitted_to_open_files(
    total: usize,
    per_source: usize,
    nofile: Option<u64>,
) -> (usize, usize) {
    let share = nofile.map_or(usize::MAX, |n| {
        usize::try_from(n / OPEN_FILES_SHARE).unwrap_or(usize::MAX)
    });
    let total = total.min(share.max(MIN_HANDSHAKES));
    (total, per_source.min(total))
}

/// Handshakes in progress by source, in arrival order, each with a value the caller uses
/// to end a handshake that is pushed out (`V`).
#[derive(Debug)]
pub(crate) struct Handshakes<K, V> {
    total: usize,
    per_source: usize,
    next_id: u64,
    held: usize,
    by_source: HashMap<K, BTreeMap<u64, V>>,
}

/// A handshake counted by [`Handshakes::enter`], and the one it pushed out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Entered<V> {
    /// Names the new handshake for [`Handshakes::leave`].
    pub(crate) id: u64,
    /// The value of the handshake pushed out to make room, if one was.
    pub(crate) evicted: Option<V>,
}

impl<K: Hash + Eq + Clone, V> Handshakes<K, V> {
    /// An empty budget; both caps are at least 1.
    pub(crate) fn new(total: usize, per_source: usize) -> Self {
        Self {
            total: total.max(1),
            per_source: per_source.max(1),
            next_id: 0,
            held: 0,
            by_source: HashMap::new(),
        }
    }

    /// Counts a new handshake from `source`, pushing out the oldest of its source when that
    /// source is at its cap, else the oldest of the fullest source when the total is.
    pub(crate) fn enter(&mut self, source: K, value: V) -> Entered<V> {
        let from_source = self.by_source.get(&source).map_or(0, BTreeMap::len);
        let evicted = if from_source >= self.per_source {
            self.evict_oldest_of(&source)
        } else if self.held >= self.total {
            self.fullest().and_then(|k| self.evict_oldest_of(&k))
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        self.by_source.entry(source).or_default().insert(id, value);
        self.held += 1;
        Entered { id, evicted }
    }

    /// Ends handshake `id` of `source` (completed or given up); `None` if it is not held
    /// (it was pushed out, or ended before).
    pub(crate) fn leave(&mut self, source: &K, id: u64) -> Option<V> {
        let queue = self.by_source.get_mut(source)?;
        let value = queue.remove(&id)?;
        if queue.is_empty() {
            self.by_source.remove(source);
        }
        self.held -= 1;
        Some(value)
    }

    /// Handshakes held now, every source together.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held
    }

    /// The source holding the most handshakes; among equals, the one whose oldest arrived
    /// first.
    fn fullest(&self) -> Option<K> {
        self.by_source
            .iter()
            .filter_map(|(k, q)| Some((q.len(), *q.keys().next()?, k)))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, _, k)| k.clone())
    }

    fn evict_oldest_of(&mut self, source: &K) -> Option<V> {
        let oldest = *self.by_source.get(source)?.keys().next()?;
        self.leave(source, oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_takes_at_most_a_quarter_of_the_open_file_limit() {
        // The defaults, where the limit is large (or unknown): unchanged.
        assert_eq!(fitted_to_open_files(1024, 256, None), (1024, 256));
        assert_eq!(fitted_to_open_files(1024, 256, Some(1 << 20)), (1024, 256));
        assert_eq!(fitted_to_open_files(1024, 256, Some(4096)), (1024, 256));
        // The common soft limit of 1024: 256 handshakes, and one source may hold them all
        // (a full total pushes out the fullest source's oldest, so others still get in).
        assert_eq!(fitted_to_open_files(1024, 256, Some(1024)), (256, 256));
        assert_eq!(fitted_to_open_files(1024, 256, Some(400)), (100, 100));
        // Never below the floor, never above what was configured.
        assert_eq!(fitted_to_open_files(1024, 256, Some(20)), (16, 16));
        assert_eq!(fitted_to_open_files(1024, 256, Some(0)), (16, 16));
        assert_eq!(fitted_to_open_files(8, 2, Some(20)), (8, 2));
        assert_eq!(fitted_to_open_files(8, 2, Some(u64::MAX)), (8, 2));
        // Whatever the limit, handshakes and what is left for everything else add up to
        // it: at most a quarter (or the floor) is the budget's.
        for nofile in [64u64, 100, 1000, 1024, 4000, 20_000] {
            let (total, per) = fitted_to_open_files(1024, 256, Some(nofile));
            assert!(total as u64 <= (nofile / 4).max(16), "{nofile}: {total}");
            assert!(per <= total);
        }
    }

    #[test]
    fn a_full_source_pushes_out_its_own_oldest_and_no_one_elses() {
        let mut h = Handshakes::new(100, 3);
        for v in 0..3 {
            assert_eq!(h.enter("flood", v).evicted, None);
        }
        let peer = h.enter("peer", 100);
        assert_eq!(h.enter("flood", 3).evicted, Some(0));
        assert_eq!(h.enter("flood", 4).evicted, Some(1));
        assert_eq!(h.len(), 4);
        // The peer's handshake was never touched.
        assert_eq!(h.leave(&"peer", peer.id), Some(100));
        assert_eq!(h.leave(&"peer", peer.id), None, "ended once");
    }

    #[test]
    fn a_handshake_survives_until_per_source_newer_ones_from_its_source_arrive() {
        let mut h = Handshakes::new(1000, 4);
        for v in 0..4 {
            h.enter("a", v);
        }
        // The peer arrives amid a flood from its own address.
        let peer = h.enter("a", 99);
        assert_eq!(peer.evicted, Some(0));
        let pushed: Vec<_> = (10..13).filter_map(|v| h.enter("a", v).evicted).collect();
        assert_eq!(pushed, vec![1, 2, 3], "the older ones go first");
        // Completed before the fourth newer one: still held.
        assert_eq!(h.leave(&"a", peer.id), Some(99));
        // Had it not, the fourth would have pushed it out.
        let late = h.enter("a", 98);
        let pushed: Vec<_> = (20..24).filter_map(|v| h.enter("a", v).evicted).collect();
        assert!(pushed.contains(&98), "{pushed:?}");
        assert_eq!(h.leave(&"a", late.id), None, "pushed out");
    }

    #[test]
    fn a_full_total_pushes_out_the_oldest_of_the_fullest_source() {
        let mut h = Handshakes::new(5, 10);
        h.enter("b", 0);
        for v in 1..4 {
            h.enter("a", v);
        }
        h.enter("c", 4);
        // "a" holds the most: its oldest goes, though "b"'s is older.
        assert_eq!(h.enter("d", 5).evicted, Some(1));
        assert_eq!(h.enter("d", 6).evicted, Some(2));
        // "d" alone holds two now.
        assert_eq!(h.enter("e", 7).evicted, Some(5));
        // Each holds one: the oldest of all goes.
        assert_eq!(h.enter("e", 8).evicted, Some(0));
        assert_eq!(h.len(), 5);
    }

    #[test]
    fn leaving_frees_room_and_ids_are_never_reused() {
        let mut h = Handshakes::new(2, 2);
        let a = h.enter("x", 'a');
        let b = h.enter("x", 'b');
        assert_eq!(h.leave(&"x", a.id), Some('a'));
        let c = h.enter("x", 'c');
        assert_eq!(c.evicted, None, "room was freed");
        assert!(c.id != a.id && c.id != b.id);
        assert_eq!(h.leave(&"y", c.id), None, "another source's id");
        assert_eq!(h.len(), 2);
    }
}
