//! Request frames of a sealed pool connection on their way out: each frame (header and
//! payload) sealed as one record (`seal`), so the target verifies all of a WRITE's
//! payload before any of it reaches its memory. The writer task alone writes a sealed
//! connection (no inline writes by submitting threads): the records keep their order
//! behind one sealer's counter.
//!
//! A sealed pool slices requests finer than a plaintext one ([`slice_size`]): a record is
//! sealed whole before it leaves and opened whole before any of it is handed on, so each
//! end works on one record at a time while the other waits for it. Smaller records let
//! the sender seal the next frame while the receiver opens the one before, and give a
//! request's slices to more lanes (and so more I/O threads) at once.

use tokio::net::tcp::OwnedWriteHalf;

use super::outgoing::Frame;
use crate::error::Error;
use crate::seal::Sealer;
use crate::wire::{Header, Op, RejectCode, HEADER_LEN};

/// The target's word, on a sealed connection, that a frame from this end failed its
/// authentication there (an `Error` of request id 0 with the `Tampered` code): the error
/// the connection's requests fail with.
pub(super) fn tamper_notice(header: &[u8; HEADER_LEN]) -> Option<Error> {
    let h = Header::decode(header).ok()?;
    let notice = h.op == Op::Error
        && h.request_id == 0
        && RejectCode::from_raw(h.flags) == RejectCode::Tampered;
    notice.then(|| {
        Error::Tampered("the target found a frame from this engine tampered with on the way".into())
    })
}

/// The largest slice of a request on a sealed pool: small enough that sealing and opening
/// one record is short beside moving a MiB, large enough that a frame's header, its
/// record's prefix and tag and its acknowledgement stay a small share of its bytes.
pub(super) const SEALED_SLICE_MAX: u64 = 128 << 10;

/// The slice size of a pool's requests: the configured one, at most
/// [`SEALED_SLICE_MAX`] when the pool's connections are sealed.
pub(super) fn slice_size(configured: u64, sealed: bool) -> u64 {
    if sealed {
        configured.min(SEALED_SLICE_MAX)
    } else {
        configured
    }
}

/// Sealed bytes gathered before they are written: small frames (READ requests) leave
/// many in one write, and a large one starts on its way before the next is sealed.
const GATHER: usize = 128 << 10;

/// Seals `frames` (none of them partly written: nothing writes a sealed connection
/// inline) into `out` and writes all of it; marks each frame written once it is sealed.
pub(super) async fn write_sealed(
    half: &OwnedWriteHalf,
    sealer: &mut Sealer,
    frames: &mut [Frame],
    out: &mut Vec<u8>,
) -> Result<(), Error> {
    out.clear();
    for frame in frames.iter_mut() {
        sealer.seal_into(&[&frame.header, frame.payload.as_slice()], out)?;
        frame.written = frame.total();
        if out.len() >= GATHER {
            write_all(half, out).await?;
            out.clear();
        }
    }
    write_all(half, out).await
}

async fn write_all(half: &OwnedWriteHalf, mut bytes: &[u8]) -> Result<(), Error> {
    while !bytes.is_empty() {
        match half.try_write(bytes) {
            Ok(0) => return Err(Error::io("send", &std::io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                half.writable().await.map_err(|e| Error::io("send", &e))?;
            }
            Err(e) => return Err(Error::io("send", &e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_pool_slices_at_most_its_cap_and_a_plaintext_one_as_configured() {
        let default = crate::config::TcpConfig::default().slice_size;
        assert!(default > SEALED_SLICE_MAX, "the cap is below the default");
        assert_eq!(slice_size(default, true), SEALED_SLICE_MAX);
        assert_eq!(slice_size(default, false), default);
        // A configured size below the cap is kept, sealed or not.
        assert_eq!(slice_size(64 << 10, true), 64 << 10);
        assert_eq!(slice_size(64 << 10, false), 64 << 10);
    }

    #[test]
    fn a_sealed_mebibyte_is_several_frames_that_stripe_over_lanes() {
        let slices = (1u64 << 20).div_ceil(slice_size(crate::wire::MAX_DATA_PAYLOAD, true));
        assert_eq!(slices, 8);
        let s = super::super::stripe::stripe(slices as usize, 4, 1, 0);
        assert_eq!(s.ways, 4, "every lane of a four-lane group gets a share");
    }
}
