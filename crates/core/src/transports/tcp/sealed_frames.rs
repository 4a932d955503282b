//! Request frames of a sealed pool connection on their way out: each frame (header and
//! payload) sealed as one record (`seal`), so the target verifies all of a WRITE's
//! payload before any of it reaches its memory. The writer task alone writes a sealed
//! connection (no inline writes by submitting threads): the records keep their order
//! behind one sealer's counter.

use tokio::net::tcp::OwnedWriteHalf;

use super::outgoing::Frame;
use crate::error::Error;
use crate::seal::Sealer;
use crate::sealed_stream::tampered_by_notice;
use crate::wire::{Header, HEADER_LEN};

/// The target's word, on a sealed connection, that a frame from this end failed its
/// authentication there (`sealed_stream::tamper_notice`): the error the connection's
/// requests fail with.
pub(super) fn tamper_notice(header: &[u8; HEADER_LEN]) -> Option<Error> {
    let h = Header::decode(header).ok()?;
    tampered_by_notice(&h, true)
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
