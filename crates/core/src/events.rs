//! The engine's event stream: what happened (peer lost or recovered, failover, a
//! transport taken out of use), delivered to one sink, or kept (bounded) until one is set.

use std::sync::{Arc, Mutex};

use crate::kind::TransportKind;
use crate::liveness::LossReason;

/// Something that happened to the engine, for the event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineEvent {
    /// A peer was declared lost; its in-flight work failed.
    PeerLost {
        /// Segment name.
        segment: String,
        /// Why.
        reason: LossReason,
    },
    /// A lost peer answers again.
    PeerRecovered {
        /// Segment name.
        segment: String,
    },
    /// A transport was taken out of use: towards one peer by the rail monitor (`segment`
    /// and `until_ms` set), or on this engine because it failed to install at start.
    TransportDisabled {
        /// The transport.
        transport: TransportKind,
        /// The peer it is paused towards; `None` for an install failure.
        segment: Option<String>,
        /// Why.
        reason: String,
        /// End of the pause, in ms since the Unix epoch; `None` for an install failure.
        until_ms: Option<u64>,
    },
    /// A task's attempt failed and it moved to another attempt.
    Failover {
        /// Segment name.
        segment: String,
        /// Transport of the failed attempt.
        from: TransportKind,
        /// Transport of the new attempt.
        to: TransportKind,
        /// Switches this task has made, this one included.
        attempt: u32,
        /// Why the attempt failed.
        reason: String,
    },
}

/// Where events go.
pub type EventSink = Arc<dyn Fn(EngineEvent) + Send + Sync>;

/// Events kept while no sink is set (start-time ones included).
const BACKLOG: usize = 256;

/// The sink, and the events that came while there was none.
#[derive(Default)]
pub(crate) struct EventHub {
    sink: Mutex<Option<EventSink>>,
    backlog: Mutex<Vec<EngineEvent>>,
}

impl EventHub {
    /// A hub holding `backlog` for the first sink.
    pub(crate) fn with_backlog(backlog: Vec<EngineEvent>) -> Self {
        Self {
            sink: Mutex::new(None),
            backlog: Mutex::new(backlog),
        }
    }

    /// Replaces the sink; the backlog goes to the new one first.
    pub(crate) fn set_sink(&self, sink: Option<EventSink>) {
        let mut current = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sink) = &sink {
            let backlog =
                std::mem::take(&mut *self.backlog.lock().unwrap_or_else(|p| p.into_inner()));
            for e in backlog {
                sink(e);
            }
        }
        *current = sink;
    }

    /// Delivers `event`, or keeps it (when `keep` and there is room) for the next sink.
    pub(crate) fn emit(&self, event: EngineEvent, keep: bool) {
        let sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        match sink.clone() {
            Some(sink_fn) => {
                drop(sink);
                sink_fn(event);
            }
            // Kept under the sink's lock, so `set_sink` cannot miss it.
            None => {
                let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
                if keep && backlog.len() < BACKLOG {
                    backlog.push(event);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recovered(n: usize) -> EngineEvent {
        EngineEvent::PeerRecovered {
            segment: n.to_string(),
        }
    }

    #[test]
    fn events_before_a_sink_are_kept_bounded_and_delivered_first() {
        let hub = EventHub::with_backlog(vec![recovered(0)]);
        for n in 1..BACKLOG + 10 {
            hub.emit(recovered(n), true);
        }
        hub.emit(recovered(9999), false);
        let seen: Arc<Mutex<Vec<EngineEvent>>> = Arc::default();
        let s = seen.clone();
        hub.set_sink(Some(Arc::new(move |e| s.lock().expect("seen").push(e))));
        hub.emit(recovered(7777), false);
        let seen = seen.lock().expect("seen");
        assert_eq!(seen.len(), BACKLOG + 1);
        assert_eq!(seen[0], recovered(0));
        assert_eq!(seen[BACKLOG - 1], recovered(BACKLOG - 1));
        assert_eq!(seen[BACKLOG], recovered(7777));
    }
}
