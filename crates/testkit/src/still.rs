//! Watching a target's buffer after a transfer settled: nothing may land any more (fenced
//! cancel). The reads are volatile, word by word: the point is that nothing writes the
//! buffer meanwhile, and they must not assume it.

use std::time::{Duration, Instant};

use ferry_core::Region;

/// A cheap whole-buffer hash (FNV-1a over 64-bit words).
pub fn hash_region(region: &Region) -> u64 {
    let len = region.len();
    let p = region.range_ptr(0, len as u64).expect("whole region") as *const u64;
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..len / 8 {
        // SAFETY: `range_ptr` checked the range against the live region, which the caller
        // holds; a region is page-aligned, so every u64 word is aligned. A transport may
        // still write it (what the caller looks for): volatile loads read whatever is there.
        let w = unsafe { std::ptr::read_volatile(p.add(i)) };
        h = (h ^ w).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Waits (bounded) until some bytes landed in the region's first MiB (it starts zeroed):
/// a transfer into it is then mid-flight, whatever the machine's speed.
pub fn wait_first_bytes(region: &Region) {
    let words = (region.len().min(1 << 20) / 8) as u64;
    let p = region.range_ptr(0, words * 8).expect("first MiB") as *const u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // SAFETY: as in `hash_region`: a checked, aligned range of a live region, read
        // volatile.
        let landed = (0..words as usize).any(|i| unsafe { std::ptr::read_volatile(p.add(i)) } != 0);
        if landed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no byte of the transfer ever landed"
        );
        std::thread::yield_now();
    }
}

/// Hashes the region at 0, ~100, ~250 and ~500 ms from now (the observation window after
/// a transfer settled); panics, naming `what`, if any hash differs from the first.
pub fn assert_still(region: &Region, what: &str) {
    let start = Instant::now();
    let first = hash_region(region);
    for at in [100u64, 250, 500] {
        let due = start + Duration::from_millis(at);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        assert_eq!(
            hash_region(region),
            first,
            "{what}: the target's buffer changed {at} ms after the transfer settled"
        );
    }
}
