//! Engine counters and their Prometheus text exposition.
//!
//! The counters are plain atomics bumped where a task ends ([`TaskCounters`]), so the hot
//! path takes no lock; [`Metrics`] is a point-in-time copy, and [`Metrics::to_prometheus`]
//! renders it in the text exposition format (version 0.0.4). Rendering is pure code.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::kind::Opcode;
use crate::kind::TransportKind;
use crate::status::TransferStatus;

/// Transports in the order the per-transport counters are kept ([`TransportKind::index`]).
pub const TRANSPORTS: [TransportKind; 3] = crate::kind::BY_INDEX;
/// Terminal statuses in the order they are reported.
pub const FINAL_STATUSES: [TransferStatus; 5] = [
    TransferStatus::Completed,
    TransferStatus::Failed,
    TransferStatus::Timeout,
    TransferStatus::Canceled,
    TransferStatus::Invalid,
];

fn op_index(op: Opcode) -> usize {
    match op {
        Opcode::Read => 0,
        Opcode::Write => 1,
    }
}

/// Per-transport, per-op byte counts and per-status task counts: one atomic each.
#[derive(Debug, Default)]
pub struct TaskCounters {
    /// Tasks that ended, indexed by raw status value.
    by_status: [AtomicU64; 7],
    /// Bytes of completed tasks, `[transport raw - 1][read 0 | write 1]`.
    bytes: [[AtomicU64; 2]; 3],
}

impl TaskCounters {
    /// Counts a task that ended with `status`; a completed one adds its bytes to the
    /// transport that served it.
    pub fn task_ended(
        &self,
        status: TransferStatus,
        transport: Option<TransportKind>,
        op: Opcode,
        bytes: u64,
    ) {
        self.by_status[usize::from(status.raw()).min(6)].fetch_add(1, Ordering::Relaxed);
        if status == TransferStatus::Completed {
            if let Some(t) = transport {
                self.bytes[t.index()][op_index(op)].fetch_add(bytes, Ordering::Relaxed);
            }
        }
    }

    /// Adds `bytes` moved by `transport` for `op`, of a request counted apart (completed
    /// at submission: `completed_n` adds their count when they are summed).
    pub(crate) fn moved(&self, transport: TransportKind, op: Opcode, bytes: u64) {
        self.bytes[transport.index()][op_index(op)].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Adds `n` completed tasks.
    pub(crate) fn completed_n(&self, n: u64) {
        let completed = usize::from(TransferStatus::Completed.raw());
        self.by_status[completed].fetch_add(n, Ordering::Relaxed);
    }

    /// Adds every count of `other` to this one's.
    pub fn add(&self, other: &TaskCounters) {
        for (mine, theirs) in self.by_status.iter().zip(&other.by_status) {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (mine, theirs) in self
            .bytes
            .iter()
            .flatten()
            .zip(other.bytes.iter().flatten())
        {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Tasks that ended with `status`.
    pub fn ended(&self, status: TransferStatus) -> u64 {
        self.by_status[usize::from(status.raw()).min(6)].load(Ordering::Relaxed)
    }

    /// Tasks that ended, whatever their status.
    pub fn ended_total(&self) -> u64 {
        self.by_status
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes completed over `transport` by `op`.
    pub fn bytes(&self, transport: TransportKind, op: Opcode) -> u64 {
        self.bytes[transport.index()][op_index(op)].load(Ordering::Relaxed)
    }

    /// Tasks that completed.
    pub fn completed(&self) -> u64 {
        self.ended(TransferStatus::Completed)
    }

    /// Tasks that ended in any other terminal status.
    pub fn failed(&self) -> u64 {
        self.ended_total().saturating_sub(self.completed())
    }

    /// Bytes of every completed task.
    pub fn bytes_total(&self) -> u64 {
        self.bytes
            .iter()
            .flatten()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// Bytes one transport moved for one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BytesBy {
    /// Transport that served the completed tasks.
    pub transport: TransportKind,
    /// Read or write.
    pub op: Opcode,
    /// Bytes of completed tasks.
    pub bytes: u64,
}

/// Counters for `metrics()`: a point-in-time copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Tasks submitted.
    pub tasks_submitted: u64,
    /// Tasks completed.
    pub tasks_completed: u64,
    /// Tasks that ended otherwise.
    pub tasks_failed: u64,
    /// Bytes moved by completed tasks.
    pub bytes_transferred: u64,
    /// Bytes of completed tasks by transport and op (every transport and op, zeros too).
    pub bytes_by: Vec<BytesBy>,
    /// Tasks that ended, by final status (every terminal status, zeros too).
    pub transfers_by_status: Vec<(TransferStatus, u64)>,
    /// Tasks submitted and not yet ended.
    pub inflight: u64,
    /// Times a peer was declared lost.
    pub peers_lost: u64,
    /// Times a lost peer answered again.
    pub peers_recovered: u64,
    /// Attempts that failed over to another attempt.
    pub failovers: u64,
    /// Attempts that ran past their deadline.
    pub attempt_timeouts: u64,
    /// Times the rail monitor paused a (peer, transport) path.
    pub transports_disabled: u64,
    /// Segments open.
    pub segments_open: u64,
    /// Regions registered.
    pub regions: u64,
    /// Failed handshakes by reason (`no_secret`, `bad_proof`, …; zeros too).
    pub auth_failures: Vec<(&'static str, u64)>,
    /// Connections refused by a cap once they authenticated (`total`, `per_address`), or
    /// pushed out of the full handshake budget before (`evicted`).
    pub connections_refused: Vec<(&'static str, u64)>,
    /// Notifications sent, received, dropped and waiting.
    pub notifications: NotifyMetrics,
}

/// Notification counters (`notify`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotifyMetrics {
    /// Handed to an outbox to send.
    pub sent: u64,
    /// Acknowledged by their target.
    pub delivered: u64,
    /// Whose delivery failed.
    pub failed: u64,
    /// Queued here for the application.
    pub received: u64,
    /// Dropped here: the receive queue was full.
    pub dropped: u64,
    /// Refused here: planned for another incarnation, a sequence number outside its
    /// session's window, or from a connection whose session was taken over.
    pub refused: u64,
    /// Waiting in the receive queue now.
    pub queued: u64,
}

/// Notification counters (`notify`; kept with the engine's other counters, readable after
/// close).
#[derive(Debug, Default)]
pub struct NotifyCounters {
    /// Notifications handed to an outbox.
    pub sent: AtomicU64,
    /// Notifications the target acknowledged (queued or dropped there).
    pub delivered: AtomicU64,
    /// Notifications whose delivery failed (peer lost, closed, refused, timed out).
    pub failed: AtomicU64,
    /// Notifications queued here for the application.
    pub received: AtomicU64,
    /// Notifications dropped here because the queue was full.
    pub dropped: AtomicU64,
    /// Notifications (and sessions) refused here: planned for another incarnation, out of
    /// their session's window, or superseded.
    pub refused: AtomicU64,
}

impl NotifyCounters {
    /// Notifications whose delivery ended: delivered or failed.
    pub fn ended(&self) -> u64 {
        let delivered = self.delivered.load(Ordering::Relaxed);
        delivered.saturating_add(self.failed.load(Ordering::Relaxed))
    }

    /// Notifications handed to an outbox whose delivery has not ended yet
    /// (sent − delivered − failed). Three relaxed atomic loads: an estimate for bounding a
    /// backlog, not a snapshot. The ends are read before `sent` (a notification is counted
    /// sent before its end is), and the difference saturates at 0; a failure counted for a
    /// notification that never reached an outbox (its segment unknown or closed) makes it
    /// read lower, never higher.
    pub fn in_flight(&self) -> u64 {
        let ended = self.ended();
        self.sent.load(Ordering::Relaxed).saturating_sub(ended)
    }
}

impl NotifyMetrics {
    /// Reads the counters, with `queued` waiting now.
    pub fn read(c: &NotifyCounters, queued: u64) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        Self {
            sent: c.sent.load(Relaxed),
            delivered: c.delivered.load(Relaxed),
            failed: c.failed.load(Relaxed),
            received: c.received.load(Relaxed),
            dropped: c.dropped.load(Relaxed),
            refused: c.refused.load(Relaxed),
            queued,
        }
    }
}

impl Metrics {
    /// Fills the per-transport and per-status figures from `c`.
    pub fn with_tasks(mut self, c: &TaskCounters) -> Self {
        self.bytes_by = TRANSPORTS
            .iter()
            .flat_map(|t| {
                [Opcode::Read, Opcode::Write].map(|op| BytesBy {
                    transport: *t,
                    op,
                    bytes: c.bytes(*t, op),
                })
            })
            .collect();
        self.transfers_by_status = FINAL_STATUSES.iter().map(|s| (*s, c.ended(*s))).collect();
        self.inflight = self.tasks_submitted.saturating_sub(c.ended_total());
        self
    }

    /// The Prometheus text exposition format (0.0.4): `# HELP` and `# TYPE` before each
    /// family, counters named `*_total`.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let bytes: Vec<(String, u64)> = self
            .bytes_by
            .iter()
            .map(|b| {
                let op = match b.op {
                    Opcode::Read => "read",
                    Opcode::Write => "write",
                };
                (
                    format!("{{transport=\"{}\",op=\"{op}\"}}", b.transport.name()),
                    b.bytes,
                )
            })
            .collect();
        family(
            "ferry_bytes_total",
            "counter",
            "Bytes moved by completed transfers, by transport and operation.",
            &bytes,
        );
        let statuses: Vec<(String, u64)> = self
            .transfers_by_status
            .iter()
            .map(|(s, n)| {
                (
                    format!("{{status=\"{}\"}}", s.name().to_ascii_lowercase()),
                    *n,
                )
            })
            .collect();
        family(
            "ferry_transfers_total",
            "counter",
            "Transfer tasks that ended, by final status.",
            &statuses,
        );
        let plain = |v: u64| vec![(String::new(), v)];
        family(
            "ferry_transfers_submitted_total",
            "counter",
            "Transfer tasks submitted.",
            &plain(self.tasks_submitted),
        );
        family(
            "ferry_inflight_transfers",
            "gauge",
            "Transfer tasks submitted and not yet ended.",
            &plain(self.inflight),
        );
        family(
            "ferry_failovers_total",
            "counter",
            "Attempts that failed and moved to another transport or attempt.",
            &plain(self.failovers),
        );
        family(
            "ferry_attempt_timeouts_total",
            "counter",
            "Attempts that ran past their deadline (attemptTimeoutMs).",
            &plain(self.attempt_timeouts),
        );
        family(
            "ferry_peer_losses_total",
            "counter",
            "Times a peer was declared lost.",
            &plain(self.peers_lost),
        );
        family(
            "ferry_peer_recoveries_total",
            "counter",
            "Times a lost peer answered again.",
            &plain(self.peers_recovered),
        );
        family(
            "ferry_transports_disabled_total",
            "counter",
            "Times a transport was taken out of use towards a peer by the rail monitor.",
            &plain(self.transports_disabled),
        );
        family(
            "ferry_segments_open",
            "gauge",
            "Remote segments open.",
            &plain(self.segments_open),
        );
        family(
            "ferry_regions",
            "gauge",
            "Local memory regions registered.",
            &plain(self.regions),
        );
        let by_reason = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter()
                .map(|(r, n)| (format!("{{reason=\"{r}\"}}"), *n))
                .collect()
        };
        family(
            "ferry_auth_failures_total",
            "counter",
            "Connections whose handshake failed, by reason.",
            &by_reason(&self.auth_failures),
        );
        family(
            "ferry_connections_refused_total",
            "counter",
            "Connections refused by maxConnections or maxConnectionsPerAddress, or pushed out of the full handshake budget (evicted).",
            &by_reason(&self.connections_refused),
        );
        let n = &self.notifications;
        family(
            "ferry_notifications_sent_total",
            "counter",
            "Notifications handed to a peer's outbox.",
            &plain(n.sent),
        );
        family(
            "ferry_notifications_delivered_total",
            "counter",
            "Notifications their target acknowledged (queued or dropped there).",
            &plain(n.delivered),
        );
        family(
            "ferry_notifications_failed_total",
            "counter",
            "Notifications whose delivery failed (peer lost, closed, refused, timed out).",
            &plain(n.failed),
        );
        family(
            "ferry_notifications_received_total",
            "counter",
            "Notifications queued here for the application.",
            &plain(n.received),
        );
        family(
            "ferry_notifications_dropped_total",
            "counter",
            "Notifications dropped here because the receive queue (notifyQueueSize) was full.",
            &plain(n.dropped),
        );
        family(
            "ferry_notifications_refused_total",
            "counter",
            "Notifications refused here: planned for another incarnation of this engine, \
             a sequence number outside its session's window, or a superseded connection.",
            &plain(n.refused),
        );
        family(
            "ferry_notifications_queued",
            "gauge",
            "Notifications waiting in the receive queue.",
            &plain(n.queued),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_by_transport_op_and_status() {
        let c = TaskCounters::default();
        c.task_ended(
            TransferStatus::Completed,
            Some(TransportKind::Tcp),
            Opcode::Write,
            100,
        );
        c.task_ended(
            TransferStatus::Completed,
            Some(TransportKind::Shm),
            Opcode::Read,
            7,
        );
        c.task_ended(
            TransferStatus::Failed,
            Some(TransportKind::Tcp),
            Opcode::Write,
            50,
        );
        assert_eq!(c.bytes(TransportKind::Tcp, Opcode::Write), 100);
        assert_eq!(c.bytes(TransportKind::Shm, Opcode::Read), 7);
        assert_eq!(c.bytes(TransportKind::Tcp, Opcode::Read), 0);
        assert_eq!(c.ended(TransferStatus::Failed), 1);
        let m = Metrics {
            tasks_submitted: 5,
            auth_failures: vec![("bad_proof", 3)],
            ..Metrics::default()
        }
        .with_tasks(&c);
        assert_eq!(m.inflight, 2);
        assert_eq!(m.bytes_by.len(), 6);
        let text = m.to_prometheus();
        assert!(text.contains("ferry_bytes_total{transport=\"tcp\",op=\"write\"} 100\n"));
        assert!(text.contains("ferry_transfers_total{status=\"completed\"} 2\n"));
        assert!(text.contains("ferry_inflight_transfers 2\n"));
        assert!(text.contains("ferry_auth_failures_total{reason=\"bad_proof\"} 3\n"));
        // Every sample follows its family's HELP and TYPE lines; counters end in _total.
        let mut typed = std::collections::HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(kind != "counter" || name.ends_with("_total"), "{name}");
                typed.insert(name.to_string(), kind.to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(typed.contains_key(name), "{line}");
            }
        }
    }
}
