//! Engine counters as the object `metrics()` returns.

use ferry_core::{Metrics, Opcode};
use napi_derive::napi;

/// Bytes of completed transfers over one transport for one operation.
#[napi(object)]
pub struct BytesByTransport {
    /// "tcp", "shm" or "rdma".
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: String,
    /// "read" or "write".
    #[napi(ts_type = "'read' | 'write'")]
    pub op: String,
    /// Bytes.
    pub bytes: f64,
}

/// Engine counters.
#[napi(object)]
pub struct EngineMetrics {
    /// Tasks submitted.
    pub tasks_submitted: f64,
    /// Tasks completed.
    pub tasks_completed: f64,
    /// Tasks that ended otherwise.
    pub tasks_failed: f64,
    /// Bytes moved by completed tasks.
    pub bytes_transferred: f64,
    /// Bytes of completed tasks by transport and op.
    pub bytes: Vec<BytesByTransport>,
    /// Tasks that ended, by final status name in lower case (completed, failed, timeout,
    /// canceled, invalid).
    pub transfers: std::collections::HashMap<String, f64>,
    /// Transfers submitted and not yet ended.
    pub inflight: f64,
    /// Times a peer was declared lost.
    pub peers_lost: f64,
    /// Times a lost peer answered again.
    pub peers_recovered: f64,
    /// Attempts that failed over.
    pub failovers: f64,
    /// Verified transfers whose bytes failed their end-to-end check, by transport name.
    pub integrity_failures: std::collections::HashMap<String, f64>,
    /// Attempts that passed their deadline.
    pub attempt_timeouts: f64,
    /// Times the rail monitor took a (peer, transport) path out of use.
    pub transports_disabled: f64,
    /// Remote segments open.
    pub segments_open: f64,
    /// Registered regions.
    pub regions: f64,
    /// Notifications handed to a peer's outbox.
    pub notifications_sent: f64,
    /// Notifications their target acknowledged.
    pub notifications_delivered: f64,
    /// Notifications whose delivery failed.
    pub notifications_failed: f64,
    /// Notifications received and queued here.
    pub notifications_received: f64,
    /// Notifications dropped here: the receive queue was full.
    pub notifications_dropped: f64,
    /// Notifications refused here: planned for another incarnation of this engine, a
    /// sequence number outside its session's window, or a superseded connection.
    pub notifications_refused: f64,
    /// Notifications waiting in the receive queue.
    pub notifications_queued: f64,
    /// Connections that failed the cluster-secret handshake, by reason (every reason,
    /// zeros too; `ferry_auth_failures_total{reason}`).
    pub auth_failures: std::collections::HashMap<String, f64>,
    /// Connections refused by a cap once they authenticated (`total`, `per_address`), or
    /// pushed out of the full handshake budget before (`evicted`).
    pub connections_refused: std::collections::HashMap<String, f64>,
}

fn by_reason(counts: &[(&'static str, u64)]) -> std::collections::HashMap<String, f64> {
    counts
        .iter()
        .map(|(r, n)| ((*r).to_string(), *n as f64))
        .collect()
}

impl From<Metrics> for EngineMetrics {
    fn from(m: Metrics) -> Self {
        Self {
            tasks_submitted: m.tasks_submitted as f64,
            tasks_completed: m.tasks_completed as f64,
            tasks_failed: m.tasks_failed as f64,
            bytes_transferred: m.bytes_transferred as f64,
            bytes: m
                .bytes_by
                .iter()
                .map(|b| BytesByTransport {
                    transport: b.transport.name().into(),
                    op: match b.op {
                        Opcode::Read => "read".into(),
                        Opcode::Write => "write".into(),
                    },
                    bytes: b.bytes as f64,
                })
                .collect(),
            transfers: m
                .transfers_by_status
                .iter()
                .map(|(s, n)| (s.name().to_ascii_lowercase(), *n as f64))
                .collect(),
            inflight: m.inflight as f64,
            peers_lost: m.peers_lost as f64,
            peers_recovered: m.peers_recovered as f64,
            failovers: m.failovers as f64,
            integrity_failures: m
                .integrity_failures
                .iter()
                .map(|(k, n)| (k.name().to_string(), *n as f64))
                .collect(),
            attempt_timeouts: m.attempt_timeouts as f64,
            transports_disabled: m.transports_disabled as f64,
            segments_open: m.segments_open as f64,
            regions: m.regions as f64,
            notifications_sent: m.notifications.sent as f64,
            notifications_delivered: m.notifications.delivered as f64,
            notifications_failed: m.notifications.failed as f64,
            notifications_received: m.notifications.received as f64,
            notifications_dropped: m.notifications.dropped as f64,
            notifications_refused: m.notifications.refused as f64,
            notifications_queued: m.notifications.queued as f64,
            auth_failures: by_reason(&m.auth_failures),
            connections_refused: by_reason(&m.connections_refused),
        }
    }
}

/// What an engine spreads its work over (`Engine.spread()`).
#[napi(object)]
pub struct EngineSpreadJs {
    /// The runtime's I/O threads.
    pub io_threads: u32,
    /// Tcp lanes (data connections) per peer; null when tcp is not enabled.
    pub tcp_lanes: Option<u32>,
    /// Shm copy threads; null when shm is not enabled.
    pub shm_copy_threads: Option<u32>,
}

impl From<ferry_core::EngineSpread> for EngineSpreadJs {
    fn from(s: ferry_core::EngineSpread) -> Self {
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Self {
            io_threads: n(s.io_threads),
            tcp_lanes: s.tcp_lanes.map(n),
            shm_copy_threads: s.shm_copy_threads.map(n),
        }
    }
}
