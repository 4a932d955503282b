//! End-to-end integrity (`verify`): a CRC32C over a request's bytes, taken at the source
//! and checked at the destination, and the error a mismatch fails the request with. The
//! CRC32C is the `crc32c` crate's: the SSE4.2 instruction where the CPU has it. Pure.

use crate::error::Error;

/// The CRC32C of `bytes`.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Checks that `bytes` (`what`: where they are) have the CRC32C `expected`, the source's.
pub fn check(what: &str, expected: u32, bytes: &[u8]) -> Result<(), Error> {
    let got = checksum(bytes);
    if got == expected {
        Ok(())
    } else {
        Err(mismatch(what, expected, got, bytes.len()))
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
}
