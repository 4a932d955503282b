//! The copy itself: one memcpy per span between a local region and a peer's mapping,
//! checked against the target's life before and after.

use std::sync::Arc;

use super::peer::ShmPeer;
use crate::error::{Error, Result};
use crate::kind::Opcode;
use crate::linux::RemoteMapping;
use crate::memory::Region;
use crate::request::Span;
use crate::task::Task;

/// The parts of a copy this thread does at once, borrowed from the tables it looked them up
/// in (a shared copy holds its own, `shared_copy::Shared`). Borrowing them takes no reference: the
/// peer, its mapping and the region are shared by every thread that copies to that peer,
/// and each reference taken and dropped would write their count's cache line.
pub(super) struct Copy<'a> {
    pub(super) task: &'a Arc<Task>,
    pub(super) attempt: u32,
    pub(super) peer: &'a ShmPeer,
    pub(super) mapping: &'a RemoteMapping,
    pub(super) opcode: Opcode,
    pub(super) region: &'a Region,
    pub(super) spans: &'a [Span],
}

impl Copy<'_> {
    /// Copies every span, then reports the outcome to the task.
    pub(super) fn run(&self) {
        // A cancel from another thread meanwhile settles after this copy; the outcome is
        // told with the copy over, so a failover starts on this thread at once.
        let landing = crate::fence::Landing::new(self.task);
        let outcome = copy_spans(
            self.peer,
            self.mapping,
            self.region,
            self.opcode,
            self.spans,
        );
        drop(landing);
        match outcome {
            Ok(bytes) => self.task.slice_done(self.attempt, bytes),
            Err(e) => self.task.attempt_failed(self.attempt, e),
        }
    }
}

/// Copies `spans` between `region` and `mapping` (direction by `opcode`), checking that
/// the target is alive before and after: the bytes copied, or why the copy does not count.
pub(super) fn copy_spans(
    peer: &ShmPeer,
    mapping: &RemoteMapping,
    region: &Region,
    opcode: Opcode,
    spans: &[Span],
) -> Result<u64> {
    if !peer.known_alive() {
        return Err(peer.peer.lost_error_or("target process exited"));
    }
    let mut bytes = 0;
    for span in spans {
        let (Some(remote), Ok(local)) = (
            mapping.range_ptr(span.remote_offset, span.length),
            region.range_ptr(span.local_offset, span.length),
        ) else {
            return Err(Error::OutOfRange(format!(
                "shm copy [{}+{}) outside the mapping",
                span.remote_offset, span.length
            )));
        };
        let (src, dst) = match opcode {
            Opcode::Write => (local.cast_const(), remote),
            Opcode::Read => (remote.cast_const(), local),
        };
        // SAFETY: both ranges were bounds-checked just above against mappings that are
        // alive while borrowed (`mapping`, `region`); they belong to different mappings, so
        // they do not overlap. Concurrent access by the peers is the transfer contract,
        // as with RDMA.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, span.length as usize) };
        bytes += span.length;
    }
    if peer.confirm_alive() {
        Ok(bytes)
    } else {
        Err(peer.peer.lost_error_or("target process exited"))
    }
}
