//! Block lists for tests that time long lists (the attempt-deadline tests of each
//! transport): a scattered list between a [`Pair`]'s regions, run to its end, its blocks
//! counted by status and checked byte for byte.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_core::blocks::{BlockOutcome, Blocks, PerBlock};
use ferry_core::{Opcode, TransferStatus, TransportHint};

use crate::{bytes_at, Pair};

/// `n` blocks of `len` bytes written from the initiator's region to the target's: local
/// block `i` to remote block `(i * 7) % n` (`n` not a multiple of 7), so no two
/// neighbours merge and the list travels span by span. Over the transports `hint` allows.
pub fn scattered(p: &Pair, n: u64, len: u64, hint: TransportHint) -> Blocks {
    assert!(
        n % 7 != 0,
        "{n} blocks: a multiple of 7 would map blocks onto each other"
    );
    Blocks {
        opcode: Opcode::Write,
        local: PerBlock::One(p.local.id()),
        segment: PerBlock::One(p.seg),
        remote_buffer: PerBlock::One(p.remote.id()),
        local_offsets: (0..n).map(|i| i * len).collect(),
        remote_offsets: (0..n).map(|i| (i * 7 % n) * len).collect(),
        lengths: PerBlock::One(len),
        hint,
        verify: false,
    }
}

/// Every block of `blocks` (each `len` bytes) is where the list says.
pub fn every_block_landed(p: &Pair, blocks: &Blocks, len: u64) {
    for (b, (l, r)) in blocks
        .local_offsets
        .iter()
        .zip(&blocks.remote_offsets)
        .enumerate()
    {
        assert!(
            bytes_at(&p.local, *l, len) == bytes_at(&p.remote, *r, len),
            "block {b} differs"
        );
    }
}

/// Runs a block list through `transfer_blocks` from the initiator: its outcome and how
/// long it took (panics if it has not ended within `bound`).
pub fn run_list(p: &Pair, blocks: &Blocks, bound: Duration) -> (BlockOutcome, Duration) {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    p.initiator
        .transfer_blocks(blocks, move |o| {
            let _ = tx.send(o);
        })
        .expect("submitted");
    let outcome = rx.recv_timeout(bound).expect("the list ended");
    (outcome, started.elapsed())
}

/// How many blocks of `outcome` ended `status`.
pub fn blocks_with(outcome: &BlockOutcome, status: TransferStatus) -> usize {
    outcome
        .status
        .iter()
        .filter(|s| **s == status.raw())
        .count()
}

/// A list whose queue takes longer than `deadline` on a healthy peer ended with every
/// block completed and right, no TIMEOUT, no attempt timed out; `took` longer than the
/// deadline, or the list proved nothing.
pub fn assert_no_timeout(
    p: &Pair,
    blocks: &Blocks,
    len: u64,
    (outcome, took): (BlockOutcome, Duration),
    deadline: Duration,
) {
    let n = blocks.local_offsets.len();
    let timeouts = blocks_with(&outcome, TransferStatus::Timeout);
    eprintln!(
        "{n} blocks: {timeouts} TIMEOUT, {took:?}, {} attempt timeouts, first failure {:?}",
        p.initiator.metrics().attempt_timeouts,
        outcome.failed.first()
    );
    assert!(
        took > deadline,
        "the list took {took:?}: too short to prove anything"
    );
    assert_eq!(
        (timeouts, outcome.failed.len()),
        (0, 0),
        "{timeouts} of {n} blocks ended TIMEOUT in {took:?}"
    );
    assert_eq!(blocks_with(&outcome, TransferStatus::Completed), n);
    assert_eq!(p.initiator.metrics().attempt_timeouts, 0);
    every_block_landed(p, blocks, len);
}

/// The deadline of a full-size measurement (an `#[ignore]`d test run by hand):
/// `FERRY_FULL_SIZE_DEADLINE_MS` (0 = none), 1 s by default.
pub fn full_size_deadline() -> Option<Duration> {
    let ms = std::env::var("FERRY_FULL_SIZE_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Prints a full-size measurement's figures (`what`: transport and shape) and checks that
/// no block ended TIMEOUT and every byte is right.
pub fn report_full_size(
    what: &str,
    p: &Pair,
    blocks: &Blocks,
    len: u64,
    (outcome, took): (BlockOutcome, Duration),
    deadline: Option<Duration>,
) {
    let n = blocks.local_offsets.len();
    let timeouts = blocks_with(&outcome, TransferStatus::Timeout);
    eprintln!(
        "{what}, deadline {deadline:?}: {timeouts} TIMEOUT ({:.1} %), {} completed, {} tasks, {took:?}, {} attempt timeouts",
        100.0 * timeouts as f64 / n as f64,
        blocks_with(&outcome, TransferStatus::Completed),
        outcome.requests,
        p.initiator.metrics().attempt_timeouts,
    );
    assert_eq!(timeouts, 0);
    every_block_landed(p, blocks, len);
}

/// Tasks of a batch that completed.
pub fn completed(snaps: &[ferry_core::TaskSnapshot]) -> usize {
    snaps
        .iter()
        .filter(|s| s.status == TransferStatus::Completed)
        .count()
}
