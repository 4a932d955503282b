//! Engine counters and their Prometheus text exposition.
//!
//! The counters are plain atomics bumped where a task ends ([`TaskCounters`]), so the hot
//! path takes no lock; [`Metrics`] is a point-in-time copy, and [`Metrics::to_prometheus`]
//! renders it in the text exposition format (version 0.0.4). Rendering is pure code.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::kind::Opcode;
use crate::kind::TransportKind;
use crate::latency::{LatencyCounters, LatencyHistogram};
use crate::metric_families::Family;
use crate::peer_series::PeerFigures;
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

/// Counts per transport, one lane each (`TransportKind`'s numbers are 1..=3).
#[derive(Debug, Default)]
pub(crate) struct PerTransport([AtomicU64; 3]);

impl PerTransport {
    /// Counts one for `kind`.
    pub(crate) fn add(&self, kind: TransportKind) {
        if let Some(c) = self.0.get(kind as usize - 1) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every transport's count, zeros too.
    pub(crate) fn read(&self) -> Vec<(TransportKind, u64)> {
        <TransportKind as crate::numbered::Numbered>::ALL
            .iter()
            .map(|k| {
                let n = self
                    .0
                    .get(*k as usize - 1)
                    .map_or(0, |c| c.load(Ordering::Relaxed));
                (*k, n)
            })
            .collect()
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
    /// Verified transfers whose bytes failed their end-to-end check, by transport (every
    /// transport, zeros too).
    pub integrity_failures: Vec<(TransportKind, u64)>,
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
    /// Durations of completed transfers by transport and op (every one, zeros too).
    pub latency: Vec<LatencyHistogram>,
    /// Transfers per peer: the named series, then `other`.
    pub peers: Vec<PeerFigures>,
    /// What this build is.
    pub build: BuildInfo,
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

    /// Fills the latency histograms from `c` (every transport and op).
    pub fn with_latency(mut self, c: &LatencyCounters) -> Self {
        self.latency = TRANSPORTS
            .iter()
            .flat_map(|t| [Opcode::Read, Opcode::Write].map(|op| c.read(*t, op)))
            .collect();
        self
    }

    /// The Prometheus text exposition format (0.0.4): `# HELP` and `# TYPE` before each
    /// family, every family of [`FAMILIES`](crate::metric_families::FAMILIES) in its order.
    pub fn to_prometheus(&self) -> String {
        use crate::metric_families as f;
        let mut out = Exposition::default();
        let b = &self.build;
        let node = b.node.as_deref().unwrap_or("none");
        out.family(&f::BUILD_INFO, &[([b.version, b.commit, b.rustc, node], 1)]);
        let bytes: Vec<([&str; 2], u64)> = self
            .bytes_by
            .iter()
            .map(|b| ([b.transport.name(), op_name(b.op)], b.bytes))
            .collect();
        out.family(&f::BYTES, &bytes);
        out.histograms(&f::TRANSFER_DURATION, &self.latency);
        let statuses: Vec<([String; 1], u64)> = self
            .transfers_by_status
            .iter()
            .map(|(s, n)| ([s.name().to_ascii_lowercase()], *n))
            .collect();
        out.family(&f::TRANSFERS, &statuses);
        out.plain(&f::SUBMITTED, self.tasks_submitted);
        out.plain(&f::INFLIGHT, self.inflight);
        let per_peer = |v: fn(&PeerFigures) -> u64| -> Vec<([&str; 1], u64)> {
            self.peers
                .iter()
                .map(|p| ([p.peer.as_str()], v(p)))
                .collect()
        };
        out.family(&f::PEER_TRANSFERS, &per_peer(|p| p.completed));
        out.family(&f::PEER_FAILURES, &per_peer(|p| p.failed));
        out.family(&f::PEER_BYTES, &per_peer(|p| p.bytes));
        out.plain(&f::FAILOVERS, self.failovers);
        let integrity: Vec<([&str; 1], u64)> = self
            .integrity_failures
            .iter()
            .map(|(k, n)| ([k.name()], *n))
            .collect();
        out.family(&f::INTEGRITY_FAILURES, &integrity);
        out.plain(&f::ATTEMPT_TIMEOUTS, self.attempt_timeouts);
        out.plain(&f::PEER_LOSSES, self.peers_lost);
        out.plain(&f::PEER_RECOVERIES, self.peers_recovered);
        out.plain(&f::TRANSPORTS_DISABLED, self.transports_disabled);
        out.plain(&f::SEGMENTS_OPEN, self.segments_open);
        out.plain(&f::REGIONS, self.regions);
        let by_reason = |v: &[(&'static str, u64)]| -> Vec<([&'static str; 1], u64)> {
            v.iter().map(|(r, n)| ([*r], *n)).collect()
        };
        out.family(&f::AUTH_FAILURES, &by_reason(&self.auth_failures));
        out.family(
            &f::CONNECTIONS_REFUSED,
            &by_reason(&self.connections_refused),
        );
        let n = &self.notifications;
        out.plain(&f::NOTIFY_SENT, n.sent);
        out.plain(&f::NOTIFY_DELIVERED, n.delivered);
        out.plain(&f::NOTIFY_FAILED, n.failed);
        out.plain(&f::NOTIFY_RECEIVED, n.received);
        out.plain(&f::NOTIFY_DROPPED, n.dropped);
        out.plain(&f::NOTIFY_REFUSED, n.refused);
        out.plain(&f::NOTIFY_QUEUED, n.queued);
        out.text
    }
}

fn op_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Read => "read",
        Opcode::Write => "write",
    }
}

/// What this build is, for `ferry_build_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildInfo {
    /// The package version.
    pub version: &'static str,
    /// The git commit, when `FERRY_COMMIT` named it at build time; else `unknown`.
    pub commit: &'static str,
    /// The compiler's version.
    pub rustc: &'static str,
    /// The Node.js version of the process, when the binding says it.
    pub node: Option<String>,
}

impl BuildInfo {
    /// This build's facts (no Node version: the binding adds it).
    pub fn of_this_build() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION"),
            commit: option_env!("FERRY_COMMIT")
                .filter(|c| !c.is_empty())
                .unwrap_or("unknown"),
            rustc: option_env!("FERRY_RUSTC_VERSION").unwrap_or("unknown"),
            node: None,
        }
    }
}

/// The exposition being written.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn head(&mut self, f: &Family) {
        let _ = writeln!(self.text, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(self.text, "# TYPE {} {}", f.name, f.kind.name());
    }

    /// `name{labels} value`, the label values escaped.
    fn sample(
        &mut self,
        name: &str,
        f: &Family,
        values: &[&str],
        extra: Option<(&str, &str)>,
        v: impl std::fmt::Display,
    ) {
        self.text.push_str(name);
        let mut pairs = f
            .labels
            .iter()
            .copied()
            .zip(values.iter().copied())
            .chain(extra);
        if let Some((l, v)) = pairs.next() {
            let _ = write!(self.text, "{{{l}=\"{}\"", escape_label(v));
            for (l, v) in pairs {
                let _ = write!(self.text, ",{l}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {v}");
    }

    /// A family of samples, each its label values (as many as the family's labels) and value.
    fn family<L: AsRef<str>, const N: usize>(&mut self, f: &Family, samples: &[([L; N], u64)]) {
        debug_assert_eq!(f.labels.len(), N, "{}", f.name);
        self.head(f);
        for (labels, v) in samples {
            let values: [&str; N] = std::array::from_fn(|i| labels[i].as_ref());
            self.sample(f.name, f, &values, None, v);
        }
    }

    /// A family of one sample without labels.
    fn plain(&mut self, f: &Family, v: u64) {
        self.family::<&str, 0>(f, &[([], v)]);
    }

    /// A histogram family by transport and op: cumulative buckets in seconds, sum, count.
    fn histograms(&mut self, f: &Family, hs: &[LatencyHistogram]) {
        self.head(f);
        let bucket = format!("{}_bucket", f.name);
        let (sum, count) = (format!("{}_sum", f.name), format!("{}_count", f.name));
        for h in hs {
            let labels = [h.transport.name(), op_name(h.op)];
            let mut cumulative = 0u64;
            for (i, n) in h.buckets.iter().enumerate() {
                cumulative += n;
                let le = if i < crate::latency::FINITE_BUCKETS {
                    seconds(crate::latency::bound_ns(i))
                } else {
                    "+Inf".to_string()
                };
                self.sample(&bucket, f, &labels, Some(("le", &le)), cumulative);
            }
            self.sample(&sum, f, &labels, None, seconds(h.sum_ns));
            self.sample(&count, f, &labels, None, cumulative);
        }
    }
}

/// Nanoseconds as seconds, the shortest decimal that reads back the same.
fn seconds(ns: u64) -> String {
    format!("{}", ns as f64 / 1e9)
}

/// A label value as the exposition format writes it: `\`, `"` and newlines escaped.
fn escape_label(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
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
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .filter_map(|s| name.strip_suffix(s))
                    .find(|base| typed.get(*base).is_some_and(|k| k == "histogram"))
                    .unwrap_or(name);
                assert!(typed.contains_key(family), "{line}");
            }
        }
        // Exactly the listed families, in their order.
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let listed: Vec<&str> = crate::metric_families::FAMILIES
            .iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(families, listed);
    }

    /// The samples of `name` in `text`: their labels as written, and their values.
    fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
        text.lines()
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let labels = series.strip_prefix(name)?;
                (labels.is_empty() || labels.starts_with('{')).then_some((labels, value))
            })
            .collect()
    }

    #[test]
    fn latency_histograms_are_cumulative_buckets_in_seconds_with_sum_and_count() {
        let c = crate::latency::LatencyCounters::default();
        c.record(TransportKind::Shm, Opcode::Write, 300, 3);
        c.record(TransportKind::Shm, Opcode::Write, 2_000_000_000, 1);
        let text = Metrics::default().with_latency(&c).to_prometheus();
        assert!(text.contains("# TYPE ferry_transfer_duration_seconds histogram\n"));
        let buckets = samples(&text, "ferry_transfer_duration_seconds_bucket");
        assert_eq!(
            buckets.len(),
            6 * crate::latency::BUCKETS,
            "every transport and op"
        );
        let shm_write: Vec<(f64, u64)> = buckets
            .iter()
            .filter(|(l, _)| l.starts_with("{transport=\"shm\",op=\"write\",le=\""))
            .map(|(l, v)| {
                let le = l.split("le=\"").nth(1).unwrap().trim_end_matches("\"}");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, v.parse().unwrap())
            })
            .collect();
        assert_eq!(shm_write.len(), crate::latency::BUCKETS);
        assert_eq!(shm_write[0], (2.56e-7, 0));
        assert_eq!(shm_write[1], (5.12e-7, 3));
        assert!(shm_write
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(shm_write.last(), Some(&(f64::INFINITY, 4)));
        assert_eq!(
            shm_write[shm_write.len() - 2].1,
            4,
            "2 s is under the last bound"
        );
        let sum = samples(&text, "ferry_transfer_duration_seconds_sum");
        assert!(sum.contains(&("{transport=\"shm\",op=\"write\"}", "2.0000009")));
        let count = samples(&text, "ferry_transfer_duration_seconds_count");
        assert!(count.contains(&("{transport=\"shm\",op=\"write\"}", "4")));
        assert!(count.contains(&("{transport=\"tcp\",op=\"read\"}", "0")));
    }

    #[test]
    fn build_info_and_per_peer_series_with_escaped_names() {
        let m = Metrics {
            build: BuildInfo {
                node: Some("20.1.0".into()),
                ..BuildInfo::of_this_build()
            },
            peers: vec![
                PeerFigures {
                    peer: "a\"b\\c\nd:1".into(),
                    completed: 2,
                    failed: 1,
                    bytes: 64,
                },
                PeerFigures {
                    peer: crate::peer_series::OTHER_PEERS.into(),
                    ..PeerFigures::default()
                },
            ],
            ..Metrics::default()
        };
        let text = m.to_prometheus();
        let info = samples(&text, "ferry_build_info");
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(info.len(), 1);
        assert!(
            info[0]
                .0
                .starts_with(&format!("{{version=\"{version}\",commit=\"")),
            "{info:?}"
        );
        assert!(info[0].0.ends_with(",node=\"20.1.0\"}"), "{info:?}");
        assert_eq!(info[0].1, "1");
        assert!(!info[0].0.contains("rustc=\"unknown\""), "{info:?}");
        assert_eq!(
            samples(&text, "ferry_peer_transfers_total"),
            [
                ("{peer=\"a\\\"b\\\\c\\nd:1\"}", "2"),
                ("{peer=\"other\"}", "0")
            ]
        );
        assert_eq!(
            samples(&text, "ferry_peer_transfer_failures_total")[0].1,
            "1"
        );
        assert_eq!(samples(&text, "ferry_peer_bytes_total")[0].1, "64");
    }
}
