//! Engine events (peer lost and recovered, failover, a transport paused) as the objects
//! the event handler receives: transports and loss reasons by number (lib/events.ts gives
//! them their names).

use ferry_core::{EngineEvent, Numbered};
use napi_derive::napi;

/// An engine event.
#[napi(object)]
pub struct EngineEventJs {
    /// "peerLost", "peerRecovered", "failover" or "transportDisabled".
    pub kind: String,
    /// Segment name (absent for a transport that failed to install).
    pub segment: Option<String>,
    /// Reason, for peerLost, failover and transportDisabled.
    pub reason: Option<String>,
    /// peerLost: why, by number (`LossKind`).
    pub loss_reason: Option<u32>,
    /// Failover: transport number of the failed attempt.
    pub from: Option<u32>,
    /// Failover: transport number of the new attempt.
    pub to: Option<u32>,
    /// Failover: switches made by the task, this one included.
    pub attempt: Option<u32>,
    /// transportDisabled: the transport's number.
    pub transport: Option<u32>,
    /// transportDisabled: end of the pause, ms since the Unix epoch.
    pub until_ms: Option<f64>,
}

impl EngineEventJs {
    fn new(kind: &str, segment: Option<String>) -> Self {
        Self {
            kind: kind.into(),
            segment,
            reason: None,
            loss_reason: None,
            from: None,
            to: None,
            attempt: None,
            transport: None,
            until_ms: None,
        }
    }
}

impl From<EngineEvent> for EngineEventJs {
    fn from(e: EngineEvent) -> Self {
        match e {
            EngineEvent::PeerLost { segment, reason } => Self {
                loss_reason: Some(reason.kind().number()),
                reason: Some(reason.to_string()),
                ..Self::new("peerLost", Some(segment))
            },
            EngineEvent::PeerRecovered { segment } => Self::new("peerRecovered", Some(segment)),
            EngineEvent::Failover {
                segment,
                from,
                to,
                attempt,
                reason,
            } => Self {
                reason: Some(reason),
                from: Some(from.number()),
                to: Some(to.number()),
                attempt: Some(attempt),
                ..Self::new("failover", Some(segment))
            },
            EngineEvent::TransportDisabled {
                transport,
                segment,
                reason,
                until_ms,
            } => Self {
                reason: Some(reason),
                transport: Some(transport.number()),
                until_ms: until_ms.map(|v| v as f64),
                ..Self::new("transportDisabled", segment)
            },
            _ => Self::new("unknown", None),
        }
    }
}
