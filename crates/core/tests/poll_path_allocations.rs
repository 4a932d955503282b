//! The poll path allocates nothing per operation but the task itself: a thread that
//! allocates a batch, submits one same-host request, polls it to its end and frees the
//! batch, over and over (tebench's loop), makes one heap allocation per operation once
//! warm. Counted by a global allocator that counts the allocations of the thread under
//! test only (the engines' own threads allocate as they please).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use ferry_core::{
    Engine, EngineConfig, Opcode, Request, TransferStatus, TransportHint, TransportKind,
};
use ferry_testkit::{within, Pair};

struct CountingAllocator;

thread_local! {
    /// Allocations (and reallocations) made by this thread while counting is on.
    static COUNTED: Cell<Option<u64>> = const { Cell::new(None) };
}

fn count_one() {
    // `try_with`: during thread teardown the slot may be gone; nothing is counted then.
    let _ = COUNTED.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counting touches
// a const-initialized thread-local cell only (no allocation, no reentrancy).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns how many allocations this thread made during it.
fn allocations_of(f: impl FnOnce()) -> u64 {
    COUNTED.with(|c| c.set(Some(0)));
    f();
    COUNTED.with(|c| c.take()).unwrap_or(0)
}

const BLOCK: u64 = 4096;

fn one_op(p: &Pair, request: &Request) {
    let e = &p.initiator;
    let batch = e.allocate_batch(1).expect("batch");
    e.submit_transfer(batch, std::slice::from_ref(request))
        .expect("submit");
    // Bounded: a 4 KiB same-host copy is done within microseconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = e.batch_status(batch).expect("status");
        if snap.status.is_terminal() {
            assert_eq!(snap.status, TransferStatus::Completed);
            break;
        }
        assert!(Instant::now() < deadline, "op not done in 10 s");
        std::thread::yield_now();
    }
    e.free_batch(batch).expect("free");
}

#[test]
fn a_polled_same_host_op_allocates_only_its_task_once_warm() {
    within(Duration::from_secs(60), "poll-path allocations", || {
        let config = || EngineConfig {
            transports: vec![TransportKind::Shm, TransportKind::Tcp],
            ..EngineConfig::default()
        };
        let target = Engine::new(config()).expect("target");
        let initiator = Engine::new(config()).expect("initiator");
        let p = Pair::new(target, initiator, 64 * BLOCK);
        let request = Request {
            opcode: Opcode::Write,
            local: p.local.id(),
            local_offset: 0,
            segment: p.seg,
            remote_buffer: p.remote.id(),
            remote_offset: 8 * BLOCK,
            length: BLOCK,
            hint: TransportHint::Require(TransportKind::Shm),
        };
        // Warm: the shm mapping of the peer, this thread's lane loans, a spare batch.
        for _ in 0..100 {
            one_op(&p, &request);
        }
        const OPS: u64 = 1000;
        let made = allocations_of(|| {
            for _ in 0..OPS {
                one_op(&p, &request);
            }
        });
        assert!(
            made <= OPS,
            "{made} allocations over {OPS} ops: more than the task per op"
        );
    });
}
