//! Requests completed at submission (no task made: a same-host copy that stays inline),
//! counted by the submitting thread in its own slot (`tally.rs`): each counts as a task
//! submitted and completed (one count for both, added in when read), with its bytes and the
//! duration of its call. A 4 KiB shm op bumps these on every call, so they take no atomic
//! add where the thread holds its lane alone.

use crate::kind::{Opcode, TransportKind, BY_INDEX};
use crate::latency::{op_index, LatencyCounters};
use crate::metrics::TaskCounters;
use crate::tally::{Owned, Tally, Writer};

/// One slot's counts.
#[derive(Debug, Default)]
struct Counts {
    done: Tally,
    /// Bytes, `[transport][read | write]`.
    bytes: [[Tally; 2]; 3],
    latency: LatencyCounters,
}

/// The engine's counts of requests completed at submission.
#[derive(Debug, Default)]
pub(crate) struct AtOnce {
    slots: Owned<Counts>,
}

impl AtOnce {
    /// Counts a request that `transport` completed while it was submitted.
    pub(crate) fn completed(&self, transport: TransportKind, opcode: Opcode, length: u64) {
        let (c, w) = self.slots.local();
        c.done.add(1, w);
        c.bytes[transport.index()][op_index(opcode)].add(length, w);
    }

    /// The calling thread's latency histograms of these requests, and how it writes them.
    pub(crate) fn latency_local(&self) -> (&LatencyCounters, Writer) {
        let (c, w) = self.slots.local();
        (&c.latency, w)
    }

    /// How many there were.
    pub(crate) fn done(&self) -> u64 {
        self.slots.iter().map(|c| c.done.get()).sum()
    }

    /// Adds their latencies to `total`.
    pub(crate) fn add_latency_to(&self, total: &LatencyCounters) {
        for c in self.slots.iter() {
            total.add(&c.latency);
        }
    }

    /// Adds them to `total` as completed tasks, with their bytes.
    pub(crate) fn add_tasks_to(&self, total: &TaskCounters) {
        for c in self.slots.iter() {
            total.completed_n(c.done.get());
            for (t, ops) in BY_INDEX.iter().zip(&c.bytes) {
                for (op, bytes) in [Opcode::Read, Opcode::Write].iter().zip(ops) {
                    total.moved(*t, *op, bytes.get());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_done_at_once_count_as_completed_tasks_with_their_bytes() {
        let at_once = AtOnce::default();
        at_once.completed(TransportKind::Shm, Opcode::Write, 4096);
        at_once.completed(TransportKind::Shm, Opcode::Read, 100);
        let (latency, w) = at_once.latency_local();
        latency.record_as(TransportKind::Shm, Opcode::Write, 300, 1, w);
        assert_eq!(at_once.done(), 2);
        let tasks = TaskCounters::default();
        at_once.add_tasks_to(&tasks);
        assert_eq!((tasks.completed(), tasks.bytes_total()), (2, 4196));
        let total = LatencyCounters::default();
        at_once.add_latency_to(&total);
        assert_eq!(total.read(TransportKind::Shm, Opcode::Write).count(), 1);
    }
}
