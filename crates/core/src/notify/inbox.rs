//! The receive queue: notifications that landed here and wait to be taken. Bounded by
//! `notifyQueueSize` entries of at most `notifyMaxBytes` each, so a sender that floods a
//! target cannot grow its memory: past the bound a notification is dropped and counted
//! (`ferry_notifications_dropped_total`), and the first drop of a run is signalled once.
//!
//! It also keeps what exactly-once needs on the receiving side: the highest sequence number
//! taken from each sender engine, so that a notification resent after its connection broke
//! (the ack was lost, not the notification) is acknowledged again but not queued twice.
//! No sockets, no clock: tested alone.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

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

/// Senders whose last sequence number is kept. An engine is a sender to at most this many
/// peers' worth of dedup state; past it the oldest entry is forgotten (a resend from that
/// sender after a reconnect could then be queued twice — it would need 4096 other senders
/// in between).
const MAX_SENDERS: usize = 4096;

/// What became of an offered notification; sent back in `NotifyAck.flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyOutcome {
    /// Queued for the application.
    Queued = 0,
    /// The queue was full: dropped and counted.
    Dropped = 1,
    /// Taken before (a resend after a reconnect): not queued again.
    Duplicate = 2,
}

impl NotifyOutcome {
    /// Parses `NotifyAck.flags`; unknown values read as `Queued` (the target took it).
    pub fn from_raw(raw: u16) -> Self {
        match raw {
            1 => Self::Dropped,
            2 => Self::Duplicate,
            _ => Self::Queued,
        }
    }
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
    /// Highest sequence number taken per sender engine id, with the order they came in.
    last_seq: HashMap<u64, u64>,
    senders: VecDeque<u64>,
    /// Whether the current run of drops was signalled.
    drop_signalled: bool,
}

/// The bounded receive queue.
pub(crate) struct Inbox {
    capacity: usize,
    state: Mutex<State>,
    counters: Arc<NotifyCounters>,
    waker: Mutex<Option<InboxWaker>>,
}

impl Inbox {
    pub(crate) fn new(capacity: usize, counters: Arc<NotifyCounters>) -> Self {
        Self {
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

    /// Offers notification `seq` of sender engine `sender`. Sequence numbers of one sender
    /// only grow (it numbers every notification it sends, to any peer), so one at or below
    /// the last taken is a resend.
    pub(crate) fn offer(&self, sender: u64, seq: u64, note: Notification) -> NotifyOutcome {
        let mut st = self.lock();
        if st.last_seq.get(&sender).is_some_and(|&last| seq <= last) {
            return NotifyOutcome::Duplicate;
        }
        if st.last_seq.insert(sender, seq).is_none() {
            st.senders.push_back(sender);
            if st.senders.len() > MAX_SENDERS {
                if let Some(old) = st.senders.pop_front() {
                    st.last_seq.remove(&old);
                }
            }
        }
        if st.queue.len() >= self.capacity {
            let total = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let first = !std::mem::replace(&mut st.drop_signalled, true);
            drop(st);
            if first {
                self.signal(InboxSignal::Dropped {
                    from: note.from,
                    total,
                });
            }
            return NotifyOutcome::Dropped;
        }
        let was_empty = st.queue.is_empty();
        st.queue.push_back(note);
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        drop(st);
        if was_empty {
            self.signal(InboxSignal::Ready);
        }
        NotifyOutcome::Queued
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

    fn note(from: &str, n: u8) -> Notification {
        Notification {
            from: from.into(),
            engine_id: 7,
            data: vec![n],
            bytes: 0,
        }
    }

    fn inbox(cap: usize) -> (Inbox, Arc<Mutex<Vec<InboxSignal>>>) {
        let inbox = Inbox::new(cap, Arc::default());
        let seen: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let s = seen.clone();
        inbox.set_waker(Some(Arc::new(move |sig| s.lock().expect("seen").push(sig))));
        (inbox, seen)
    }

    #[test]
    fn in_order_and_ready_once_per_empty_queue() {
        let (inbox, seen) = inbox(8);
        for n in 1..=3 {
            assert_eq!(
                inbox.offer(1, n as u64, note("a", n)),
                NotifyOutcome::Queued
            );
        }
        assert_eq!(*seen.lock().expect("seen"), vec![InboxSignal::Ready]);
        let got: Vec<u8> = inbox.take(10).into_iter().map(|n| n.data[0]).collect();
        assert_eq!(got, [1, 2, 3]);
        inbox.offer(1, 4, note("a", 4));
        assert_eq!(
            seen.lock().expect("seen").len(),
            2,
            "ready again after a take emptied it"
        );
    }

    #[test]
    fn resends_are_acknowledged_but_not_queued_twice() {
        let (inbox, _) = inbox(8);
        assert_eq!(inbox.offer(1, 5, note("a", 5)), NotifyOutcome::Queued);
        assert_eq!(inbox.offer(1, 5, note("a", 5)), NotifyOutcome::Duplicate);
        assert_eq!(inbox.offer(1, 3, note("a", 3)), NotifyOutcome::Duplicate);
        // Another sender's numbers are its own.
        assert_eq!(inbox.offer(2, 1, note("b", 1)), NotifyOutcome::Queued);
        assert_eq!(inbox.len(), 2);
    }

    #[test]
    fn overflow_is_dropped_counted_and_signalled_once_per_run() {
        let counters: Arc<NotifyCounters> = Arc::default();
        let inbox = Inbox::new(4, counters.clone());
        let seen: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let s = seen.clone();
        inbox.set_waker(Some(Arc::new(move |sig| s.lock().expect("seen").push(sig))));
        let outcomes: Vec<NotifyOutcome> = (1..=10u8)
            .map(|n| inbox.offer(1, n as u64, note("a", n)))
            .collect();
        assert_eq!(&outcomes[..4], &[NotifyOutcome::Queued; 4]);
        assert_eq!(&outcomes[4..], &[NotifyOutcome::Dropped; 6]);
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
            inbox.offer(1, n as u64, note("a", n));
        }
        assert_eq!(drops(&seen), 2, "a new run of drops is signalled again");
    }

    #[test]
    fn a_waker_set_late_hears_what_waits() {
        let inbox = Inbox::new(4, Arc::default());
        inbox.offer(1, 1, note("a", 1));
        let seen: Arc<Mutex<Vec<InboxSignal>>> = Arc::default();
        let s = seen.clone();
        inbox.set_waker(Some(Arc::new(move |sig| s.lock().expect("seen").push(sig))));
        assert_eq!(*seen.lock().expect("seen"), vec![InboxSignal::Ready]);
    }

    #[test]
    fn dedup_state_is_bounded() {
        let inbox = Inbox::new(1, Arc::default());
        for sender in 0..(MAX_SENDERS as u64 + 10) {
            inbox.offer(sender, 1, note("a", 0));
        }
        let st = inbox.lock();
        assert_eq!(st.last_seq.len(), MAX_SENDERS);
        assert_eq!(st.senders.len(), MAX_SENDERS);
    }
}
