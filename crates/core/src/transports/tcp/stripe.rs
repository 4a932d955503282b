//! Which lanes (data connections of a peer's pool) one request's shares go on: pure, the
//! pool's state and the submitting thread passed in.
//!
//! A request of several slices is striped: its slices are dealt round robin into `ways`
//! shares, one per lane, each share written as one list: as many shares as slices, at
//! most [`STRIPE_WAYS`] and at most the lanes. Each submitting thread has a group of
//! `ways` lanes of its own (its `lanes::current` index picks the group), so that threads
//! striping side by side write to different sockets instead of queueing behind one
//! another on the same ones; the pool opens a group's lanes when a thread that wants them
//! first submits.

/// The most lanes one request is striped over. A request completes when its slowest share
/// does, and each lane it waits on is one more queue it may wait behind: a few lanes give
/// one large request several cores to be read on, and leave the rest of a many-lane pool
/// to other threads.
pub(super) const STRIPE_WAYS: usize = 4;

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

/// The stripe of a request of `slices` slices, sent by the thread of index `thread`,
/// on a pool of `lanes` lanes of which the first `active` are in use.
pub(super) fn stripe(slices: usize, lanes: usize, active: usize, thread: usize) -> Stripe {
    let lanes = lanes.max(1);
    let ways = slices.clamp(1, lanes.min(STRIPE_WAYS));
    let groups = lanes / ways;
    let first = (thread % groups) * ways;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes_of(s: Stripe) -> Vec<usize> {
        (0..s.ways).map(|i| s.lane(i)).collect()
    }

    #[test]
    fn threads_striping_side_by_side_use_lanes_of_their_own() {
        // 1 MiB in 512 KiB slices on a 4-core default of 4 lanes.
        let a = stripe(2, 4, 1, 0);
        let b = stripe(2, 4, a.span, 1);
        assert_eq!(lanes_of(a), vec![0, 1]);
        assert_eq!(lanes_of(b), vec![2, 3]);
        assert_eq!(b.span, 4);
        // A third thread shares the first group again.
        assert_eq!(lanes_of(stripe(2, 4, 4, 2)), vec![0, 1]);
    }

    #[test]
    fn sixteen_threads_on_thirty_two_lanes_never_share_one() {
        // 64 cores: 32 lanes; 1 MiB requests in two slices each.
        let mut active = 1;
        let mut seen = Vec::new();
        for thread in 0..16 {
            let s = stripe(2, 32, active, thread);
            active = s.span;
            seen.extend(lanes_of(s));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..32).collect::<Vec<_>>());
        assert_eq!(active, 32);
    }

    #[test]
    fn more_slices_than_lanes_use_every_lane() {
        let s = stripe(32, 4, 1, 3);
        assert_eq!(lanes_of(s), vec![0, 1, 2, 3]);
        assert_eq!(s.span, 4);
        // The 2-core default: every large request on both lanes.
        assert_eq!(lanes_of(stripe(2, 2, 1, 1)), vec![0, 1]);
        assert_eq!(lanes_of(stripe(32, 2, 2, 0)), vec![0, 1]);
    }

    #[test]
    fn a_large_request_on_a_large_pool_takes_a_group_of_stripe_ways() {
        // 16 cores: 16 lanes; a 16 MiB request (32 slices) from each of 4 threads.
        let groups: Vec<Vec<usize>> = (0..4).map(|t| lanes_of(stripe(32, 16, 16, t))).collect();
        assert_eq!(groups[0], vec![0, 1, 2, 3]);
        assert_eq!(groups[3], vec![12, 13, 14, 15]);
        assert_eq!(lanes_of(stripe(32, 16, 16, 4)), vec![0, 1, 2, 3]);
    }

    #[test]
    fn every_lane_is_within_the_pool_and_the_span() {
        for lanes in 1..=40 {
            for slices in 1..=70 {
                for active in 1..=lanes {
                    for thread in 0..20 {
                        let s = stripe(slices, lanes, active, thread);
                        assert_eq!(s.ways, slices.min(lanes).min(STRIPE_WAYS));
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

    #[test]
    fn a_pool_grows_by_one_lane_on_waiting_up_to_its_size() {
        assert_eq!(grown(2, 4, false), 2);
        assert_eq!(grown(2, 4, true), 3);
        assert_eq!(grown(4, 4, true), 4);
    }
}
