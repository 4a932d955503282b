//! Bytes in and out of a region, for tests that check what a transfer moved.

use ferry_core::Region;

/// Fills a region with a pattern derived from `seed` (0 = zeros); different seeds give
/// different patterns. Call it only while no transfer touches the region.
pub fn fill(region: &Region, seed: u64) {
    let p = region
        .range_ptr(0, region.len() as u64)
        .expect("whole region");
    // SAFETY: `range_ptr` checked the range against the live region; the caller keeps
    // transfers off it meanwhile, so nothing else writes it.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p, region.len()) };
    if seed == 0 {
        bytes.fill(0);
        return;
    }
    // xorshift64 from an odd state distinct for each seed: no short period, so a block
    // that lands at the wrong offset shows.
    let mut x = seed.wrapping_mul(2) | 1;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// A copy of a region's bytes. Call it only while no transfer writes the region.
pub fn bytes_of(region: &Region) -> Vec<u8> {
    bytes_at(region, 0, region.len() as u64)
}

/// A copy of `len` bytes of a region from `offset`. Call it only while no transfer writes
/// that range.
pub fn bytes_at(region: &Region, offset: u64, len: u64) -> Vec<u8> {
    let p = region
        .range_ptr(offset, len)
        .expect("range inside the region");
    // SAFETY: `range_ptr` checked the range against the live region (so `len` fits in
    // usize); the caller keeps transfers into it off meanwhile.
    unsafe { std::slice::from_raw_parts(p, len as usize) }.to_vec()
}

/// Registers `len` bytes of user memory holding `byte` with `access` on `engine`; the
/// memory is leaked, so it outlives every use the test makes of it.
pub fn user_region(
    engine: &ferry_core::Engine,
    byte: u8,
    len: usize,
    access: ferry_core::Access,
) -> std::sync::Arc<Region> {
    let memory: &'static mut [u8] = Box::leak(vec![byte; len].into_boxed_slice());
    // SAFETY: the leaked slice lives, and stays where it is, for the rest of the process.
    unsafe { engine.register_memory(memory.as_mut_ptr(), len, access, Box::new(())) }
        .expect("register user memory")
}
