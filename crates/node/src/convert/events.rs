//! Engine events (peer lost and recovered, failover, a transport paused) as the objects
//! the event handler receives.

use ferry_core::EngineEvent;
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
    /// Failover: transport of the failed attempt.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub from: Option<String>,
    /// Failover: transport of the new attempt.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub to: Option<String>,
    /// Failover: switches made by the task, this one included.
    pub attempt: Option<u32>,
    /// transportDisabled: the transport.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: Option<String>,
    /// transportDisabled: end of the pause, ms since the Unix epoch.
    pub until_ms: Option<f64>,
}

impl EngineEventJs {
    fn new(kind: &str, segment: Option<String>) -> Self {
        Self {
            kind: kind.into(),
            segment,
            reason: None,
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
                reason: Some(reason),
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
                from: Some(from.name().into()),
                to: Some(to.name().into()),
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
                transport: Some(transport.name().into()),
                until_ms: until_ms.map(|v| v as f64),
                ..Self::new("transportDisabled", segment)
            },
            _ => Self::new("unknown", None),
        }
    }
}
