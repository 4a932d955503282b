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
}

impl Stall {
    /// Stuck once frames are outstanding and unanswered for `limit`.
    pub(super) fn new(limit: Duration) -> Self {
        Self { limit, quiet: None }
    }

    /// How often to sample: a small part of the limit, so the verdict comes at most that
    /// late, and seldom enough to cost nothing.
    pub(super) fn period(&self) -> Duration {
        (self.limit / 10).clamp(Duration::from_millis(5), Duration::from_millis(100))
    }

    /// One sample at `now`: whether frames are outstanding, and how many replies the
    /// connection has read so far. True when it is stuck.
    pub(super) fn sample(&mut self, now: Instant, outstanding: bool, replies: u64) -> bool {
        if !outstanding {
            self.quiet = None;
            return false;
        }
        match self.quiet {
            Some((seen, since)) if seen == replies => {
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

    #[test]
    fn outstanding_frames_with_no_reply_for_the_limit_are_a_stall() {
        let t0 = Instant::now();
        let mut s = Stall::new(ms(100));
        assert!(!s.sample(t0, true, 7), "first sight starts the clock");
        assert!(!s.sample(t0 + ms(99), true, 7));
        assert!(s.sample(t0 + ms(100), true, 7), "no reply for the limit");
    }

    #[test]
    fn a_reply_or_an_idle_connection_restarts_the_clock() {
        let t0 = Instant::now();
        let mut s = Stall::new(ms(100));
        assert!(!s.sample(t0, true, 1));
        // Replies keep coming: a long queue draining is never a stall.
        for i in 1..50u64 {
            assert!(!s.sample(t0 + ms(60 * i), true, 1 + i));
        }
        // Idle (nothing outstanding) for a long time, then work with no reply yet.
        assert!(!s.sample(t0 + ms(5000), false, 50));
        assert!(!s.sample(t0 + ms(9000), true, 50));
        assert!(!s.sample(t0 + ms(9099), true, 50));
        assert!(s.sample(t0 + ms(9100), true, 50));
    }

    #[test]
    fn samples_come_at_a_tenth_of_the_limit_within_bounds() {
        assert_eq!(Stall::new(ms(1000)).period(), ms(100));
        assert_eq!(Stall::new(ms(200)).period(), ms(20));
        assert_eq!(Stall::new(ms(10)).period(), ms(5));
        assert_eq!(Stall::new(Duration::from_secs(3600)).period(), ms(100));
    }
}
