//! The receive queue: notifications that landed here and wait to be taken. Bounded by
//! `notifyQueueSize` entries of at most `notifyMaxBytes` each, so a sender that floods a
//! target cannot grow its memory: past the bound a notification is dropped and counted
//! (`ferry_notifications_dropped_total`), and the first drop of a run is signalled once.
//!
//! It also keeps what exactly-once needs on the receiving side: the sessions of the senders
//! (`sessions`), each with its sequence numbers' window (`window`), so that a notification
//! resent after its connection broke (the ack was lost, not the notification) is answered
//! again as its first copy was but not queued twice, and a number outside the window is
//! refused and counted. And it refuses a session planned for another incarnation of this
//! engine: a notification is delivered only by the incarnation that received its data.
//! No sockets, no clock: tested alone.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::outcome::NotifyOutcome;
use super::protocol::{Answer, Open};
use super::sessions::{Binding, SessionKey, Sessions};
use super::window::Judged;
use crate::metrics::NotifyCounters;

/// A notification as the target receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's segment name, as it named itself on its authenticated connection.
    pub from: String,
    /// The sender's engine id, as established by the handshake.
    pub engine_id: u64,
    /// The payload.
    pub data: Vec<u8>,
    /// Bytes of the call it rode on (0 for one sent alone).
    pub bytes: u64,
}

/// What the inbox tells the application's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxSignal {
    /// The queue went from empty to not empty: take what is there.
    Ready,
    /// A notification was dropped because the queue was full (once per run of drops, until
    /// the queue is next emptied by a take).
    Dropped {
        /// The sender's segment name.
        from: String,
        /// Notifications dropped by this engine so far.
        total: u64,
    },
}

/// Receives inbox signals (the binding turns them into JS events).
pub type InboxWaker = Arc<dyn Fn(InboxSignal) + Send + Sync>;

#[derive(Default)]
struct State {
    queue: VecDeque<Notification>,
    /// The senders' sessions and their sequence numbers.
    sessions: Sessions,
    /// Whether the current run of drops was signalled.
    drop_signalled: bool,
}

/// The bounded receive queue.
pub(crate) struct Inbox {
    /// This incarnation: sessions planned for another are refused.
    engine_id: u64,
    capacity: usize,
    state: Mutex<State>,
    counters: Arc<NotifyCounters>,
    waker: Mutex<Option<InboxWaker>>,
}

impl Inbox {
    pub(crate) fn new(engine_id: u64, capacity: usize, counters: Arc<NotifyCounters>) -> Self {
        Self {
            engine_id,
            capacity: capacity.max(1),
            state: Mutex::new(State::default()),
            counters,
            waker: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets (or clears) who is told about new notifications and drops. A waker set while
    /// notifications wait is told `Ready` at once.
    pub(crate) fn set_waker(&self, waker: Option<InboxWaker>) {
        let waiting = !self.lock().queue.is_empty();
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = waker.clone();
        if let (true, Some(w)) = (waiting, waker) {
            w(InboxSignal::Ready);
        }
    }

    fn signal(&self, s: InboxSignal) {
        let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(w) = waker {
            w(s);
        }
    }

    /// This incarnation's engine id.
    pub(crate) fn engine_id(&self) -> u64 {
        self.engine_id
    }

    /// Binds a connection from engine `sender` (as its handshake named it) to the session
    /// it opens; refused (and counted) when the sender planned for another incarnation.
    pub(crate) fn open(&self, sender: u64, open: &Open) -> Result<Binding, Answer> {
        if open.receiver != self.engine_id {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Answer::OtherIncarnation);
        }
        let key = SessionKey {
            sender,
            token: open.token,
        };
        Ok(self.lock().sessions.bind(key, open.first))
    }

    /// The connection of `binding` ended.
    pub(crate) fn release(&self, binding: &Binding) {
        self.lock().sessions.release(binding);
    }

    /// Offers notification `seq` of the session `binding` holds: queued or dropped if it is
    /// the session's next number, answered as before if it is a resend, refused (and
    /// counted) if it is outside the window or the session was taken over.
    pub(crate) fn offer(&self, binding: &Binding, seq: u64, note: Notification) -> Answer {
        let mut st = self.lock();
        let capacity = self.capacity;
        let full = st.queue.len() >= capacity;
        let Some(window) = st.sessions.window(binding) else {
            drop(st);
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Answer::Superseded;
        };
        match window.judge(seq) {
            Judged::Next => {}
            Judged::Resend(first) => return Answer::of(first),
            Judged::OutOfWindow => {
                drop(st);
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Answer::OutOfWindow;
            }
        }
        let outcome = if full {
            NotifyOutcome::Dropped
        } else {
            NotifyOutcome::Queued
        };
        window.record(seq, outcome);
        if full {
            let total = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let first = !std::mem::replace(&mut st.drop_signalled, true);
            drop(st);
            if first {
                self.signal(InboxSignal::Dropped {
                    from: note.from,
                    total,
                });
            }
            return Answer::Dropped;
        }
        let was_empty = st.queue.is_empty();
        st.queue.push_back(note);
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        drop(st);
        if was_empty {
            self.signal(InboxSignal::Ready);
        }
        Answer::Taken
    }

    /// Uses up number `seq` of the session without queueing anything (a notification the
    /// target refused for its size): the sender goes on with the next number.
    pub(crate) fn skip(&self, binding: &Binding, seq: u64) {
        let mut st = self.lock();
        if let Some(window) = st.sessions.window(binding) {
            if window.judge(seq) == Judged::Next {
                window.record(seq, NotifyOutcome::Dropped);
            }
        }
    }

    /// Takes up to `max` notifications, oldest first.
    pub(crate) fn take(&self, max: usize) -> Vec<Notification> {
        let mut st = self.lock();
        let n = max.min(st.queue.len());
        let out: Vec<Notification> = st.queue.drain(..n).collect();
        if st.queue.is_empty() {
            st.drop_signalled = false;
        }
        out
    }

    /// Notifications waiting now.
    pub(crate) fn len(&self) -> usize {
        self.lock().queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERE: u64 = 99;

    fn note(from: &str, n: u8) -> Notification {
        Notification {
            from: from.into(),
            engine_id: 7,
            data: vec![n],
            bytes: 0,
        }
    }

    fn opening(receiver: u64, token: u8) -> Open {
        Open {
            receiver,
            token: [token; 16],
            first: 1,
            name: "a".into(),
        }
    }

    fn session(inbox: &Inbox, sender: u64, token: u8) -> Binding {
        inbox.open(sender, &opening(HERE, token)).expect("open")
    }

    fn inbox(cap: usize) -> (Inbox, Arc<Mutex<Vec<InboxSignal>>>) {
        let inbox = Inbox::new(HERE, cap, Arc::default());
        let seen: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let s = seen.clone();
        inbox.set_waker(Some(Arc::new(move |sig| s.lock().expect("seen").push(sig))));
        (inbox, seen)
    }

    #[test]
    fn in_order_and_ready_once_per_empty_queue() {
        let (inbox, seen) = inbox(8);
        let a = session(&inbox, 1, 1);
        for n in 1..=3 {
            assert_eq!(inbox.offer(&a, n as u64, note("a", n)), Answer::Taken);
        }
        assert_eq!(*seen.lock().expect("seen"), vec![InboxSignal::Ready]);
        let got: Vec<u8> = inbox.take(10).into_iter().map(|n| n.data[0]).collect();
        assert_eq!(got, [1, 2, 3]);
        inbox.offer(&a, 4, note("a", 4));
        assert_eq!(
            seen.lock().expect("seen").len(),
            2,
            "ready again after a take emptied it"
        );
    }

    #[test]
    fn resends_are_answered_as_the_first_copy_but_not_queued_twice() {
        let (inbox, _) = inbox(1);
        let a = session(&inbox, 1, 1);
        assert_eq!(inbox.offer(&a, 1, note("a", 1)), Answer::Taken);
        assert_eq!(inbox.offer(&a, 2, note("a", 2)), Answer::Dropped);
        // The connection broke; the sender resends both on a new one.
        inbox.release(&a);
        let again = session(&inbox, 1, 1);
        assert_eq!(inbox.offer(&again, 1, note("a", 1)), Answer::Taken);
        assert_eq!(inbox.offer(&again, 2, note("a", 2)), Answer::Dropped);
        // Another sender's numbers are its own.
        let b = session(&inbox, 2, 1);
        assert_eq!(inbox.offer(&b, 1, note("b", 1)), Answer::Dropped);
        assert_eq!(inbox.len(), 1);
    }

    #[test]
    fn a_forged_number_is_refused_counted_and_silences_no_one() {
        let counters: Arc<NotifyCounters> = Arc::default();
        let inbox = Inbox::new(HERE, 8, counters.clone());
        let real = session(&inbox, 7, 1);
        assert_eq!(inbox.offer(&real, 1, note("real", 1)), Answer::Taken);
        // Another connection claims engine 7: without the real token it has a session of
        // its own, whose window refuses the highest number.
        let forger = session(&inbox, 7, 2);
        assert_eq!(
            inbox.offer(&forger, u64::MAX, note("forged", 0)),
            Answer::OutOfWindow
        );
        assert_eq!(inbox.offer(&real, 2, note("real", 2)), Answer::Taken);
        assert_eq!(counters.refused.load(Ordering::Relaxed), 1);
        let got: Vec<u8> = inbox.take(10).into_iter().map(|n| n.data[0]).collect();
        assert_eq!(got, [1, 2]);
    }

    #[test]
    fn a_session_planned_for_another_incarnation_is_refused() {
        let counters: Arc<NotifyCounters> = Arc::default();
        let inbox = Inbox::new(HERE, 8, counters.clone());
        assert_eq!(
            inbox.open(1, &opening(HERE + 1, 1)),
            Err(Answer::OtherIncarnation)
        );
        assert_eq!(counters.refused.load(Ordering::Relaxed), 1);
        assert_eq!(inbox.len(), 0);
    }

    #[test]
    fn a_superseded_connection_is_refused() {
        let (inbox, _) = inbox(8);
        let old = session(&inbox, 1, 1);
        assert_eq!(inbox.offer(&old, 1, note("a", 1)), Answer::Taken);
        let mut resumed = opening(HERE, 1);
        resumed.first = 2;
        let new = inbox.open(1, &resumed).expect("open");
        assert_eq!(inbox.offer(&old, 2, note("a", 2)), Answer::Superseded);
        assert_eq!(inbox.offer(&new, 2, note("a", 2)), Answer::Taken);
        assert_eq!(inbox.len(), 2);
    }

    #[test]
    fn overflow_is_dropped_counted_and_signalled_once_per_run() {
        let counters: Arc<NotifyCounters> = Arc::default();
        let inbox = Inbox::new(HERE, 4, counters.clone());
        let seen: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let s = seen.clone();
        inbox.set_waker(Some(Arc::new(move |sig| s.lock().expect("seen").push(sig))));
        let a = session(&inbox, 1, 1);
        let outcomes: Vec<Answer> = (1..=10u8)
            .map(|n| inbox.offer(&a, n as u64, note("a", n)))
            .collect();
        assert_eq!(&outcomes[..4], &[Answer::Taken; 4]);
        assert_eq!(&outcomes[4..], &[Answer::Dropped; 6]);
        assert_eq!(inbox.len(), 4, "memory stays bounded by the queue size");
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 6);
        assert_eq!(counters.received.load(Ordering::Relaxed), 4);
        let drops = |seen: &Mutex<Vec<InboxSignal>>| {
            seen.lock()
                .expect("seen")
                .iter()
                .filter(|s| matches!(s, InboxSignal::Dropped { .. }))
                .count()
        };
        assert_eq!(drops(&seen), 1);
        assert_eq!(
            seen.lock().expect("seen")[1],
            InboxSignal::Dropped {
                from: "a".into(),
                total: 1
            }
        );
        // The oldest four are what is kept.
        let kept: Vec<u8> = inbox.take(100).into_iter().map(|n| n.data[0]).collect();
        assert_eq!(kept, [1, 2, 3, 4]);
        for n in 11..=15u8 {
            inbox.offer(&a, n as u64, note("a", n));
        }
        assert_eq!(drops(&seen), 2, "a new run of drops is signalled again");
    }

    #[test]
    fn a_waker_set_late_hears_what_waits() {
        let inbox = Inbox::new(HERE, 4, Arc::default());
        let a = session(&inbox, 1, 1);
        inbox.offer(&a, 1, note("a", 1));
        let seen: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let s = seen.clone();
        inbox.set_waker(Some(Arc::new(move |sig| s.lock().expect("seen").push(sig))));
        assert_eq!(*seen.lock().expect("seen"), vec![InboxSignal::Ready]);
    }
}
