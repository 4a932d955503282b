//! When a pool connection is stuck: frames outstanding and no reply for the attempt
//! deadline. Attempts are timed from when their frames go out (`Transport::reports_starts`),
//! so work queued behind a connection runs no clock of its own; this is what bounds its
//! wait when the peer stops answering. Pure: the connection's actor samples it (time
//! passed in) and breaks the connection, failing what it holds, when it says so.
//!
//! It never fires before the oldest outstanding frame has passed the deadline: frames
//! leave the books only by a reply (or with the connection), so with no reply since the
//! sample at `since`, the frames outstanding then are outstanding still, and the oldest
//! went out at `since` or before.

use std::time::{Duration, Instant};

/// Watches one connection for a stall.
#[derive(Debug)]
pub(super) struct Stall {
    limit: Duration,
    /// Replies counted, and since when that count has held with frames outstanding.
    quiet: Option<(u64, Instant)>,
    /// The previous sample.
    last: Option<Instant>,
}

impl Stall {
    /// Stuck once frames are outstanding and unanswered for `limit`.
    pub(super) fn new(limit: Duration) -> Self {
        Self {
            limit,
            quiet: None,
            last: None,
        }
    }

    /// How often to sample: a small part of the limit, so the verdict comes at most that
    /// late, and seldom enough to cost nothing.
    pub(super) fn period(&self) -> Duration {
        (self.limit / 10).clamp(Duration::from_millis(5), Duration::from_millis(100))
    }

    /// One sample at `now`: whether frames are outstanding, and how many replies the
    /// connection has read so far. True when it is stuck.
    ///
    /// A sample that comes more than two periods after the previous one means this side
    /// did not run meanwhile (a loaded machine): replies that arrived may still be unread,
    /// so the verdict waits one more period for them, as the control link does for its
    /// heartbeats (`liveness`).
    pub(super) fn sample(&mut self, now: Instant, outstanding: bool, replies: u64) -> bool {
        let period = self.period();
        let late = self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > period * 2);
        self.last = Some(now);
        if !outstanding {
            self.quiet = None;
            return false;
        }
        match self.quiet {
            Some((seen, since)) if seen == replies => {
                if late {
                    let grace = (now + period).checked_sub(self.limit);
                    self.quiet = Some((seen, grace.map_or(since, |g| g.max(since))));
                    return false;
                }
                now.saturating_duration_since(since) >= self.limit
            }
            _ => {
                self.quiet = Some((replies, now));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Samples `s` every period from `from` up to `to` (not included) with `replies`;
    /// whether any said stuck.
    fn run(s: &mut Stall, from: Instant, to: Instant, replies: impl Fn(Instant) -> u64) -> bool {
        let mut at = from;
        let mut stuck = false;
        while at < to {
            stuck |= s.sample(at, true, replies(at));
            at += s.period();
        }
        stuck
    }

    #[test]
    fn outstanding_frames_with_no_reply_for_the_limit_are_a_stall() {
        let t0 = Instant::now();
        let mut s = Stall::new(ms(100));
        assert!(
            !run(&mut s, t0, t0 + ms(100), |_| 7),
            "not before the limit"
        );
        assert!(s.sample(t0 + ms(100), true, 7), "no reply for the limit");
    }

    #[test]
    fn a_reply_or_an_idle_connection_restarts_the_clock() {
        let t0 = Instant::now();
        let mut s = Stall::new(ms(100));
        // Replies keep coming (one every 60 ms): a long queue draining is never a stall.
        let replies = |at: Instant| (at - t0).as_millis() as u64 / 60;
        assert!(!run(&mut s, t0, t0 + ms(3000), replies));
        // Idle (nothing outstanding), then work with no reply yet.
        for i in 0..10 {
            assert!(!s.sample(t0 + ms(3000 + 10 * i), false, 50));
        }
        assert!(!run(&mut s, t0 + ms(3100), t0 + ms(3200), |_| 50));
        assert!(s.sample(t0 + ms(3200), true, 50));
    }

    #[test]
    fn a_sample_after_this_side_stalled_waits_one_more_period_for_the_replies() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut s = Stall::new(ms(100));
        assert_eq!(s.period(), ms(10));
        assert!(!s.sample(t0, true, 3));
        assert!(!s.sample(t0 + ms(10), true, 3));
        // This side stops running for 500 ms: the next sample does not judge.
        assert!(!s.sample(t0 + ms(510), true, 3));
        assert!(!s.sample(t0 + ms(515), true, 3));
        // The replies read meanwhile clear it; without any, it is stuck a period later.
        let mut heard = Stall::new(ms(100));
        heard.sample(t0, true, 3);
        heard.sample(t0 + ms(510), true, 3);
        assert!(!heard.sample(t0 + ms(520), true, 4));
        assert!(s.sample(t0 + ms(520), true, 3));
        // Samples a little late (under two periods) keep the verdict on time.
        let mut on_time = Stall::new(ms(100));
        for at in (0..100).step_by(15) {
            assert!(!on_time.sample(t0 + ms(at), true, 1));
        }
        assert!(on_time.sample(t0 + ms(105), true, 1));
    }

    #[test]
    fn samples_come_at_a_tenth_of_the_limit_within_bounds() {
        assert_eq!(Stall::new(ms(1000)).period(), ms(100));
        assert_eq!(Stall::new(ms(200)).period(), ms(20));
        assert_eq!(Stall::new(ms(10)).period(), ms(5));
        assert_eq!(Stall::new(Duration::from_secs(3600)).period(), ms(100));
    }
}
