//! Every metric family `metricsText()` exposes: its name, type, labels and help, in the
//! order they are written. The one list: the exposition (`metrics::Metrics::to_prometheus`)
//! writes each family's HELP and TYPE from here, and a test checks that it writes exactly
//! these; documentation tables are checked against it.
//!
//! Names follow Prometheus's conventions: the `ferry_` prefix, the unit in the name
//! (`_bytes`, `_seconds`), `_total` for counters, `_info` for a gauge that is always 1 and
//! carries its facts as labels. Label values that come from outside (a peer's name) are
//! bounded in number (`peer_series`).

/// A family's type, as the TYPE line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    /// Only grows (resets when the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets (`_bucket{le}`), `_sum` and `_count`.
    Histogram,
}

impl FamilyKind {
    /// The word of the TYPE line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// One family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub kind: FamilyKind,
    /// The labels of its samples, in order (`le` of a histogram's buckets not included).
    pub labels: &'static [&'static str],
    /// The HELP line's text.
    pub help: &'static str,
}

const fn family(
    name: &'static str,
    kind: FamilyKind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family {
        name,
        kind,
        labels,
        help,
    }
}

use FamilyKind::{Counter, Gauge, Histogram};

/// `ferry_build_info`.
pub const BUILD_INFO: Family = family(
    "ferry_build_info",
    Gauge,
    &["version", "commit", "rustc", "node"],
    "The build of Ferry serving these metrics (always 1): package version, git commit \
     (unknown unless FERRY_COMMIT was set at build time), rustc and Node versions.",
);
/// `ferry_bytes_total`.
pub const BYTES: Family = family(
    "ferry_bytes_total",
    Counter,
    &["transport", "op"],
    "Bytes moved by completed transfers, by transport and operation.",
);
/// `ferry_transfer_duration_seconds`.
pub const TRANSFER_DURATION: Family = family(
    "ferry_transfer_duration_seconds",
    Histogram,
    &["transport", "op"],
    "Duration of completed transfers, from the call that submitted them to their \
     completion, by the transport that served them and operation.",
);
/// `ferry_transfers_total`.
pub const TRANSFERS: Family = family(
    "ferry_transfers_total",
    Counter,
    &["status"],
    "Transfer tasks that ended, by final status.",
);
/// `ferry_transfers_submitted_total`.
pub const SUBMITTED: Family = family(
    "ferry_transfers_submitted_total",
    Counter,
    &[],
    "Transfer tasks submitted.",
);
/// `ferry_inflight_transfers`.
pub const INFLIGHT: Family = family(
    "ferry_inflight_transfers",
    Gauge,
    &[],
    "Transfer tasks submitted and not yet ended.",
);
/// `ferry_peer_transfers_total`.
pub const PEER_TRANSFERS: Family = family(
    "ferry_peer_transfers_total",
    Counter,
    &["peer"],
    "Transfer tasks to a peer that completed, by peer segment name (the first 64 names \
     opened; later ones count as peer=\"other\").",
);
/// `ferry_peer_transfer_failures_total`.
pub const PEER_FAILURES: Family = family(
    "ferry_peer_transfer_failures_total",
    Counter,
    &["peer"],
    "Transfer tasks to a peer that ended otherwise (failed, timed out, canceled), by peer \
     segment name (as ferry_peer_transfers_total).",
);
/// `ferry_peer_bytes_total`.
pub const PEER_BYTES: Family = family(
    "ferry_peer_bytes_total",
    Counter,
    &["peer"],
    "Bytes moved by completed transfers to a peer, by peer segment name (as \
     ferry_peer_transfers_total).",
);
/// `ferry_failovers_total`.
pub const FAILOVERS: Family = family(
    "ferry_failovers_total",
    Counter,
    &[],
    "Attempts that failed and moved to another transport or attempt.",
);
/// `ferry_integrity_failures_total`.
pub const INTEGRITY_FAILURES: Family = family(
    "ferry_integrity_failures_total",
    Counter,
    &["transport"],
    "Verified transfers whose bytes failed their end-to-end check (verify), by transport: \
     corruption on the way, never retried.",
);
/// `ferry_attempt_timeouts_total`.
pub const ATTEMPT_TIMEOUTS: Family = family(
    "ferry_attempt_timeouts_total",
    Counter,
    &[],
    "Attempts that ran past their deadline (attemptTimeoutMs).",
);
/// `ferry_peer_losses_total`.
pub const PEER_LOSSES: Family = family(
    "ferry_peer_losses_total",
    Counter,
    &[],
    "Times a peer was declared lost.",
);
/// `ferry_peer_recoveries_total`.
pub const PEER_RECOVERIES: Family = family(
    "ferry_peer_recoveries_total",
    Counter,
    &[],
    "Times a lost peer answered again.",
);
/// `ferry_transports_disabled_total`.
pub const TRANSPORTS_DISABLED: Family = family(
    "ferry_transports_disabled_total",
    Counter,
    &[],
    "Times a transport was taken out of use towards a peer by the rail monitor.",
);
/// `ferry_segments_open`.
pub const SEGMENTS_OPEN: Family =
    family("ferry_segments_open", Gauge, &[], "Remote segments open.");
/// `ferry_regions`.
pub const REGIONS: Family = family(
    "ferry_regions",
    Gauge,
    &[],
    "Local memory regions registered.",
);
/// `ferry_auth_failures_total`.
pub const AUTH_FAILURES: Family = family(
    "ferry_auth_failures_total",
    Counter,
    &["reason"],
    "Connections whose handshake failed, by reason.",
);
/// `ferry_connections_refused_total`.
pub const CONNECTIONS_REFUSED: Family = family(
    "ferry_connections_refused_total",
    Counter,
    &["reason"],
    "Connections refused by maxConnections or maxConnectionsPerAddress, or pushed out of \
     the full handshake budget (evicted).",
);
/// `ferry_notifications_sent_total`.
pub const NOTIFY_SENT: Family = family(
    "ferry_notifications_sent_total",
    Counter,
    &[],
    "Notifications handed to a peer's outbox.",
);
/// `ferry_notifications_delivered_total`.
pub const NOTIFY_DELIVERED: Family = family(
    "ferry_notifications_delivered_total",
    Counter,
    &[],
    "Notifications their target acknowledged (queued or dropped there).",
);
/// `ferry_notifications_failed_total`.
pub const NOTIFY_FAILED: Family = family(
    "ferry_notifications_failed_total",
    Counter,
    &[],
    "Notifications whose delivery failed (peer lost, closed, refused, timed out).",
);
/// `ferry_notifications_received_total`.
pub const NOTIFY_RECEIVED: Family = family(
    "ferry_notifications_received_total",
    Counter,
    &[],
    "Notifications queued here for the application.",
);
/// `ferry_notifications_dropped_total`.
pub const NOTIFY_DROPPED: Family = family(
    "ferry_notifications_dropped_total",
    Counter,
    &[],
    "Notifications dropped here because the receive queue (notifyQueueSize) was full.",
);
/// `ferry_notifications_refused_total`.
pub const NOTIFY_REFUSED: Family = family(
    "ferry_notifications_refused_total",
    Counter,
    &[],
    "Notifications refused here: planned for another incarnation of this engine, a \
     sequence number outside its session's window, or a superseded connection.",
);
/// `ferry_notifications_queued`.
pub const NOTIFY_QUEUED: Family = family(
    "ferry_notifications_queued",
    Gauge,
    &[],
    "Notifications waiting in the receive queue.",
);

/// Every family, in the order the exposition writes them.
pub const FAMILIES: &[Family] = &[
    BUILD_INFO,
    BYTES,
    TRANSFER_DURATION,
    TRANSFERS,
    SUBMITTED,
    INFLIGHT,
    PEER_TRANSFERS,
    PEER_FAILURES,
    PEER_BYTES,
    FAILOVERS,
    INTEGRITY_FAILURES,
    ATTEMPT_TIMEOUTS,
    PEER_LOSSES,
    PEER_RECOVERIES,
    TRANSPORTS_DISABLED,
    SEGMENTS_OPEN,
    REGIONS,
    AUTH_FAILURES,
    CONNECTIONS_REFUSED,
    NOTIFY_SENT,
    NOTIFY_DELIVERED,
    NOTIFY_FAILED,
    NOTIFY_RECEIVED,
    NOTIFY_DROPPED,
    NOTIFY_REFUSED,
    NOTIFY_QUEUED,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut seen = std::collections::HashSet::new();
        for f in FAMILIES {
            assert!(seen.insert(f.name), "{} twice", f.name);
            assert!(f.name.starts_with("ferry_"), "{}", f.name);
            let valid = |s: &str| {
                s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            };
            assert!(valid(f.name), "{}", f.name);
            assert!(
                f.labels.iter().all(|l| valid(l) && *l != "le"),
                "{}",
                f.name
            );
            assert_eq!(
                f.kind == Counter,
                f.name.ends_with("_total"),
                "{}: _total is for counters, and every counter",
                f.name
            );
            if f.kind == Histogram {
                assert!(f.name.ends_with("_seconds"), "{}: a unit", f.name);
            }
            assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
        }
    }
}
