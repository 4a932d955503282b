//! Per-peer transfer counters, with a bounded number of series.
//!
//! Each peer name gets a series of its own the first time it is opened, up to a cap; every
//! later name shares one series labelled `other`, so a cluster that churns through names
//! keeps the exposition (and Prometheus's index) bounded. A series outlives its peer's
//! close and is found again by name when the peer is opened again, so its counters only
//! grow. Each series has a slot per lane (`tally.rs`): threads transferring to the same
//! peer write no cache line in common, and a thread holding its lane alone adds without
//! atomics.

use std::sync::{Arc, Mutex};

use crate::status::TransferStatus;
use crate::tally::{Owned, Tally};

/// Peer names with a series of their own, per engine; the rest count as `other`.
pub const PEER_SERIES_CAP: usize = 64;
/// The label of the series the names past the cap share.
pub const OTHER_PEERS: &str = "other";

/// One lane's counts for one peer.
#[derive(Debug, Default)]
struct PeerCounts {
    completed: Tally,
    failed: Tally,
    bytes: Tally,
}

/// The counters of one peer (or of every peer past the cap).
#[derive(Debug, Default)]
pub struct PeerSeries {
    lanes: Owned<PeerCounts>,
}

impl PeerSeries {
    /// Counts a transfer to this peer that ended with `status` (its bytes if it completed).
    pub fn ended(&self, status: TransferStatus, bytes: u64) {
        let (c, w) = self.lanes.local();
        if status == TransferStatus::Completed {
            c.completed.add(1, w);
            c.bytes.add(bytes, w);
        } else {
            c.failed.add(1, w);
        }
    }

    /// Counts `n` completed transfers of `bytes` in all.
    pub fn completed(&self, n: u64, bytes: u64) {
        let (c, w) = self.lanes.local();
        c.completed.add(n, w);
        c.bytes.add(bytes, w);
    }

    fn read(&self, peer: &str) -> PeerFigures {
        let sum = |f: fn(&PeerCounts) -> &Tally| self.lanes.iter().map(|c| f(c).get()).sum();
        PeerFigures {
            peer: peer.to_string(),
            completed: sum(|c| &c.completed),
            failed: sum(|c| &c.failed),
            bytes: sum(|c| &c.bytes),
        }
    }
}

/// One peer's counters as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerFigures {
    /// The peer's segment name, or [`OTHER_PEERS`].
    pub peer: String,
    /// Transfers to it that completed.
    pub completed: u64,
    /// Transfers to it that ended otherwise (failed, timed out, canceled).
    pub failed: u64,
    /// Bytes its completed transfers moved.
    pub bytes: u64,
}

/// The engine's series: one per name up to the cap, then `other`.
#[derive(Debug)]
pub struct PeerSeriesTable {
    cap: usize,
    named: Mutex<Vec<(String, Arc<PeerSeries>)>>,
    other: Arc<PeerSeries>,
}

impl Default for PeerSeriesTable {
    fn default() -> Self {
        Self::with_cap(PEER_SERIES_CAP)
    }
}

impl PeerSeriesTable {
    /// A table that gives at most `cap` names a series of their own.
    pub fn with_cap(cap: usize) -> Self {
        Self {
            cap,
            named: Mutex::default(),
            other: Arc::default(),
        }
    }

    /// The series of peer `name`: its own while fewer than the cap were named, else
    /// `other`. Called when a peer is opened, not per transfer.
    pub fn series(&self, name: &str) -> Arc<PeerSeries> {
        let mut named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, s)) = named.iter().find(|(n, _)| n == name) {
            return s.clone();
        }
        if named.len() >= self.cap {
            return self.other.clone();
        }
        let s = Arc::<PeerSeries>::default();
        named.push((name.to_string(), s.clone()));
        s
    }

    /// Every named series in the order they were first opened, then `other` (zeros too).
    pub fn read(&self) -> Vec<PeerFigures> {
        let named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        named
            .iter()
            .map(|(name, s)| s.read(name))
            .chain(std::iter::once(self.other.read(OTHER_PEERS)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_cap_share_the_other_series() {
        let table = PeerSeriesTable::with_cap(2);
        let a = table.series("a:1");
        table.series("b:1").ended(TransferStatus::Failed, 10);
        table.series("c:1").completed(3, 300);
        table.series("d:1").ended(TransferStatus::Completed, 5);
        a.ended(TransferStatus::Completed, 7);
        // Opened again: the same series.
        table.series("a:1").ended(TransferStatus::Timeout, 7);
        let read = table.read();
        let labels: Vec<&str> = read.iter().map(|f| f.peer.as_str()).collect();
        assert_eq!(labels, ["a:1", "b:1", OTHER_PEERS]);
        assert_eq!(
            read[0],
            PeerFigures {
                peer: "a:1".into(),
                completed: 1,
                failed: 1,
                bytes: 7
            }
        );
        assert_eq!(
            (read[1].completed, read[1].failed, read[1].bytes),
            (0, 1, 0)
        );
        assert_eq!((read[2].completed, read[2].bytes), (4, 305));
    }

    #[test]
    fn the_default_cap_bounds_the_series() {
        let table = PeerSeriesTable::default();
        for i in 0..PEER_SERIES_CAP * 3 {
            table.series(&format!("host{i}:1"));
        }
        assert_eq!(table.read().len(), PEER_SERIES_CAP + 1);
    }
}
