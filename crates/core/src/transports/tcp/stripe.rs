//! Which lanes (data connections of a peer's pool) one request's shares go on: pure, the
//! pool's state, the submitting thread and the time passed in.
//!
//! A request of several slices is striped: its slices are dealt round robin into `ways`
//! shares, one per lane, each share written as one list: as many shares as slices, at
//! most [`STRIPE_WAYS`], and at most the lanes' share of each thread that stripes to the
//! peer now ([`RecentSubmitters`]). Each of those threads has a group of `ways` lanes of
//! its own (its rank among them picks the group), so that threads striping side by side
//! write to different sockets instead of queueing behind one another on the same ones;
//! the pool opens a group's lanes when a thread that wants them first submits. One thread
//! alone spreads a large request over several lanes, so that several cores copy it; as
//! many threads as lanes each keep a lane of their own, as many streams side by side do
//! (two threads striping 1 MiB over both lanes of a 2-core pool moved 7.2-7.6 GB/s, each
//! on its own lane 8.0-8.2, same run).

use std::sync::atomic::{AtomicU64, Ordering};

/// The most lanes one request is striped over. A request completes when its slowest share
/// does, and each lane it waits on is one more queue it may wait behind: a few lanes give
/// one large request several cores to be read on, and leave the rest of a many-lane pool
/// to other threads.
pub(super) const STRIPE_WAYS: usize = 4;

/// How long a thread that striped a request to a peer counts as one of its submitters:
/// it is forgotten one to two of these after its last striped request.
const SUBMITTER_EPOCH_NS: u64 = 50_000_000;

/// Where one request's shares go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stripe {
    /// Shares: one per lane used, at most one per slice.
    pub(super) ways: usize,
    /// The lane of share 0; share `i` goes on lane `first + i`.
    pub(super) first: usize,
    /// Lanes in use once this request is sent (the pool's `active` grows to it).
    pub(super) span: usize,
}

impl Stripe {
    /// The lane of share `share` (`share < ways`).
    pub(super) fn lane(&self, share: usize) -> usize {
        self.first + share
    }
}

/// The submitting thread among those striping to one peer now: its rank (from 0) and
/// how many they are (at least 1: itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Among {
    pub(super) rank: usize,
    pub(super) of: usize,
}

/// The stripe of a request of `slices` slices, sent by the thread `among` those striping
/// to the peer now, on a pool of `lanes` lanes of which the first `active` are in use.
pub(super) fn stripe(slices: usize, lanes: usize, active: usize, among: Among) -> Stripe {
    let lanes = lanes.max(1);
    let share = (lanes / among.of.max(1)).max(1);
    let ways = slices.clamp(1, share.min(STRIPE_WAYS));
    let groups = lanes / ways;
    let first = (among.rank % groups) * ways;
    Stripe {
        ways,
        first,
        span: active.max(first + ways).min(lanes),
    }
}

/// Lanes in use after a request on `span` of `lanes` lanes had a share wait behind other
/// frames (`waited`): one more, so that demand opens lanes and idle peers keep few.
pub(super) fn grown(span: usize, lanes: usize, waited: bool) -> usize {
    if waited {
        (span + 1).min(lanes)
    } else {
        span
    }
}

/// The threads (by their `lanes::current` index, modulo 64) that striped requests to one
/// peer lately: those of the current epoch and of the one before, so that a thread is
/// counted from its first striped request and forgotten within two epochs of its last.
/// Noted lock-free by each striping thread; a thread already noted this epoch only reads.
#[derive(Debug, Default)]
pub(super) struct RecentSubmitters {
    /// When the current epoch began, in nanoseconds of the caller's clock.
    epoch_start: AtomicU64,
    current: AtomicU64,
    previous: AtomicU64,
}

impl RecentSubmitters {
    /// Notes that `thread` stripes a request at `now_ns`, and says where it stands among
    /// the recent submitters.
    pub(super) fn note(&self, thread: usize, now_ns: u64) -> Among {
        let bit = 1u64 << (thread % 64);
        let start = self.epoch_start.load(Ordering::Relaxed);
        if now_ns.saturating_sub(start) >= SUBMITTER_EPOCH_NS
            && self
                .epoch_start
                .compare_exchange(start, now_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let ended = self.current.swap(0, Ordering::Relaxed);
            self.previous.store(ended, Ordering::Relaxed);
        }
        let mut current = self.current.load(Ordering::Relaxed);
        if current & bit == 0 {
            current = self.current.fetch_or(bit, Ordering::Relaxed) | bit;
        }
        let all = current | self.previous.load(Ordering::Relaxed);
        Among {
            rank: (all & (bit - 1)).count_ones() as usize,
            of: all.count_ones() as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes_of(s: Stripe) -> Vec<usize> {
        (0..s.ways).map(|i| s.lane(i)).collect()
    }

    fn nth(rank: usize, of: usize) -> Among {
        Among { rank, of }
    }

    #[test]
    fn threads_striping_side_by_side_use_lanes_of_their_own() {
        // 1 MiB in 512 KiB slices on a 4-core default of 4 lanes, two threads.
        let a = stripe(2, 4, 1, nth(0, 2));
        let b = stripe(2, 4, a.span, nth(1, 2));
        assert_eq!(lanes_of(a), vec![0, 1]);
        assert_eq!(lanes_of(b), vec![2, 3]);
        assert_eq!(b.span, 4);
        // Three threads: a lane each, and four lanes leave none to share.
        let three: Vec<Vec<usize>> = (0..3)
            .map(|r| lanes_of(stripe(2, 4, 4, nth(r, 3))))
            .collect();
        assert_eq!(three, vec![vec![0], vec![1], vec![2]]);
        // Five on four lanes: the fifth shares the first.
        assert_eq!(lanes_of(stripe(2, 4, 4, nth(4, 5))), vec![0]);
    }

    #[test]
    fn as_many_threads_as_lanes_each_keep_one_lane() {
        // The 2-core default, 2 lanes: one thread alone stripes over both; two side by
        // side each have one, as two streams would.
        assert_eq!(lanes_of(stripe(2, 2, 1, nth(0, 1))), vec![0, 1]);
        assert_eq!(lanes_of(stripe(2, 2, 2, nth(0, 2))), vec![0]);
        assert_eq!(lanes_of(stripe(2, 2, 2, nth(1, 2))), vec![1]);
        // 16 cores, 16 lanes, 16 threads of 16 MiB requests: a lane each.
        let lanes: Vec<Vec<usize>> = (0..16)
            .map(|r| lanes_of(stripe(32, 16, 16, nth(r, 16))))
            .collect();
        assert_eq!(lanes, (0..16).map(|l| vec![l]).collect::<Vec<_>>());
    }

    #[test]
    fn sixteen_threads_on_thirty_two_lanes_never_share_one() {
        // 64 cores: 32 lanes; 1 MiB requests in two slices each.
        let mut active = 1;
        let mut seen = Vec::new();
        for rank in 0..16 {
            let s = stripe(2, 32, active, nth(rank, 16));
            active = s.span;
            seen.extend(lanes_of(s));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..32).collect::<Vec<_>>());
        assert_eq!(active, 32);
    }

    #[test]
    fn more_slices_than_lanes_use_every_lane() {
        let s = stripe(32, 4, 1, nth(0, 1));
        assert_eq!(lanes_of(s), vec![0, 1, 2, 3]);
        assert_eq!(s.span, 4);
        // The 2-core default, one thread: every large request on both lanes.
        assert_eq!(lanes_of(stripe(32, 2, 2, nth(0, 1))), vec![0, 1]);
    }

    #[test]
    fn a_large_request_on_a_large_pool_takes_a_group_of_stripe_ways() {
        // 16 cores: 16 lanes; a 16 MiB request (32 slices) from each of 4 threads.
        let groups: Vec<Vec<usize>> = (0..4)
            .map(|r| lanes_of(stripe(32, 16, 16, nth(r, 4))))
            .collect();
        assert_eq!(groups[0], vec![0, 1, 2, 3]);
        assert_eq!(groups[3], vec![12, 13, 14, 15]);
        // Two threads alone: still at most STRIPE_WAYS lanes each.
        assert_eq!(lanes_of(stripe(32, 16, 16, nth(1, 2))), vec![4, 5, 6, 7]);
    }

    #[test]
    fn every_lane_is_within_the_pool_and_the_span() {
        for lanes in 1..=40 {
            for slices in 1..=70 {
                for active in 1..=lanes {
                    for of in 1..=20 {
                        for rank in 0..of {
                            let s = stripe(slices, lanes, active, nth(rank, of));
                            let share = (lanes / of).max(1);
                            assert_eq!(s.ways, slices.min(share).min(STRIPE_WAYS));
                            assert!(s.span <= lanes && s.span >= active);
                            let used = lanes_of(s);
                            assert!(used.iter().all(|&l| l < s.span));
                            let mut distinct = used.clone();
                            distinct.dedup();
                            assert_eq!(distinct.len(), used.len());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_pool_grows_by_one_lane_on_waiting_up_to_its_size() {
        assert_eq!(grown(2, 4, false), 2);
        assert_eq!(grown(2, 4, true), 3);
        assert_eq!(grown(4, 4, true), 4);
    }

    const EPOCH: u64 = SUBMITTER_EPOCH_NS;

    #[test]
    fn submitters_are_ranked_by_thread_and_counted_once() {
        let r = RecentSubmitters::default();
        assert_eq!(r.note(5, 1), nth(0, 1));
        assert_eq!(r.note(5, 2), nth(0, 1), "the same thread again");
        // Threads 2 and 9 join: ranks follow the thread indices, whatever the order.
        assert_eq!(r.note(9, 3), nth(1, 2));
        assert_eq!(r.note(2, 4), nth(0, 3));
        assert_eq!(r.note(5, 5), nth(1, 3));
        // Indices past 63 wrap (lanes::current is far below that).
        assert_eq!(r.note(64 + 5, 6), nth(1, 3));
    }

    #[test]
    fn a_thread_that_stopped_striping_is_forgotten_within_two_epochs() {
        let r = RecentSubmitters::default();
        r.note(0, 1);
        assert_eq!(r.note(1, 2), nth(1, 2));
        // Next epoch: thread 0 still counts (it striped in the one before).
        assert_eq!(r.note(1, EPOCH + 10), nth(1, 2));
        // The epoch after: only thread 1 striped in the last two.
        assert_eq!(r.note(1, 2 * EPOCH + 20), nth(0, 1));
    }
}
