//! Counters each thread writes alone: [`Owned`] keeps one `T` per lane plus one shared
//! slot, and a thread writes only the slot [`Owned::local`] gives it — its own lane's while
//! it holds that lane alone (`lanes.rs`), the shared slot otherwise. A [`Tally`] in a slot
//! written alone is added to by a load and a store: no atomic add, which costs a 4 KiB shm
//! op several nanoseconds a counter on these VMs (it bumps six). Readers load every slot.
//!
//! A lane's holder lets it go when its thread exits (a release store); the next thread to
//! take the lane acquires it first, so it adds to what the last holder wrote.

use std::sync::atomic::Ordering;

use crate::lanes::{self, Padded, LANES};
use crate::sync::AtomicU64;

/// How a thread writes the slot it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Writer {
    alone: bool,
}

impl Writer {
    /// For a counter any thread may write: atomic adds.
    pub(crate) const SHARED: Self = Self { alone: false };
}

/// A count only ever added to.
#[derive(Debug, Default)]
pub(crate) struct Tally(AtomicU64);

impl Tally {
    /// Adds `n` (wrapping). `writer` must be the one [`Owned::local`] gave with this
    /// tally's slot, or [`Writer::SHARED`].
    #[inline]
    pub(crate) fn add(&self, n: u64, writer: Writer) {
        if writer.alone {
            // Nobody else writes this slot while its thread holds the lane.
            let v = self.0.load(Ordering::Relaxed);
            self.0.store(v.wrapping_add(n), Ordering::Relaxed);
        } else {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The count.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One `T` per lane, and one more that threads holding no lane alone share.
#[derive(Debug)]
pub(crate) struct Owned<T> {
    slots: Box<[Padded<T>]>,
}

impl<T: Default> Default for Owned<T> {
    fn default() -> Self {
        Self {
            slots: (0..=LANES).map(|_| Padded(T::default())).collect(),
        }
    }
}

impl<T> Owned<T> {
    /// The calling thread's slot and how it writes it.
    #[inline]
    pub(crate) fn local(&self) -> (&T, Writer) {
        self.slot(lanes::held())
    }

    /// The slot of a thread on `lane`, holding it alone or not.
    fn slot(&self, (lane, alone): (usize, bool)) -> (&T, Writer) {
        let i = if alone { lane % LANES } else { LANES };
        (&self.slots[i], Writer { alone })
    }

    /// Every slot, to read.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}

#[cfg(all(test, not(ferry_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_alone_on_its_lane_writes_that_lane_and_the_others_share_one_slot() {
        let owned: Owned<Tally> = Owned::default();
        let (mine, w) = owned.slot((3, true));
        mine.add(5, w);
        let (shared, s) = owned.slot((3, false));
        shared.add(7, s);
        assert_eq!(s, Writer::SHARED);
        let counts: Vec<u64> = owned.iter().map(Tally::get).collect();
        assert_eq!(counts.len(), LANES + 1);
        assert_eq!((counts[3], counts[LANES]), (5, 7));
        assert_eq!(counts.iter().sum::<u64>(), 12);
    }

    /// More threads than lanes, all adding at once: the ones holding a lane alone add
    /// without atomics, the rest share a slot; not one add is lost.
    #[test]
    fn adds_from_more_threads_than_lanes_are_all_counted() {
        const THREADS: usize = LANES + 4;
        const ADDS: u64 = 20_000;
        let owned: Owned<Tally> = Owned::default();
        // Every thread takes its lane before any adds, and none exits (letting its lane
        // go) before all have added.
        let (start, done) = (
            std::sync::Barrier::new(THREADS),
            std::sync::Barrier::new(THREADS),
        );
        let mut alone: Vec<usize> = std::thread::scope(|s| {
            let all: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        let held = lanes::held();
                        start.wait();
                        let (tally, w) = owned.local();
                        for _ in 0..ADDS {
                            tally.add(1, w);
                        }
                        done.wait();
                        held
                    })
                })
                .collect();
            all.into_iter()
                .map(|t| t.join().expect("adder"))
                .filter_map(|(lane, alone)| alone.then_some(lane))
                .collect()
        });
        assert_eq!(
            owned.iter().map(Tally::get).sum::<u64>(),
            THREADS as u64 * ADDS
        );
        let holders = alone.len();
        alone.sort_unstable();
        alone.dedup();
        assert_eq!(alone.len(), holders, "two live threads held one lane alone");
        assert!(holders < THREADS, "more threads than lanes: some shared");
    }
}

/// Loom model (`npm run test:model`): a lane let go by one thread and taken by another,
/// each adding without atomics while it holds it, beside a thread on the shared slot.
#[cfg(all(test, ferry_loom))]
mod model {
    use loom::thread;

    use super::*;
    use crate::sync::{Arc, AtomicBool};

    #[test]
    fn a_lane_handed_from_thread_to_thread_loses_no_add() {
        loom::model(|| {
            let owned: Arc<Owned<Tally>> = Arc::new(Owned::default());
            let held = Arc::new([AtomicBool::new(false)]);
            let holder = |n: u64| {
                let (owned, held) = (owned.clone(), held.clone());
                thread::spawn(move || {
                    // Take lane 0 when it is free (the other holder may have it).
                    loop {
                        if crate::lanes::claim(&held[..], 0) == Some(0) {
                            break;
                        }
                        thread::yield_now();
                    }
                    let (tally, w) = owned.slot((0, true));
                    tally.add(n, w);
                    tally.add(n, w);
                    held[0].store(false, Ordering::Release);
                })
            };
            let a = holder(1);
            let b = holder(10);
            let (shared, w) = owned.slot((0, false));
            shared.add(100, w);
            a.join().expect("a");
            b.join().expect("b");
            let counts: Vec<u64> = owned.iter().map(Tally::get).collect();
            assert_eq!(counts[0], 22, "an add lost in the handover");
            assert_eq!(counts[LANES], 100);
        });
    }
}
