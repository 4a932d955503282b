//! Peer liveness as a state machine: a link to a peer is connecting, up (pinging, and
//! listening for any frame), or waiting to reconnect. Fed with what happened and `now`;
//! it says what to do next. Pure: `control.rs` drives it over a socket and tokio timers,
//! and the tests drive it on simulated time.
//!
//! - Up: a ping goes out on connect and every `interval` (a quarter of the timeout, at
//!   least 20 ms). Any authenticated frame of the peer's incarnation is heard: the link's
//!   own frames, and the replies other connections get from it (`signs_of_life`, sampled
//!   by the driver: a busy peer's pong may lag behind its data replies). A peer not heard
//!   from for `timeout` is lost — at exactly `last_heard + timeout` on a side that runs
//!   when due — but time this side itself was not running is not the peer's silence:
//!   - a poll later than what was due by more than `STALL_SLACK` credits twice the
//!     excess (`starved`, at most one timeout in all since the peer was last heard) to
//!     the silence's deadline and to a direct check's: this side did not run, and an
//!     answer that came meanwhile may still wait unread;
//!   - a poll more than an interval after a ping was due, past the deadline still, gets a
//!     ping and one more interval (a stall longer than the credit's cap).
//!
//!   So a dead or hung peer is lost `timeout` after it was last heard, plus what this
//!   side lost to its own stalls (at most one more timeout, and an interval).
//! - A broken or silent link waits a backoff before it reconnects: 100 ms, doubling to
//!   5 s, each delay with ±20 % jitter so that peers do not reconnect in lockstep; a
//!   connection resets it.
//! - A direct check (asked for when the peer's etcd record went away): ping now; a frame
//!   heard within `CHECK_TIMEOUT` (at most the timeout) answers it, else the peer is lost
//!   for the reason the check was asked with. Only the link decides: a record that goes
//!   while the peer answers (etcd paused, its lease expired) loses no one. A link that is
//!   not up has no check to make: connecting, or failing to, decides as it does anyway.
//! - Loss is reported once per loss; recovery once per recovery (the peer's own flag,
//!   shared with the other sources of loss — the same-host watcher — decides).

use std::fmt;
use std::time::{Duration, Instant};

use crate::numbered::Numbered;

/// First reconnect delay after a lost link.
pub(crate) const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest reconnect delay (before jitter).
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Jitter applied to each delay: ± this many percent.
pub(crate) const JITTER_PERCENT: u64 = 20;
/// Shortest heartbeat interval.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(20);
/// How long a direct check waits for the peer to be heard (unless the timeout is
/// shorter): long enough for a loaded peer to answer a ping, short enough that a hung
/// peer whose lease expired is lost well before a long peer timeout.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_millis(1500);
/// How late a poll may be before the lateness counts as this side's own stall: timer
/// wake-ups are a millisecond or so late on any machine, and counting those would only
/// move the deadline by as much again.
pub(crate) const STALL_SLACK: Duration = Duration::from_millis(25);

/// Why a peer was declared lost, with what was seen (`kind` is what users branch on:
/// closed, crashed, timed out or restarted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// No frame heard for the whole timeout.
    Silent {
        /// The timeout, in ms.
        timeout_ms: u64,
    },
    /// The peer said goodbye: its engine closed (`close()` sends one on every control
    /// connection and shm connection before it lets go of them).
    Closed,
    /// The control connection failed (reset, or closed without a goodbye).
    Broken(String),
    /// Connecting (or the descriptor refresh after a restart) failed.
    Unreachable(String),
    /// Its etcd record went away (lease expired or engine closed) and it did not answer the
    /// direct check that followed.
    RecordRemoved,
    /// A transport found it dead (e.g. the same-host process exited).
    Transport(String),
    /// A new incarnation of the peer answered under its name: the one this engine knew is
    /// gone, and with it everything planned against it.
    Restarted {
        /// The new incarnation's engine id.
        engine_id: u64,
    },
}

/// Why a peer was declared lost, without the details: what the `peerLost` event and a
/// peer-loss failure carry, by a stable number (the discriminant). A number never changes
/// meaning; 2 (a control connection closed, now `Crashed` unless the peer said goodbye),
/// 4 (unreachable, now `Crashed`), 5 (etcd record removed, now `Timeout`) and 6 (a
/// transport saw the death, now `Crashed`) are retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LossKind {
    /// Silence: no heartbeat answer within `peerTimeoutMs`, or its etcd lease expired.
    Timeout = 1,
    /// The connection was reset or closed without a goodbye, or the process is gone.
    Crashed = 3,
    /// The peer said goodbye (its engine closed).
    Closed = 7,
    /// A new incarnation of the peer was seen.
    Restarted = 8,
}

impl LossKind {
    /// The name (as JS names things).
    pub fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Crashed => "crashed",
            Self::Closed => "closed",
            Self::Restarted => "restarted",
        }
    }
}

impl Numbered for LossKind {
    const TABLE: &'static str = "loss reason";
    const ALL: &'static [Self] = &[Self::Timeout, Self::Crashed, Self::Closed, Self::Restarted];

    fn number(self) -> u32 {
        u32::from(self as u8)
    }

    fn name(self) -> &'static str {
        LossKind::name(self)
    }
}

impl LossReason {
    /// The reason without its details.
    pub fn kind(&self) -> LossKind {
        match self {
            Self::Silent { .. } | Self::RecordRemoved => LossKind::Timeout,
            Self::Closed => LossKind::Closed,
            Self::Broken(_) | Self::Unreachable(_) | Self::Transport(_) => LossKind::Crashed,
            Self::Restarted { .. } => LossKind::Restarted,
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Silent { timeout_ms } => write!(f, "no heartbeat answer for {timeout_ms} ms"),
            Self::Closed => f.write_str("the peer closed its engine (it said goodbye)"),
            Self::Broken(e) => write!(f, "control connection failed: {e}"),
            Self::Unreachable(e) => f.write_str(e),
            Self::RecordRemoved => f.write_str(
                "etcd record removed (lease expired or engine closed) and no answer to a direct ping",
            ),
            Self::Transport(e) => f.write_str(e),
            Self::Restarted { engine_id } => {
                write!(f, "the peer restarted (new engine id {engine_id:016x})")
            }
        }
    }
}

/// Where the link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// Connecting now.
    Connecting,
    /// Connected: heard last at `last_heard`, next ping due at `next_ping`.
    Up {
        /// When the last frame came.
        last_heard: Instant,
        /// When the next ping is due.
        next_ping: Instant,
    },
    /// Waiting to reconnect until then.
    Waiting {
        /// When to connect again.
        until: Instant,
    },
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send a ping now.
    Ping,
    /// Connect now.
    Connect,
    /// Declare the peer lost (the driver drops the connection).
    Lost(LossReason),
}

/// A direct check in progress: a frame heard at or after `since`, by `until`, answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    since: Instant,
    until: Instant,
    /// The loss to report when it fails.
    reason: LossReason,
}

/// A link's state machine.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    timeout: Duration,
    interval: Duration,
    state: LinkState,
    backoff: Duration,
    rng: u64,
    /// Only while up.
    check: Option<Check>,
    /// Time this side was not running since the peer was last heard (late polls past
    /// `STALL_SLACK`), at most `timeout`: added to the silence's deadline.
    starved: Duration,
    /// When the driver last sampled signs of life: a sign it finds was heard after then.
    sampled_at: Option<Instant>,
}

impl Link {
    /// A link that starts connecting; `seed` drives its jitter.
    pub(crate) fn new(timeout: Duration, seed: u64) -> Self {
        Self {
            timeout,
            interval: (timeout / 4).max(MIN_INTERVAL),
            state: LinkState::Connecting,
            backoff: BACKOFF_START,
            rng: seed,
            check: None,
            starved: Duration::ZERO,
            sampled_at: None,
        }
    }

    /// Where the link is.
    pub(crate) fn state(&self) -> LinkState {
        self.state
    }

    /// The heartbeat interval.
    #[cfg(test)]
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// When `poll` has something to do next (`None` while connecting: the connect's own
    /// timeout bounds it).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            LinkState::Connecting => None,
            LinkState::Up {
                last_heard,
                next_ping,
            } => {
                let due = next_ping.min(last_heard + self.timeout + self.starved);
                Some(self.check.as_ref().map_or(due, |c| due.min(c.until)))
            }
            LinkState::Waiting { until } => Some(until),
        }
    }

    /// The connection is up (the descriptor is fresh). Returns whether to report the peer
    /// recovered: when `peer_lost` (it had been declared lost, by this link or another
    /// source). The first ping is due now.
    pub(crate) fn connected(&mut self, now: Instant, peer_lost: bool) -> bool {
        self.state = LinkState::Up {
            last_heard: now,
            next_ping: now,
        };
        self.backoff = BACKOFF_START;
        // Connecting is a direct answer: a check asked for before needs no other.
        self.check = None;
        self.starved = Duration::ZERO;
        self.sampled_at = Some(now);
        peer_lost
    }

    /// Another source doubts the peer (its etcd record went away): ping now, and unless a
    /// frame is heard within `CHECK_TIMEOUT` (at most the timeout), the peer is lost for
    /// `reason`. Returns whether a check started: not when the link is not up (connecting,
    /// or failing to, decides), nor when one runs already (its deadline stands).
    pub(crate) fn check(&mut self, now: Instant, reason: LossReason) -> bool {
        if !matches!(self.state, LinkState::Up { .. }) || self.check.is_some() {
            return false;
        }
        self.check = Some(Check {
            since: now,
            until: now + CHECK_TIMEOUT.min(self.timeout),
            reason,
        });
        self.probe(now);
        true
    }

    /// Whether a direct check is waiting for an answer.
    pub(crate) fn checking(&self) -> bool {
        self.check.is_some()
    }

    /// A proof of life is wanted: ping now (when up).
    pub(crate) fn probe(&mut self, now: Instant) {
        if let LinkState::Up { next_ping, .. } = &mut self.state {
            *next_ping = (*next_ping).min(now);
        }
    }

    /// A frame came in.
    pub(crate) fn heard(&mut self, now: Instant) {
        if let LinkState::Up { last_heard, .. } = &mut self.state {
            if now > *last_heard {
                *last_heard = now;
                // Silence counts from here: stalls before it are no longer the question.
                self.starved = Duration::ZERO;
            }
        }
        if self.check.as_ref().is_some_and(|c| now >= c.since) {
            self.check = None;
        }
    }

    /// The driver's sample, at `now`, of whether other connections heard the peer's
    /// incarnation since its last sample (`seen`). A sign is counted as heard at that last
    /// sample — the earliest it may have come — so that a peer that stopped answering is
    /// never kept up by more than the time between two samples. Returns when it was
    /// counted heard, if it was.
    pub(crate) fn signs_of_life(&mut self, now: Instant, seen: bool) -> Option<Instant> {
        let since = self.sampled_at.replace(now);
        if !matches!(self.state, LinkState::Up { .. }) {
            return None;
        }
        let at = since.filter(|_| seen)?;
        self.heard(at);
        Some(at)
    }

    /// Credits a poll's lateness past `STALL_SLACK` as this side's stall (see the module),
    /// twice: once for the time this side did not run, once for it to read what came
    /// meanwhile — the link's reader runs as late as its timer, so an answer that came
    /// during the stall may still be unread when a late deadline is polled.
    fn credit_stall(&mut self, now: Instant) {
        let Some(due) = self.next_deadline() else {
            return;
        };
        let late = now.saturating_duration_since(due);
        let credit =
            (late.saturating_sub(STALL_SLACK) * 2).min(self.timeout.saturating_sub(self.starved));
        if credit.is_zero() {
            return;
        }
        self.starved += credit;
        if let Some(check) = self.check.as_mut() {
            check.until += credit;
        }
    }

    /// The connection (or the attempt to make one) failed. Returns the loss to report,
    /// unless the peer is already declared lost; the link then waits a backoff.
    pub(crate) fn broken(
        &mut self,
        reason: LossReason,
        now: Instant,
        peer_lost: bool,
    ) -> Option<Action> {
        let delay = self.jittered(self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.state = LinkState::Waiting { until: now + delay };
        self.check = None;
        self.starved = Duration::ZERO;
        (!peer_lost).then_some(Action::Lost(reason))
    }

    /// The peer is known to be back (a new incarnation was seen through another source:
    /// its etcd record, a data connection): a link waiting out its backoff reconnects now
    /// rather than at its next try, which after a few refused tries lies seconds ahead —
    /// and notifications wait for the link. The backoff itself stands, should the peer
    /// still refuse.
    pub(crate) fn peer_back(&mut self, now: Instant) {
        if let LinkState::Waiting { until } = &mut self.state {
            *until = (*until).min(now);
        }
    }

    /// What is due at `now`: a ping, the loss of a silent peer, or a reconnect.
    pub(crate) fn poll(&mut self, now: Instant, peer_lost: bool) -> Option<Action> {
        match self.state {
            LinkState::Up {
                last_heard,
                next_ping,
            } => self.poll_up(now, last_heard, next_ping, peer_lost),
            LinkState::Waiting { until } if now >= until => {
                self.state = LinkState::Connecting;
                Some(Action::Connect)
            }
            LinkState::Waiting { .. } | LinkState::Connecting => None,
        }
    }

    fn poll_up(
        &mut self,
        now: Instant,
        last_heard: Instant,
        next_ping: Instant,
        peer_lost: bool,
    ) -> Option<Action> {
        let silent = |link: &Self| now >= last_heard + link.timeout + link.starved;
        if silent(self) && now > next_ping + self.interval {
            // Polled more than an interval after a ping was due: this side was not
            // running (its process stopped, its runtime starved), so the silence is its
            // own, not the peer's, and answers may be waiting unread. Ping now and give
            // the peer one interval to be heard.
            let grace = now + self.interval;
            self.starved = Duration::ZERO;
            self.state = LinkState::Up {
                last_heard: grace.checked_sub(self.timeout).unwrap_or(now),
                next_ping: grace,
            };
            return Some(Action::Ping);
        }
        if let Some(check) = self
            .check
            .as_mut()
            .filter(|c| now > c.until + self.interval)
        {
            // As above: the late poll is this side's stall. Ping again and give the peer
            // one interval.
            check.until = now + self.interval;
            self.state = LinkState::Up {
                last_heard,
                next_ping: now + self.interval,
            };
            return Some(Action::Ping);
        }
        // A shorter lateness is credited: what was due moves by it (past the slack).
        self.credit_stall(now);
        if silent(self) {
            let timeout_ms = self.timeout.as_millis() as u64;
            return self.broken(LossReason::Silent { timeout_ms }, now, peer_lost);
        }
        if let Some(check) = self.check.as_ref().filter(|c| now >= c.until) {
            let reason = check.reason.clone();
            return self.broken(reason, now, peer_lost);
        }
        if now >= next_ping {
            // Pings keep their cadence; a late poll does not send a burst.
            let mut next = next_ping + self.interval;
            if next <= now {
                next = now + self.interval;
            }
            self.state = LinkState::Up {
                last_heard,
                next_ping: next,
            };
            return Some(Action::Ping);
        }
        None
    }

    /// `d` ± `JITTER_PERCENT` %, drawn from the link's generator (SplitMix64).
    fn jittered(&mut self, d: Duration) -> Duration {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let span = 2 * JITTER_PERCENT + 1; // -J ..= +J
        let percent = 100 - JITTER_PERCENT + z % span;
        d * percent as u32 / 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(3000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn silence_is_lost_at_exactly_the_timeout() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 1);
        assert!(!link.connected(t0, false));
        assert_eq!(link.poll(t0, false), Some(Action::Ping));
        link.heard(t0 + ms(10));
        let deadline = t0 + ms(10) + T;
        // Pings due on the way are all there is until the deadline.
        let mut at = t0 + ms(10);
        while at < deadline - ms(1) {
            at = link.next_deadline().expect("up").min(deadline - ms(1));
            if let Some(a) = link.poll(at, false) {
                assert_eq!(a, Action::Ping, "at {:?}", at - t0);
            }
        }
        assert_eq!(link.poll(deadline - Duration::from_nanos(1), false), None);
        assert_eq!(
            link.poll(deadline, false),
            Some(Action::Lost(LossReason::Silent { timeout_ms: 3000 }))
        );
        assert!(matches!(link.state(), LinkState::Waiting { .. }));
        assert_eq!(
            LossReason::Silent { timeout_ms: 3000 }.to_string(),
            "no heartbeat answer for 3000 ms"
        );
    }

    #[test]
    fn a_stall_on_this_side_is_not_the_peers_silence() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 1);
        link.connected(t0, false);
        assert_eq!(link.poll(t0, false), Some(Action::Ping));
        // This side stops running at 1 s (the 750 ms ping never went out) and runs again
        // at 5 s: it pings and listens for one interval instead of declaring the peer lost.
        assert_eq!(link.poll(t0 + ms(5000), false), Some(Action::Ping));
        assert_eq!(link.next_deadline(), Some(t0 + ms(5750)));
        assert_eq!(link.poll(t0 + ms(5749), false), None);
        // The answer queued during the stall is read: the peer is up.
        link.heard(t0 + ms(5010));
        assert_eq!(link.poll(t0 + ms(5750), false), Some(Action::Ping));
        assert!(matches!(link.state(), LinkState::Up { .. }));
        // Without an answer it is lost one interval after the stall ended.
        let mut quiet = Link::new(T, 1);
        quiet.connected(t0, false);
        quiet.poll(t0, false);
        assert_eq!(quiet.poll(t0 + ms(5000), false), Some(Action::Ping));
        assert_eq!(
            quiet.poll(t0 + ms(5750), false),
            Some(Action::Lost(LossReason::Silent { timeout_ms: 3000 }))
        );
        // A poll late by less than an interval is a shorter stall: credited (twice its
        // lateness past the slack), it pings, and the peer is lost if still silent then.
        let mut late = Link::new(T, 1);
        late.connected(t0, false);
        for at in [0, 750, 1500, 2250] {
            assert_eq!(late.poll(t0 + ms(at), false), Some(Action::Ping));
        }
        assert_eq!(late.poll(t0 + ms(3700), false), Some(Action::Ping));
        assert_eq!(late.poll(t0 + ms(3750), false), Some(Action::Ping));
        let credited = t0 + ms(3000) + (ms(700) - STALL_SLACK) * 2;
        assert_eq!(late.next_deadline(), Some(credited));
        assert_eq!(
            late.poll(credited, false),
            Some(Action::Lost(LossReason::Silent { timeout_ms: 3000 }))
        );
    }

    #[test]
    fn late_polls_credit_this_sides_stall_to_the_silence_up_to_one_timeout() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 1);
        link.connected(t0, false);
        assert_eq!(link.poll(t0, false), Some(Action::Ping));
        // Every wake-up runs 400 ms late (a starved runtime), and so does the reading of
        // the peer's pongs: none is read for the whole timeout.
        for due in [750, 1500, 2250] {
            assert_eq!(link.poll(t0 + ms(due + 400), false), Some(Action::Ping));
        }
        // Without the credit the peer was lost at 3000.
        assert_eq!(link.poll(t0 + ms(3000), false), Some(Action::Ping));
        let credit = (ms(400) - STALL_SLACK) * 2 * 3;
        let mut probe = link.clone();
        let lost_at = loop {
            let at = probe.next_deadline().expect("up");
            if let Some(Action::Lost(_)) = probe.poll(at, false) {
                break at;
            }
        };
        assert_eq!(lost_at, t0 + T + credit, "the silence's deadline, moved");
        // The pong is read: the peer is up, the credit starts again.
        link.heard(t0 + ms(3050));
        assert!(matches!(link.state(), LinkState::Up { .. }));
        assert_eq!(link.next_deadline(), Some(t0 + ms(3750)), "the next ping");
        // Polls within the slack credit nothing: the deadline stays exact.
        let mut exact = Link::new(T, 1);
        exact.connected(t0, false);
        for due in [0, 750, 1500, 2250] {
            assert_eq!(
                exact.poll(t0 + ms(due) + STALL_SLACK, false),
                Some(Action::Ping)
            );
        }
        assert_eq!(
            exact.poll(t0 + ms(3000), false),
            Some(Action::Lost(LossReason::Silent { timeout_ms: 3000 }))
        );
        // A side that is always late loses a silent peer by twice the timeout at most.
        let mut starved = Link::new(T, 1);
        starved.connected(t0, false);
        let lost_at = loop {
            let at = starved.next_deadline().expect("up") + ms(700);
            match starved.poll(at, false) {
                Some(Action::Lost(reason)) => break (at, reason),
                other => assert!(matches!(other, None | Some(Action::Ping)), "{other:?}"),
            }
        };
        assert_eq!(lost_at.1, LossReason::Silent { timeout_ms: 3000 });
        assert!(lost_at.0 - t0 <= T * 2 + ms(700), "{:?}", lost_at.0 - t0);
        assert!(lost_at.0 - t0 > T + ms(700), "{:?}", lost_at.0 - t0);
    }

    #[test]
    fn a_stall_credit_also_moves_a_direct_checks_deadline() {
        let t0 = Instant::now();
        let mut link = Link::new(ms(60_000), 3);
        link.connected(t0, false);
        link.poll(t0, false);
        assert!(link.check(t0 + ms(10), LossReason::RecordRemoved));
        assert_eq!(link.poll(t0 + ms(10), false), Some(Action::Ping));
        // Polled 500 ms after the check's deadline (less than an interval): credited.
        let until = t0 + ms(10) + CHECK_TIMEOUT;
        assert_eq!(link.poll(until + ms(500), false), None);
        assert!(link.checking());
        let moved = until + (ms(500) - STALL_SLACK) * 2;
        assert_eq!(
            link.next_deadline(),
            Some(moved),
            "the check's deadline, moved"
        );
        let mut quiet = link.clone();
        assert_eq!(
            quiet.poll(moved, false),
            Some(Action::Lost(LossReason::RecordRemoved))
        );
        link.heard(until + ms(510));
        assert!(!link.checking());
    }

    #[test]
    fn signs_of_life_from_other_connections_count_from_the_previous_sample() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 1);
        // Not up: a sign changes nothing.
        assert_eq!(link.signs_of_life(t0, true), None);
        link.connected(t0, false);
        assert_eq!(link.poll(t0, false), Some(Action::Ping));
        // No pong ever comes; data replies do, between the samples the driver takes at
        // each of its polls.
        let mut at = t0;
        while at < t0 + T * 4 {
            let previous = at;
            at = link.next_deadline().expect("up");
            // Counted as heard at the previous sample, not now.
            assert_eq!(link.signs_of_life(at, true), Some(previous));
            let action = link.poll(at, false);
            assert!(matches!(action, None | Some(Action::Ping)), "{action:?}");
        }
        assert!(matches!(link.state(), LinkState::Up { .. }));
        // Then nothing at all: lost at the timeout after the last sample that found one.
        let last_sign = at;
        let lost = loop {
            at = link.next_deadline().expect("up");
            assert_eq!(link.signs_of_life(at, false), None);
            if let Some(Action::Lost(reason)) = link.poll(at, false) {
                break reason;
            }
        };
        assert_eq!(lost, LossReason::Silent { timeout_ms: 3000 });
        assert!(at - last_sign <= T, "{:?}", at - last_sign);
        // A sign answers a direct check begun before its sample's predecessor, not one
        // begun after it.
        let mut checked = Link::new(T, 1);
        checked.connected(t0, false);
        checked.poll(t0, false);
        checked.signs_of_life(t0 + ms(100), false);
        assert!(checked.check(t0 + ms(200), LossReason::RecordRemoved));
        assert_eq!(
            checked.signs_of_life(t0 + ms(300), true),
            Some(t0 + ms(100))
        );
        assert!(checked.checking(), "the sign may predate the check");
        assert_eq!(
            checked.signs_of_life(t0 + ms(400), true),
            Some(t0 + ms(300))
        );
        assert!(!checked.checking());
    }

    #[test]
    fn pings_go_out_on_connect_and_every_quarter_timeout() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 1);
        assert_eq!(link.interval(), ms(750));
        link.connected(t0, false);
        let mut pings = Vec::new();
        let mut now = t0;
        while now < t0 + ms(2999) {
            if link.poll(now, false) == Some(Action::Ping) {
                pings.push((now - t0).as_millis());
                link.heard(now); // answered at once
            }
            now = link.next_deadline().expect("up");
        }
        assert_eq!(pings, [0, 750, 1500, 2250]);
        // A late poll sends one ping, not the missed ones.
        let mut late = Link::new(T, 1);
        late.connected(t0, false);
        assert_eq!(late.poll(t0, false), Some(Action::Ping));
        late.heard(t0 + ms(2000));
        assert_eq!(late.poll(t0 + ms(2000), false), Some(Action::Ping));
        assert_eq!(late.poll(t0 + ms(2001), false), None);
        assert_eq!(late.next_deadline(), Some(t0 + ms(2750)));
        // A probe pings at once, then the cadence resumes from there.
        late.probe(t0 + ms(2100));
        assert_eq!(late.poll(t0 + ms(2100), false), Some(Action::Ping));
        assert_eq!(late.next_deadline(), Some(t0 + ms(2850)));
        // Short timeouts keep a floor on the cadence.
        assert_eq!(Link::new(ms(40), 1).interval(), MIN_INTERVAL);
    }

    #[test]
    fn a_peer_seen_back_ends_the_wait_but_not_the_backoff() {
        let t0 = Instant::now();
        let mut link = Link::new(Duration::from_secs(3), 7);
        let mut now = t0;
        // Refused tries build up the backoff.
        for _ in 0..5 {
            link.broken(LossReason::Broken("refused".into()), now, true);
            let LinkState::Waiting { until } = link.state() else {
                panic!("waiting")
            };
            now = until;
            assert_eq!(link.poll(now, true), Some(Action::Connect));
        }
        link.broken(LossReason::Broken("refused".into()), now, true);
        let LinkState::Waiting { until } = link.state() else {
            panic!("waiting")
        };
        assert!(until - now >= Duration::from_secs(2), "{:?}", until - now);
        // Seen back through another source: the next poll reconnects.
        link.peer_back(now);
        assert_eq!(link.poll(now, true), Some(Action::Connect));
        // Refused again: the backoff goes on from where it was.
        link.broken(LossReason::Broken("refused".into()), now, true);
        let LinkState::Waiting { until } = link.state() else {
            panic!("waiting")
        };
        assert!(until - now >= Duration::from_secs(4), "{:?}", until - now);
        // Up or connecting, nothing changes.
        assert_eq!(link.poll(until, true), Some(Action::Connect));
        link.peer_back(until);
        assert_eq!(link.state(), LinkState::Connecting);
    }

    #[test]
    fn reconnect_backoff_doubles_to_the_cap_with_bounded_jitter_and_resets() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 42);
        let mut base = BACKOFF_START;
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..12 {
            link.broken(LossReason::Unreachable("refused".into()), now, true);
            let LinkState::Waiting { until } = link.state() else {
                panic!("waits")
            };
            let d = until - now;
            let lo = base * (100 - JITTER_PERCENT as u32) / 100;
            let hi = base * (100 + JITTER_PERCENT as u32) / 100;
            assert!(d >= lo && d <= hi, "{d:?} not within {lo:?}..={hi:?}");
            delays.push(d);
            assert_eq!(link.poll(until - Duration::from_nanos(1), true), None);
            assert_eq!(link.poll(until, true), Some(Action::Connect));
            now = until;
            base = (base * 2).min(BACKOFF_MAX);
        }
        // 100 ms doubling reaches the 5 s cap by the 8th delay and stays there.
        assert!(delays[7..].iter().all(|d| *d >= BACKOFF_MAX * 4 / 5));
        // Jitter differs between links with different seeds.
        let mut other = Link::new(T, 43);
        other.broken(LossReason::Closed, t0, true);
        let mut same = Link::new(T, 42);
        same.broken(LossReason::Closed, t0, true);
        assert_ne!(other.state(), same.state());
        // A connection resets the backoff.
        link.connected(now, true);
        link.broken(LossReason::Closed, now, false);
        let LinkState::Waiting { until } = link.state() else {
            panic!("waits")
        };
        assert!(until - now <= BACKOFF_START * 6 / 5);
    }

    #[test]
    fn loss_and_recovery_are_reported_once_each() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 7);
        link.connected(t0, false);
        // The first break reports the loss; the peer is then lost, and further breaks
        // (failed reconnects) report nothing.
        assert_eq!(
            link.broken(LossReason::Closed, t0, false),
            Some(Action::Lost(LossReason::Closed))
        );
        assert_eq!(
            link.broken(LossReason::Unreachable("refused".into()), t0, true),
            None
        );
        // Reconnected: recovered once; a second connect with the peer alive reports none.
        assert!(link.connected(t0 + ms(500), true));
        assert!(!link.connected(t0 + ms(600), false));
        // Silence while another source already declared it lost: nothing new to report.
        link.heard(t0 + ms(600));
        while let Some(at) = link
            .next_deadline()
            .filter(|_| matches!(link.state(), LinkState::Up { .. }))
        {
            let action = link.poll(at, true);
            assert!(
                matches!(action, None | Some(Action::Ping)),
                "{action:?} at {:?}",
                at - t0
            );
        }
        assert!(matches!(link.state(), LinkState::Waiting { .. }));
    }

    #[test]
    fn a_direct_check_is_answered_by_any_frame_heard_after_it_began() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 3);
        // Not up: nothing to check, connecting decides.
        assert!(!link.check(t0, LossReason::RecordRemoved));
        link.connected(t0, false);
        assert_eq!(link.poll(t0, false), Some(Action::Ping));
        link.heard(t0 + ms(1));
        // The check pings at once and bounds the wait by CHECK_TIMEOUT, not the timeout.
        assert!(link.check(t0 + ms(100), LossReason::RecordRemoved));
        assert!(link.checking());
        assert!(
            !link.check(t0 + ms(200), LossReason::RecordRemoved),
            "one at a time"
        );
        assert_eq!(link.next_deadline(), Some(t0 + ms(100)));
        assert_eq!(link.poll(t0 + ms(100), false), Some(Action::Ping));
        // The answer: the check ends, and silence is judged by the timeout again.
        link.heard(t0 + ms(105));
        assert!(!link.checking());
        let mut at = t0 + ms(105);
        while at < t0 + ms(105) + T - ms(1) {
            at = link
                .next_deadline()
                .expect("up")
                .min(t0 + ms(105) + T - ms(1));
            assert!(matches!(link.poll(at, false), None | Some(Action::Ping)));
        }
        assert!(matches!(link.state(), LinkState::Up { .. }));
    }

    #[test]
    fn a_direct_check_unanswered_within_its_bound_loses_the_peer() {
        let t0 = Instant::now();
        let mut link = Link::new(ms(60_000), 3);
        link.connected(t0, false);
        assert_eq!(link.poll(t0, false), Some(Action::Ping));
        link.heard(t0 + ms(1));
        assert!(link.check(t0 + ms(10), LossReason::RecordRemoved));
        assert_eq!(link.poll(t0 + ms(10), false), Some(Action::Ping));
        let until = t0 + ms(10) + CHECK_TIMEOUT;
        assert_eq!(link.poll(until - Duration::from_nanos(1), false), None);
        assert_eq!(
            link.poll(until, false),
            Some(Action::Lost(LossReason::RecordRemoved))
        );
        assert!(matches!(link.state(), LinkState::Waiting { .. }));
        assert!(!link.checking(), "a broken link holds no check");
        // Already lost through another source: the link breaks, and reports nothing new.
        let mut lost = Link::new(ms(60_000), 3);
        lost.connected(t0, true);
        assert!(lost.check(t0, LossReason::RecordRemoved));
        assert_eq!(lost.poll(t0, true), Some(Action::Ping));
        assert_eq!(lost.poll(t0 + CHECK_TIMEOUT, true), None);
        assert!(matches!(lost.state(), LinkState::Waiting { .. }));
        // A short timeout bounds the check too: lost at the timeout, not later.
        let mut short = Link::new(ms(400), 3);
        short.connected(t0, false);
        assert!(short.check(t0, LossReason::RecordRemoved));
        let mut at = t0;
        let lost = loop {
            match short.poll(at, false) {
                Some(Action::Lost(reason)) => break reason,
                _ => at = short.next_deadline().expect("up until lost"),
            }
        };
        assert_eq!(at, t0 + ms(400), "{lost}");
    }

    #[test]
    fn a_stall_on_this_side_does_not_fail_a_direct_check() {
        let t0 = Instant::now();
        let mut link = Link::new(ms(60_000), 3);
        link.connected(t0, false);
        link.poll(t0, false);
        assert!(link.check(t0 + ms(10), LossReason::RecordRemoved));
        assert_eq!(link.poll(t0 + ms(10), false), Some(Action::Ping));
        // Polled again long after the check's deadline: this side was not running, the
        // answer may be waiting unread. One more ping and one interval.
        let late = t0 + ms(10) + CHECK_TIMEOUT + ms(20_000);
        assert_eq!(link.poll(late, false), Some(Action::Ping));
        assert!(link.checking());
        link.heard(late + ms(1));
        assert!(!link.checking());
        assert!(matches!(link.state(), LinkState::Up { .. }));
        // Without an answer, it fails one interval later.
        let mut quiet = Link::new(ms(60_000), 3);
        quiet.connected(t0, false);
        quiet.poll(t0, false);
        quiet.check(t0 + ms(10), LossReason::RecordRemoved);
        quiet.poll(t0 + ms(10), false);
        assert_eq!(quiet.poll(late, false), Some(Action::Ping));
        assert_eq!(
            quiet.poll(late + quiet.interval(), false),
            Some(Action::Lost(LossReason::RecordRemoved))
        );
    }

    #[test]
    fn a_new_connection_answers_a_check() {
        let t0 = Instant::now();
        let mut link = Link::new(T, 3);
        link.connected(t0, false);
        assert!(link.check(t0, LossReason::RecordRemoved));
        link.broken(LossReason::Closed, t0 + ms(5), false);
        assert!(!link.checking());
        link.connected(t0 + ms(200), false);
        assert!(!link.checking());
    }

    #[test]
    fn each_reason_has_its_kind() {
        use LossKind::*;
        let reasons = [
            (LossReason::Silent { timeout_ms: 1 }, Timeout),
            (LossReason::RecordRemoved, Timeout),
            (LossReason::Closed, Closed),
            (LossReason::Broken("reset".into()), Crashed),
            (LossReason::Unreachable("refused".into()), Crashed),
            (
                LossReason::Transport("target process exited".into()),
                Crashed,
            ),
            (LossReason::Restarted { engine_id: 9 }, Restarted),
        ];
        for (reason, kind) in &reasons {
            assert_eq!(reason.kind(), *kind, "{reason}");
        }
        let mut seen: Vec<LossKind> = reasons.iter().map(|(_, k)| *k).collect();
        seen.dedup();
        assert_eq!(
            seen,
            [Timeout, Closed, Crashed, Restarted],
            "every kind has a reason"
        );
    }
}
