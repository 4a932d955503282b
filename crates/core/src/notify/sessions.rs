//! The receiving side's notification sessions. A sender opens one session per receiver
//! incarnation: a random 128-bit token it draws and sends only on its own authenticated
//! connections (its link, or its notification connections). Sequence numbers and their window (`window`) belong to the
//! session, keyed by (sender engine id, token), so a connection that merely claims another
//! engine's id — with or without the cluster secret — gets a session of its own and can
//! touch no one else's numbers. One connection holds a session at a time; the sender
//! reconnecting with its token takes it over (the old connection may not have noticed the
//! break yet), and anything the superseded connection still sends is refused.
//!
//! Bounded: held sessions are bounded by the connections the engine admits; sessions
//! without a connection are kept for resends (up to `MAX_IDLE`, the longest idle forgotten
//! first). A forgotten session resumes where its sender says — a resend across that could
//! then be queued twice. Pure: no sockets, no clock.

use std::collections::HashMap;

use super::window::SeqWindow;

/// Sessions kept without a connection, for resends after a reconnect.
pub(crate) const MAX_IDLE: usize = 4096;

/// A session token, drawn by the sender.
pub(crate) type SessionToken = [u8; 16];

/// Which session: the sender's engine id (as its handshake claimed) and its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub(crate) sender: u64,
    pub(crate) token: SessionToken,
}

/// One connection's hold on a session; worthless once another connection took it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding {
    key: SessionKey,
    generation: u64,
}

impl Binding {
    pub(crate) fn sender(&self) -> u64 {
        self.key.sender
    }
}

struct Entry {
    window: SeqWindow,
    /// The binding that holds it now (or held it last).
    generation: u64,
    connected: bool,
    /// When it was released (a tick of `Sessions::clock`), for forgetting the oldest.
    idle_since: u64,
}

/// The table of sessions.
pub(crate) struct Sessions {
    map: HashMap<SessionKey, Entry>,
    next_generation: u64,
    idle: usize,
    clock: u64,
    max_idle: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::with_max_idle(MAX_IDLE)
    }
}

impl Sessions {
    pub(crate) fn with_max_idle(max_idle: usize) -> Self {
        Self {
            map: HashMap::new(),
            next_generation: 1,
            idle: 0,
            clock: 0,
            max_idle,
        }
    }

    /// Binds a connection to session `key`, whose next notification from this connection
    /// is `first`: a session known here keeps its numbers (the sender resends from within
    /// them); a new one starts at `first`.
    pub(crate) fn bind(&mut self, key: SessionKey, first: u64) -> Binding {
        let generation = self.next_generation;
        self.next_generation += 1;
        match self.map.get_mut(&key) {
            Some(e) => {
                if !e.connected {
                    self.idle -= 1;
                }
                e.connected = true;
                e.generation = generation;
            }
            None => {
                self.map.insert(
                    key,
                    Entry {
                        window: SeqWindow::starting_at(first),
                        generation,
                        connected: true,
                        idle_since: 0,
                    },
                );
            }
        }
        Binding { key, generation }
    }

    /// The session's numbers, while `b` holds it.
    pub(crate) fn window(&mut self, b: &Binding) -> Option<&mut SeqWindow> {
        self.map
            .get_mut(&b.key)
            .filter(|e| e.generation == b.generation)
            .map(|e| &mut e.window)
    }

    /// The connection of `b` ended: its session waits for a reconnect, or is forgotten
    /// when too many wait.
    pub(crate) fn release(&mut self, b: &Binding) {
        let Some(e) = self.map.get_mut(&b.key) else {
            return;
        };
        if e.generation != b.generation || !e.connected {
            return;
        }
        e.connected = false;
        e.idle_since = self.clock;
        self.clock += 1;
        self.idle += 1;
        if self.idle > self.max_idle {
            let oldest = self
                .map
                .iter()
                .filter(|(_, e)| !e.connected)
                .min_by_key(|(_, e)| e.idle_since)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.map.remove(&k);
                self.idle -= 1;
            }
        }
    }

    /// Sessions known (held and idle).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::window::Judged;
    use crate::notify::NotifyOutcome;

    fn key(sender: u64, t: u8) -> SessionKey {
        SessionKey {
            sender,
            token: [t; 16],
        }
    }

    fn take(s: &mut Sessions, b: &Binding, seq: u64) -> Option<Judged> {
        let w = s.window(b)?;
        let j = w.judge(seq);
        if j == Judged::Next {
            w.record(seq, NotifyOutcome::Queued);
        }
        Some(j)
    }

    #[test]
    fn a_claimed_id_with_another_token_cannot_touch_the_real_session() {
        let mut s = Sessions::default();
        let real = s.bind(key(7, 1), 1);
        assert_eq!(take(&mut s, &real, 1), Some(Judged::Next));
        let forger = s.bind(key(7, 2), 1);
        assert_eq!(take(&mut s, &forger, u64::MAX), Some(Judged::OutOfWindow));
        assert_eq!(
            take(&mut s, &forger, 1),
            Some(Judged::Next),
            "its own numbers"
        );
        assert_eq!(take(&mut s, &real, 2), Some(Judged::Next), "untouched");
        assert_eq!(real.sender(), forger.sender());
    }

    #[test]
    fn the_token_holder_takes_its_session_over_and_keeps_its_numbers() {
        let mut s = Sessions::default();
        let old = s.bind(key(7, 1), 1);
        for seq in 1..=3 {
            take(&mut s, &old, seq);
        }
        // Reconnected before the old connection was noticed gone; resends from 3.
        let new = s.bind(key(7, 1), 3);
        assert_eq!(
            take(&mut s, &new, 3),
            Some(Judged::Resend(NotifyOutcome::Queued))
        );
        assert_eq!(
            take(&mut s, &old, 4),
            None,
            "the old connection is superseded"
        );
        s.release(&old);
        assert_eq!(
            take(&mut s, &new, 4),
            Some(Judged::Next),
            "its release is moot"
        );
        s.release(&new);
        let again = s.bind(key(7, 1), 5);
        assert_eq!(take(&mut s, &again, 5), Some(Judged::Next));
    }

    #[test]
    fn idle_sessions_are_bounded_and_held_ones_are_kept() {
        let mut s = Sessions::with_max_idle(3);
        let held = s.bind(key(1, 0), 1);
        take(&mut s, &held, 1);
        for sender in 2..12 {
            let b = s.bind(key(sender, 0), 1);
            s.release(&b);
        }
        assert_eq!(
            s.len(),
            4,
            "the held session and the 3 idle ones released last"
        );
        assert_eq!(take(&mut s, &held, 2), Some(Judged::Next));
        // The oldest idle were forgotten: a session resumes where its sender says.
        let back = s.bind(key(2, 0), 9);
        assert_eq!(take(&mut s, &back, 9), Some(Judged::Next));
        assert_eq!(s.len(), 5);
    }
}
