//! The receiving side's judgement of one session's sequence numbers. A sender numbers the
//! notifications of a session 1, 2, 3… and never has more than `WINDOW` of them
//! unacknowledged, so after a broken connection it resends from at most `WINDOW` behind the
//! last one this side took. Anything else is not from that sender: a number at or beyond
//! the next one plus a gap, or too far behind, is refused — it changes nothing, so a forged
//! number cannot make the real sender's later ones look like resends. A resend is answered
//! with what became of the first copy (queued or dropped), which is remembered for the
//! window. Pure: no sockets, no clock.

use super::outcome::NotifyOutcome;

/// Notifications a sender may have unacknowledged in one session, and how far behind the
/// last one taken a resend may be.
pub(crate) const WINDOW: u64 = 1024;

const WORDS: usize = (WINDOW / 64) as usize;

/// What a sequence number is, seen from the session's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judged {
    /// The next one: take it, then `record` what became of it.
    Next,
    /// Taken before (its ack was lost): answer with the first copy's outcome again.
    Resend(NotifyOutcome),
    /// Not in the window: refuse it and change nothing.
    OutOfWindow,
}

/// One session's last number taken and the outcomes of the `WINDOW` before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqWindow {
    /// The first number of the session as this side knows it: none below was taken here.
    first: u64,
    last: u64,
    /// Bit `seq % WINDOW` set: notification `seq` was dropped (the queue was full).
    dropped: [u64; WORDS],
}

impl SeqWindow {
    /// A session whose first notification will be `first` (at least 1).
    pub(crate) fn starting_at(first: u64) -> Self {
        let first = first.max(1);
        Self {
            first,
            last: first - 1,
            dropped: [0; WORDS],
        }
    }

    /// The last number taken (0 before any).
    #[cfg(test)]
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    pub(crate) fn judge(&self, seq: u64) -> Judged {
        if self.last.checked_add(1) == Some(seq) {
            return Judged::Next;
        }
        // A resend is of one taken here, at most WINDOW behind the next one.
        if seq < self.first || seq > self.last || self.last - seq >= WINDOW {
            return Judged::OutOfWindow;
        }
        let (word, bit) = slot(seq);
        Judged::Resend(if self.dropped[word] & bit != 0 {
            NotifyOutcome::Dropped
        } else {
            NotifyOutcome::Queued
        })
    }

    /// Records what became of the `Next` number `seq`.
    pub(crate) fn record(&mut self, seq: u64, outcome: NotifyOutcome) {
        debug_assert_eq!(self.judge(seq), Judged::Next);
        self.last = seq;
        let (word, bit) = slot(seq);
        if outcome == NotifyOutcome::Dropped {
            self.dropped[word] |= bit;
        } else {
            self.dropped[word] &= !bit;
        }
    }
}

fn slot(seq: u64) -> (usize, u64) {
    let i = seq % WINDOW;
    ((i / 64) as usize, 1u64 << (i % 64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_taken_in_order_and_resends_answered_as_the_first_copy() {
        let mut w = SeqWindow::starting_at(1);
        assert_eq!(w.judge(2), Judged::OutOfWindow, "no gaps");
        assert_eq!(w.judge(1), Judged::Next);
        w.record(1, NotifyOutcome::Queued);
        w.record(2, NotifyOutcome::Dropped);
        assert_eq!(w.judge(1), Judged::Resend(NotifyOutcome::Queued));
        assert_eq!(w.judge(2), Judged::Resend(NotifyOutcome::Dropped));
        assert_eq!(w.judge(3), Judged::Next);
        assert_eq!(w.judge(0), Judged::OutOfWindow);
        assert_eq!(w.last(), 2);
    }

    #[test]
    fn forged_numbers_are_refused_and_change_nothing() {
        let mut w = SeqWindow::starting_at(1);
        for seq in 1..=5 {
            w.record(seq, NotifyOutcome::Queued);
        }
        let before = w.clone();
        for forged in [u64::MAX, u64::MAX - 1, 7, 5 + WINDOW, 1 << 40] {
            assert_eq!(w.judge(forged), Judged::OutOfWindow, "{forged}");
        }
        assert_eq!(w, before);
        assert_eq!(w.judge(6), Judged::Next, "the real sender goes on");
    }

    #[test]
    fn a_resend_is_at_most_a_window_behind() {
        let outcome = |seq: u64| {
            if seq % 3 == 0 {
                NotifyOutcome::Dropped
            } else {
                NotifyOutcome::Queued
            }
        };
        let mut w = SeqWindow::starting_at(1);
        let n = 3 * WINDOW + 1;
        for seq in 1..=n {
            w.record(seq, outcome(seq));
        }
        assert_eq!(w.judge(n - WINDOW), Judged::OutOfWindow);
        // The outcome bits are reused as the window moves: each reads its own.
        for seq in n - WINDOW + 1..=n {
            assert_eq!(w.judge(seq), Judged::Resend(outcome(seq)), "{seq}");
        }
    }

    #[test]
    fn a_session_resumed_elsewhere_starts_where_its_sender_says() {
        let w = SeqWindow::starting_at(40);
        assert_eq!(w.judge(40), Judged::Next);
        assert_eq!(
            w.judge(39),
            Judged::OutOfWindow,
            "nothing was taken before 40"
        );
        assert_eq!(SeqWindow::starting_at(0).judge(1), Judged::Next);
        let top = SeqWindow::starting_at(u64::MAX);
        assert_eq!(top.judge(u64::MAX), Judged::Next);
    }
}
