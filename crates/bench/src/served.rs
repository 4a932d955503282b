//! What served a case: the transports that moved its bytes, with their shares, the
//! failovers it took and the notifications it sent, from the difference of the engine's
//! metrics at the end of its warm-up and at its end.
//!
//! The engine counts completed bytes per (transport, op) and attempts that failed over
//! (`Engine::metrics`), so a case costs two snapshots and no per-request bookkeeping in
//! the measured loop. The bench engine runs one case at a time, and the runner takes the
//! first snapshot when every worker's warm-up is over (`crate::warmup`), so the difference
//! is that case's measured part, as its rows are.

use ferry_core::metrics::Metrics;
use ferry_core::Opcode;
use serde::Serialize;

/// One transport's part of a case.
#[cfg_attr(feature = "napi", napi_derive::napi(object))]
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TransportShare {
    /// Transport name (`tcp`, `shm`, `rdma`).
    pub transport: String,
    /// Bytes it moved for the case (f64 for JS, as in the report row).
    pub bytes: f64,
    /// Its share of the case's bytes, in percent.
    pub percent: f64,
}

/// The transports that served a case, largest share first, and its failovers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Served {
    /// Transports that moved bytes, largest share first.
    pub shares: Vec<TransportShare>,
    /// Attempts that failed over to another attempt during the case.
    pub failovers: u64,
    /// Notifications handed to be sent during the case.
    pub notifications_sent: u64,
    /// Notifications whose delivery failed during the case.
    pub notifications_failed: u64,
}

impl Served {
    /// The case's part of the metrics: bytes of `op` moved between `before` and `after`.
    pub fn between(before: &Metrics, after: &Metrics, op: Opcode) -> Self {
        let moved: Vec<(String, u64)> = after
            .bytes_by
            .iter()
            .filter(|b| b.op == op)
            .map(|b| {
                let earlier = before
                    .bytes_by
                    .iter()
                    .find(|x| x.op == op && x.transport == b.transport)
                    .map_or(0, |x| x.bytes);
                (
                    b.transport.name().to_string(),
                    b.bytes.saturating_sub(earlier),
                )
            })
            .collect();
        let (a, b) = (&after.notifications, &before.notifications);
        Self {
            notifications_sent: a.sent.saturating_sub(b.sent),
            notifications_failed: a.failed.saturating_sub(b.failed),
            ..Self::from_bytes(moved, after.failovers.saturating_sub(before.failovers))
        }
    }

    /// From bytes per transport (zeros are dropped).
    pub fn from_bytes(moved: Vec<(String, u64)>, failovers: u64) -> Self {
        let total: u64 = moved.iter().map(|(_, b)| *b).sum();
        let mut shares: Vec<TransportShare> = moved
            .into_iter()
            .filter(|(_, b)| *b > 0)
            .map(|(transport, b)| TransportShare {
                transport,
                bytes: b as f64,
                percent: b as f64 * 100.0 / total as f64,
            })
            .collect();
        // Largest first; equal shares in name order, so the label is stable.
        shares.sort_by(|a, b| {
            b.bytes
                .total_cmp(&a.bytes)
                .then_with(|| a.transport.cmp(&b.transport))
        });
        Self {
            shares,
            failovers,
            ..Self::default()
        }
    }

    /// The label of tebench's headers: `shm (100 %)` for one transport, `tcp 90 %, shm 10 %`
    /// for several, `none` when nothing moved. A share under 1 % reads `<1 %`, never `0 %`.
    pub fn label(&self) -> String {
        let pct = |p: f64| {
            if p < 1.0 {
                "<1 %".to_string()
            } else {
                format!("{} %", p.round() as u64)
            }
        };
        match self.shares.as_slice() {
            [] => "none".to_string(),
            [one] => format!("{} ({})", one.transport, pct(one.percent)),
            many => many
                .iter()
                .map(|s| format!("{} {}", s.transport, pct(s.percent)))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::metrics::BytesBy;
    use ferry_core::TransportKind;

    use super::*;

    fn metrics(bytes: &[(TransportKind, Opcode, u64)], failovers: u64) -> Metrics {
        Metrics {
            bytes_by: bytes
                .iter()
                .map(|&(transport, op, bytes)| BytesBy {
                    transport,
                    op,
                    bytes,
                })
                .collect(),
            failovers,
            ..Metrics::default()
        }
    }

    #[test]
    fn one_transport_reads_with_its_hundred_percent() {
        let before = metrics(&[(TransportKind::Shm, Opcode::Write, 100)], 0);
        let after = metrics(&[(TransportKind::Shm, Opcode::Write, 4196)], 0);
        let s = Served::between(&before, &after, Opcode::Write);
        assert_eq!(s.label(), "shm (100 %)");
        assert_eq!(s.shares[0].bytes, 4096.0);
        assert_eq!(s.failovers, 0);
    }

    #[test]
    fn several_transports_largest_first_and_only_the_op_of_the_case() {
        let before = metrics(
            &[
                (TransportKind::Tcp, Opcode::Write, 0),
                (TransportKind::Shm, Opcode::Write, 0),
                (TransportKind::Shm, Opcode::Read, 0),
            ],
            2,
        );
        let after = metrics(
            &[
                (TransportKind::Tcp, Opcode::Write, 900),
                (TransportKind::Shm, Opcode::Write, 100),
                (TransportKind::Shm, Opcode::Read, 5000),
            ],
            7,
        );
        let s = Served::between(&before, &after, Opcode::Write);
        assert_eq!(s.label(), "tcp 90 %, shm 10 %");
        assert_eq!(s.failovers, 5);
        let r = Served::between(&before, &after, Opcode::Read);
        assert_eq!(r.label(), "shm (100 %)");
    }

    #[test]
    fn tiny_shares_and_nothing_moved() {
        let s = Served::from_bytes(vec![("tcp".into(), 999), ("shm".into(), 1)], 1);
        assert_eq!(s.label(), "tcp 100 %, shm <1 %");
        assert_eq!(
            Served::from_bytes(vec![("tcp".into(), 0)], 0).label(),
            "none"
        );
        let even = Served::from_bytes(vec![("tcp".into(), 5), ("shm".into(), 5)], 0);
        assert_eq!(even.label(), "shm 50 %, tcp 50 %");
    }
}
