//! Submitting a block list (`blocks`): every block is checked against the engine's regions
//! and buffers, the list is merged into requests and small requests are gathered, and the
//! resulting units go the ordinary way — `transfer` (one callback for all of them) or a
//! batch.

use std::sync::Arc;

use crate::blocks::{BlockMap, BlockOutcome, Blocks, Gathered, GATHER};
use crate::error::{Error, Result};
use crate::inner::Inner;

/// A block list submitted to a batch: its tasks and which blocks each covers.
#[derive(Debug, Clone)]
pub struct BlockSubmission {
    /// Index of the first task in the batch; the list's tasks follow it in order.
    pub first_task: usize,
    /// Which blocks each task covers: request `r` is task `first_task + r`.
    pub map: BlockMap,
}

impl Inner {
    /// Checks every block (shape, then each range), merges the list and gathers its
    /// small requests; nothing is submitted here.
    pub(crate) fn gather_blocks(&self, blocks: &Blocks) -> Result<Gathered> {
        self.check_open()?;
        blocks.check_shape()?;
        blocks.check_bounds(
            |id| self.regions.get(id).map(|r| r.len() as u64),
            |segment, buffer| {
                let peer = self.segments.get(segment)?;
                let length = peer.descriptor().buffer(buffer).map(|b| b.length);
                length.ok_or_else(|| Error::UnknownBuffer {
                    segment: peer.name().to_string(),
                    buffer,
                })
            },
        )?;
        Ok(blocks.gather(GATHER))
    }

    /// Submits a block list; `on_done` gets every block's outcome once all have ended.
    /// Returns the operation id (for `cancel`) and the number of tasks.
    pub(crate) fn transfer_blocks<F>(
        self: &Arc<Self>,
        blocks: &Blocks,
        on_done: F,
    ) -> Result<(u64, usize)>
    where
        F: FnOnce(BlockOutcome) + Send + 'static,
    {
        let Gathered { units, map } = self.gather_blocks(blocks)?;
        let count = units.len();
        let op = self.transfer(&units, move |snaps| on_done(map.outcome(&snaps)))?;
        Ok((op, count))
    }

    /// Submits a block list as tasks of `batch`.
    pub(crate) fn submit_blocks(
        self: &Arc<Self>,
        batch: u64,
        blocks: &Blocks,
    ) -> Result<BlockSubmission> {
        let Gathered { units, map } = self.gather_blocks(blocks)?;
        let first_task = self.submit_transfer(batch, &units)?;
        Ok(BlockSubmission { first_task, map })
    }
}
