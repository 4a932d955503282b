//! Block lists through two engines over tcp: merged into requests, bytes where each block
//! says, outcomes per block, the batch form, and bad lists refused before anything moves.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_core::blocks::{Blocks, PerBlock};
use ferry_core::{Engine, EngineConfig, Opcode, TransferStatus, TransportHint, TransportKind};
use ferry_testkit::{bytes_at, fill, within, Pair};

const PAGE: u64 = 4096;

fn pair() -> Pair {
    let cfg = EngineConfig {
        transports: vec![TransportKind::Tcp],
        ..EngineConfig::default()
    };
    let target = Engine::new(cfg.clone()).expect("target");
    let initiator = Engine::new(cfg).expect("initiator");
    Pair::new(target, initiator, 64 * PAGE)
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
    }
}

#[test]
fn a_block_list_is_merged_moved_and_reported_per_block() {
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
        assert_eq!(requests, 4, "9-11, 3, 20-21, 5-6");
        let outcome = rx.recv_timeout(Duration::from_secs(20)).expect("outcome");
        assert_eq!(outcome.requests, 4);
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
        assert_eq!(sub.map.starts, vec![0, 3, 4, 6, 8]);
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
        assert_eq!(n, 4);
        assert_eq!(tasks, [4, 4, 4, 4, 0xff, 0xff]);
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
