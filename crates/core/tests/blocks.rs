//! Block lists through two engines, over tcp and shm: merged and gathered into tasks, bytes
//! where each block says, outcomes per block, the batch form, failover of a gather, and
//! bad lists refused before anything moves.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_core::blocks::{Blocks, PerBlock};
use ferry_core::transports::fault::FaultSpec;
use ferry_core::{
    Engine, EngineConfig, Opcode, TaskSnapshot, TransferStatus, TransportHint, TransportKind,
};
use ferry_testkit::{bytes_at, fill, within, Pair};

const PAGE: u64 = 4096;

fn pair() -> Pair {
    pair_with(vec![TransportKind::Tcp], Vec::new(), 64 * PAGE)
}

fn pair_with(
    transports: Vec<TransportKind>,
    faults: Vec<(TransportKind, FaultSpec)>,
    len: u64,
) -> Pair {
    let target = Engine::new(EngineConfig {
        transports: transports.clone(),
        ..EngineConfig::default()
    })
    .expect("target");
    let initiator = Engine::new(EngineConfig {
        transports,
        faults,
        ..EngineConfig::default()
    })
    .expect("initiator");
    Pair::new(target, initiator, len)
}

/// `n` pages: local page `i` to remote page `(i * 7) % n` (`n` not a multiple of 7: each
/// remote page once), so that no two neighbours are contiguous on the remote side.
fn scattered(p: &Pair, opcode: Opcode, n: u64) -> Blocks {
    Blocks {
        opcode,
        local: PerBlock::One(p.local.id()),
        segment: PerBlock::One(p.seg),
        remote_buffer: PerBlock::One(p.remote.id()),
        local_offsets: (0..n).map(|i| i * PAGE).collect(),
        remote_offsets: (0..n).map(|i| (i * 7 % n) * PAGE).collect(),
        lengths: PerBlock::One(PAGE),
        hint: TransportHint::Auto,
        verify: false,
    }
}

fn run(p: &Pair, blocks: &Blocks) -> ferry_core::blocks::BlockOutcome {
    let (tx, rx) = mpsc::channel();
    p.initiator
        .transfer_blocks(blocks, move |o| {
            let _ = tx.send(o);
        })
        .expect("submitted");
    rx.recv_timeout(Duration::from_secs(20)).expect("outcome")
}

fn landed(p: &Pair, blocks: &Blocks) {
    for (b, r) in blocks.remote_offsets.iter().enumerate() {
        let l = blocks.local_offsets[b];
        assert!(
            bytes_at(&p.local, l, PAGE) == bytes_at(&p.remote, *r, PAGE),
            "block {b} differs"
        );
    }
}

/// Local pages 0..8 to remote pages 9, 10, 11 (one run), 3, 20, 21 (one run), 5, 6 (one run).
fn list(p: &Pair, opcode: Opcode) -> Blocks {
    let remote = [9, 10, 11, 3, 20, 21, 5, 6];
    Blocks {
        opcode,
        local: PerBlock::One(p.local.id()),
        segment: PerBlock::One(p.seg),
        remote_buffer: PerBlock::One(p.remote.id()),
        local_offsets: (0..8).map(|i| i * PAGE).collect(),
        remote_offsets: remote.iter().map(|r| r * PAGE).collect(),
        lengths: PerBlock::One(PAGE),
        hint: TransportHint::Auto,
        verify: false,
    }
}

#[test]
fn a_block_list_is_merged_gathered_moved_and_reported_per_block() {
    within(Duration::from_secs(30), "block transfer", || {
        let p = pair();
        fill(&p.local, 3);
        let blocks = list(&p, Opcode::Write);
        let (tx, rx) = mpsc::channel();
        let (_op, requests) = p
            .initiator
            .transfer_blocks(&blocks, move |o| {
                let _ = tx.send(o);
            })
            .expect("submitted");
        assert_eq!(requests, 1, "9-11, 3, 20-21, 5-6: four spans of one task");
        let outcome = rx.recv_timeout(Duration::from_secs(20)).expect("outcome");
        assert_eq!(outcome.requests, 1);
        assert_eq!(outcome.status, vec![TransferStatus::Completed.raw(); 8]);
        assert!(outcome.failed.is_empty());
        for (b, r) in blocks.remote_offsets.iter().enumerate() {
            let want = bytes_at(&p.local, b as u64 * PAGE, PAGE);
            assert_eq!(bytes_at(&p.remote, *r, PAGE), want, "block {b}");
        }
    });
}

#[test]
fn the_batch_form_polls_block_statuses_into_caller_memory() {
    within(Duration::from_secs(30), "block batch", || {
        let p = pair();
        fill(&p.remote, 5);
        let batch = p.initiator.allocate_batch(16).expect("batch");
        let blocks = list(&p, Opcode::Read);
        let sub = p
            .initiator
            .submit_blocks(batch, &blocks)
            .expect("submitted");
        assert_eq!(sub.first_task, 0);
        assert_eq!(sub.map.starts, vec![0, 8]);
        let mut out = [0u8; 8];
        let deadline = Instant::now() + Duration::from_secs(20);
        while p
            .initiator
            .block_status_into(batch, sub.first_task, &sub.map.starts, &mut out)
            .expect("status")
            > 0
        {
            assert!(Instant::now() < deadline, "blocks never ended");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(out, [TransferStatus::Completed.raw(); 8]);
        let mut tasks = [0xffu8; 6];
        let n = p
            .initiator
            .transfer_status_into(batch, 0, &mut tasks)
            .expect("tasks");
        assert_eq!(n, 1);
        assert_eq!(tasks, [4, 0xff, 0xff, 0xff, 0xff, 0xff]);
        for (b, r) in blocks.remote_offsets.iter().enumerate() {
            assert_eq!(
                bytes_at(&p.local, b as u64 * PAGE, PAGE),
                bytes_at(&p.remote, *r, PAGE),
                "block {b}"
            );
        }
    });
}

#[test]
fn a_bad_block_refuses_the_whole_list_and_nothing_is_submitted() {
    within(Duration::from_secs(30), "bad blocks", || {
        let p = pair();
        let mut blocks = list(&p, Opcode::Write);
        // The last block runs one byte past the remote buffer.
        blocks.remote_offsets[7] = 64 * PAGE - PAGE + 1;
        let err = p
            .initiator
            .transfer_blocks(&blocks, |_| panic!("nothing may run"))
            .expect_err("out of range");
        assert_eq!(err.code(), "ERR_FERRY_OUT_OF_RANGE");
        assert!(err.to_string().contains("block 7"), "{err}");
        let batch = p.initiator.allocate_batch(16).expect("batch");
        let err = p
            .initiator
            .submit_blocks(batch, &blocks)
            .expect_err("out of range");
        assert_eq!(err.code(), "ERR_FERRY_OUT_OF_RANGE");
        assert_eq!(p.initiator.metrics().tasks_submitted, 0);
        assert_eq!(p.initiator.batch_status(batch).expect("batch").tasks, 0);
    });
}

/// Over shm a gather is copied span by span: inline up to 1 MiB, and cut into runs of
/// spans for the copy threads above it (here 509 pages, about 2 MiB).
#[test]
fn gathers_over_shm_land_every_span_inline_and_on_the_copy_threads() {
    within(Duration::from_secs(60), "shm gathers", || {
        let p = pair_with(
            vec![TransportKind::Shm, TransportKind::Tcp],
            Vec::new(),
            512 * PAGE,
        );
        for (n, seed) in [(200, 3), (509, 4)] {
            fill(&p.local, seed);
            let blocks = scattered(&p, Opcode::Write, n);
            let out = run(&p, &blocks);
            assert_eq!(out.requests, 1);
            assert_eq!(
                out.status,
                vec![TransferStatus::Completed.raw(); n as usize]
            );
            landed(&p, &blocks);
            fill(&p.local, seed + 10);
            let back = scattered(&p, Opcode::Read, n);
            assert_eq!(run(&p, &back).status, out.status);
            landed(&p, &back);
        }
        let by_shm: u64 = p
            .initiator
            .metrics()
            .bytes_by
            .iter()
            .filter(|b| b.transport == TransportKind::Shm)
            .map(|b| b.bytes)
            .sum();
        assert_eq!(by_shm, 2 * (200 + 509) * PAGE, "every gather went over shm");
    });
}

/// A gather whose shm attempt fails is retried whole over tcp, which sends its spans as
/// slices: every block lands, and its task reports tcp.
#[test]
fn a_failed_gather_fails_over_whole() {
    within(Duration::from_secs(60), "gather failover", || {
        let faults = vec![(
            TransportKind::Shm,
            FaultSpec {
                submit_failure_rate: 1.0,
                ..FaultSpec::default()
            },
        )];
        let p = pair_with(
            vec![TransportKind::Shm, TransportKind::Tcp],
            faults,
            64 * PAGE,
        );
        fill(&p.local, 9);
        let blocks = scattered(&p, Opcode::Write, 61);
        let batch = p.initiator.allocate_batch(4).expect("batch");
        let sub = p
            .initiator
            .submit_blocks(batch, &blocks)
            .expect("submitted");
        assert_eq!(sub.map.starts, vec![0, 61]);
        let snaps: Vec<TaskSnapshot> =
            ferry_testkit::wait_batch(&p.initiator, batch, Duration::from_secs(20));
        assert_eq!(snaps.len(), 1);
        assert_eq!(snaps[0].status, TransferStatus::Completed);
        assert_eq!(snaps[0].transport, Some(TransportKind::Tcp));
        assert_eq!(snaps[0].transferred, 61 * PAGE);
        assert_eq!(snaps[0].attempts, 2);
        landed(&p, &blocks);
    });
}
