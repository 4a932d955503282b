//! End-to-end integrity (`verify`): a CRC32C over a request's bytes, taken at the source
//! and checked at the destination, and the error a mismatch fails the request with. The
//! CRC32C is the `crc-fast` crate's (CRC-32/ISCSI): carry-less multiplication folding
//! (VPCLMULQDQ with AVX-512 where the CPU has it, PCLMULQDQ with the SSE4.2 instruction
//! otherwise), chosen at run time; a table where neither exists. This module is the one
//! place that names the crate. Pure.

use crate::error::Error;

/// The CRC32C of `bytes`.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// Checks that `bytes` (`what`: where they are) have the CRC32C `expected`, the source's.
pub fn check(what: &str, expected: u32, bytes: &[u8]) -> Result<(), Error> {
    verdict(what, expected, checksum(bytes), bytes.len())
}

/// The CRC32C of bytes that arrive piece by piece, taken of each piece as it comes: while
/// the copy that brought it (from the socket) has left it in cache, rather than in a
/// second pass over the whole range once it is in.
pub struct Running {
    /// The CRC's register between pieces (before its final xor), as `crc_fast` keeps it;
    /// the digest itself, with its folding constants, is rebuilt around it per piece, so
    /// that this stays two words wherever it waits.
    state: u64,
    len: u64,
}

const ALGORITHM: crc_fast::CrcAlgorithm = crc_fast::CrcAlgorithm::Crc32Iscsi;

impl Running {
    /// A CRC32C of no bytes yet.
    pub fn new() -> Self {
        Self {
            state: crc_fast::Digest::new(ALGORITHM).get_state(),
            len: 0,
        }
    }

    /// Takes `piece`, the bytes that follow those taken so far.
    pub fn update(&mut self, piece: &[u8]) {
        let mut digest = crc_fast::Digest::new_with_init_state(ALGORITHM, self.state);
        digest.update(piece);
        self.state = digest.get_state();
        self.len += piece.len() as u64;
    }

    /// The CRC32C of the bytes taken so far.
    pub fn value(&self) -> u32 {
        // CRC-32/ISCSI is 32 bits wide: the upper half is zero.
        crc_fast::Digest::new_with_init_state(ALGORITHM, self.state).finalize() as u32
    }

    /// Checks that the bytes taken so far (`what`: where they are) have the CRC32C
    /// `expected`, the source's.
    pub fn check(&self, what: &str, expected: u32) -> Result<(), Error> {
        let len = usize::try_from(self.len).unwrap_or(usize::MAX);
        verdict(what, expected, self.value(), len)
    }
}

impl Default for Running {
    fn default() -> Self {
        Self::new()
    }
}

fn verdict(what: &str, expected: u32, got: u32, len: usize) -> Result<(), Error> {
    if got == expected {
        Ok(())
    } else {
        Err(mismatch(what, expected, got, len))
    }
}

/// The error of `len` bytes that arrived with CRC32C `got` where the source had `expected`.
pub fn mismatch(what: &str, expected: u32, got: u32, len: usize) -> Error {
    Error::Integrity(format!(
        "{what}: CRC32C {got:08x} of {len} bytes, the source's is {expected:08x}"
    ))
}

/// The error of a verified request whose peer did not check (or send) a checksum: a peer
/// too old for `verify`. Failing is the only answer that does not claim a check.
pub fn unchecked(what: &str) -> Error {
    Error::Integrity(format!("{what}: the peer did not check the bytes (verify)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32c() {
        // The standard check value of CRC-32C (Castagnoli).
        assert_eq!(checksum(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn a_flipped_byte_fails_with_the_integrity_code() {
        let mut bytes = vec![7u8; 4096];
        let sum = checksum(&bytes);
        assert!(check("x", sum, &bytes).is_ok());
        bytes[1000] ^= 0x20;
        let e = check("WRITE payload", sum, &bytes).expect_err("mismatch");
        assert_eq!(e.code(), "ERR_FERRY_INTEGRITY");
        assert!(e.to_string().contains("WRITE payload"), "{e}");
    }

    #[test]
    fn a_running_checksum_over_pieces_is_the_checksum_of_the_whole() {
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i * 131 + i / 7) as u8).collect();
        let whole = checksum(&bytes);
        // Pieces of every shape the socket hands out: empty, tiny, odd, large.
        for cuts in [
            &[0usize, 1, 2, 3][..],
            &[7, 4096, 65_536, 1],
            &[200_000],
            &[],
        ] {
            let mut running = Running::new();
            let mut at = 0;
            for &cut in cuts {
                let end = (at + cut).min(bytes.len());
                running.update(&bytes[at..end]);
                at = end;
            }
            running.update(&bytes[at..]);
            assert_eq!(running.value(), whole, "cuts {cuts:?}");
            assert!(running.check("x", whole).is_ok());
            let e = running
                .check("READ payload", whole ^ 1)
                .expect_err("mismatch");
            assert_eq!(e.code(), "ERR_FERRY_INTEGRITY");
            assert!(e.to_string().contains("200000 bytes"), "{e}");
        }
        assert_eq!(Running::new().value(), checksum(&[]));
    }
}
