//! The messages of a notification connection, one codec each, used by both sides.
//!
//! After the handshake (which names the sender's engine id and proves the cluster secret)
//! the sender opens a session with `NotifyOpen`: the receiver incarnation it planned
//! against (`buffer_id`), its session token (`token`), the number of the first
//! notification it sends on this connection (`offset`), and its segment name (payload).
//! The target answers `NotifyAck` with `request_id` 0: `Taken` (the session is this
//! connection's) or `OtherIncarnation` (it is not the engine the sender planned for; the
//! connection then ends). Each `Notify` (`request_id` = its sequence number, `offset` =
//! the bytes of its call) is answered in order by a `NotifyAck` whose `flags` are an
//! `Answer`; every answer carries the target's engine id in `buffer_id`.

use super::outcome::NotifyOutcome;
use super::sessions::SessionToken;
use crate::error::{Error, Result};
use crate::wire::{Header, Op};

/// `NotifyOpen`, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Open {
    /// The receiver incarnation (engine id) the sender planned against.
    pub(crate) receiver: u64,
    /// The sender's session with that incarnation.
    pub(crate) token: SessionToken,
    /// The sequence number of the first notification on this connection.
    pub(crate) first: u64,
    /// The sender's segment name.
    pub(crate) name: String,
}

impl Open {
    pub(crate) fn encode(&self) -> (Header, Vec<u8>) {
        let mut h = Header::new(Op::NotifyOpen);
        h.buffer_id = self.receiver;
        h.token = self.token;
        h.offset = self.first;
        h.length = self.name.len() as u64;
        (h, self.name.as_bytes().to_vec())
    }

    pub(crate) fn decode(h: &Header, name: Vec<u8>) -> Result<Self> {
        if h.op != Op::NotifyOpen {
            return Err(Error::Protocol(format!(
                "a notification connection starts with NotifyOpen, got {:?}",
                h.op
            )));
        }
        let name = String::from_utf8(name)
            .map_err(|_| Error::Protocol("the sender's segment name is not UTF-8".into()))?;
        Ok(Self {
            receiver: h.buffer_id,
            token: h.token,
            first: h.offset,
            name,
        })
    }
}

/// What the target answers, in `NotifyAck.flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum Answer {
    /// The open: the session is this connection's. A notification: queued.
    Taken = 0,
    /// Dropped: the receive queue was full.
    Dropped = 1,
    // 2 was "a resend, not queued again": a resend is now answered as its first copy was.
    /// The sequence number is not within the session's window: refused, nothing changed.
    OutOfWindow = 3,
    /// This engine is not the incarnation the sender planned for: refused.
    OtherIncarnation = 4,
    /// Another connection took the session over: refused here; the sender reconnects.
    Superseded = 5,
}

impl Answer {
    pub(crate) fn from_raw(raw: u16) -> Option<Self> {
        Some(match raw {
            0 => Self::Taken,
            1 => Self::Dropped,
            3 => Self::OutOfWindow,
            4 => Self::OtherIncarnation,
            5 => Self::Superseded,
            _ => return None,
        })
    }

    /// The answer for what the inbox did with a notification.
    pub(crate) fn of(outcome: NotifyOutcome) -> Self {
        match outcome {
            NotifyOutcome::Queued => Self::Taken,
            NotifyOutcome::Dropped => Self::Dropped,
        }
    }

    /// Whether the target refused (and counted) rather than took it.
    pub(crate) fn is_refusal(self) -> bool {
        !matches!(self, Self::Taken | Self::Dropped)
    }

    /// The `NotifyAck` of `request_id` (0 for the open) from engine `receiver`.
    pub(crate) fn frame(self, request_id: u64, receiver: u64) -> Header {
        let mut h = Header::new(Op::NotifyAck);
        h.request_id = request_id;
        h.flags = self as u16;
        h.buffer_id = receiver;
        h
    }
}

/// Why a notification planned for incarnation `planned` cannot be delivered by `reached`.
pub(crate) fn restarted(peer: &str, planned: u64, reached: u64) -> Error {
    Error::NotifyRefused(format!(
        "{peer} restarted: the notification follows data sent to engine {planned}, and \
         engine {reached} answers there now"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_round_trips_through_a_header() {
        let open = Open {
            receiver: 42,
            token: [3; 16],
            first: 17,
            name: "127.0.0.1:9".into(),
        };
        let (h, body) = open.encode();
        let bytes = h.encode();
        let back = Header::decode(&bytes).expect("header");
        assert_eq!(Open::decode(&back, body).expect("open"), open);
    }

    #[test]
    fn hostile_opens_and_answers_are_refused() {
        let (h, _) = Open {
            receiver: 1,
            token: [0; 16],
            first: 1,
            name: String::new(),
        }
        .encode();
        let e = Open::decode(&h, vec![0xff, 0xfe]).expect_err("not UTF-8");
        assert_eq!(e.code(), "ERR_FERRY_PROTOCOL");
        let e = Open::decode(&Header::new(Op::Notify), Vec::new()).expect_err("not an open");
        assert_eq!(e.code(), "ERR_FERRY_PROTOCOL");
        assert_eq!(Answer::from_raw(2), None, "retired");
        assert_eq!(Answer::from_raw(u16::MAX), None);
        for a in [
            Answer::Taken,
            Answer::Dropped,
            Answer::OutOfWindow,
            Answer::OtherIncarnation,
            Answer::Superseded,
        ] {
            let h = a.frame(5, 9);
            assert_eq!(Answer::from_raw(h.flags), Some(a));
            assert_eq!((h.op, h.request_id, h.buffer_id), (Op::NotifyAck, 5, 9));
        }
    }
}
