//! A core error as a value JS reads: its code by number (names in lib/tables.ts), its
//! message, and for a peer loss the peer and why, as fields — so the TypeScript layer never
//! reads any of them out of the message.

use ferry_core::{Error, ErrorCode, Numbered};
use napi_derive::napi;

/// Why something failed.
#[napi(object)]
#[derive(Debug, Clone, PartialEq)]
pub struct FailureJs {
    /// The error code's number (`ErrorCode`; its name in `ERROR_CODE_NAMES`).
    pub code: u32,
    /// The message.
    pub message: String,
    /// A peer loss: the lost peer's segment name.
    pub lost_peer: Option<String>,
    /// A peer loss: why, by number (`LossKind`; its name in `LOSS_REASON_NAMES`).
    pub loss_reason: Option<u32>,
    /// A peer loss: why, in words (what the `peerLost` event says).
    pub loss_message: Option<String>,
}

impl FailureJs {
    /// A failure of `code` with no peer loss to tell.
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code: code.number(),
            message: message.into(),
            lost_peer: None,
            loss_reason: None,
            loss_message: None,
        }
    }
}

impl From<&Error> for FailureJs {
    fn from(e: &Error) -> Self {
        let failure = Self::new(e.error_code(), e.to_string());
        match e {
            Error::PeerLost { peer, reason } => Self {
                lost_peer: Some(peer.clone()),
                loss_reason: Some(reason.kind().number()),
                loss_message: Some(reason.to_string()),
                ..failure
            },
            _ => failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::LossReason;

    #[test]
    fn a_peer_loss_carries_its_peer_and_reason_as_fields() {
        // A peer name that reads like the message's own wording.
        let e = Error::PeerLost {
            peer: "a lost: b".into(),
            reason: LossReason::Broken("reset".into()),
        };
        assert_eq!(
            FailureJs::from(&e),
            FailureJs {
                code: 12,
                message: "peer a lost: b lost: control connection failed: reset".into(),
                lost_peer: Some("a lost: b".into()),
                loss_reason: Some(3),
                loss_message: Some("control connection failed: reset".into()),
            }
        );
        let other = FailureJs::from(&Error::Timeout);
        assert_eq!(
            other,
            FailureJs::new(ErrorCode::Timeout, "operation timed out")
        );
        assert_eq!(other.code, 19);
    }
}
