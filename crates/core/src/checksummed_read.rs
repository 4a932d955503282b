//! Reading bytes from a stream and taking their CRC32C (`verify`) in one pass: each piece
//! is checksummed right after the read that brought it, while that copy has left it in
//! cache, rather than in a second pass over the whole range once it is in (which, for a
//! tcp slice of hundreds of KiB, reads it back from farther away). The target's staging of
//! a verified WRITE and the initiator's landing of a verified READ use it.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::integrity::Running;

/// The most read (and checksummed) at a time. At least the connections' read buffers
/// (64 KiB), so that a read into an empty buffer bypasses them instead of copying through;
/// small enough that a piece is still in cache when its checksum runs.
const PIECE: usize = 128 << 10;

/// Fills `into` from `r` and returns the CRC32C of its bytes. An end of stream before it
/// is full is `UnexpectedEof`, as `read_exact` has it.
pub(crate) async fn read_checksummed<R: AsyncRead + Unpin>(
    r: &mut R,
    into: &mut [u8],
) -> std::io::Result<Running> {
    let mut running = Running::new();
    let mut filled = 0;
    while filled < into.len() {
        let end = into.len().min(filled + PIECE);
        let n = r.read(&mut into[filled..end]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        running.update(&into[filled..filled + n]);
        filled += n;
    }
    Ok(running)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    /// Hands out `bytes` in pieces of the sizes `cuts` cycles through, as a socket would.
    struct Pieces {
        bytes: Vec<u8>,
        at: usize,
        cuts: Vec<usize>,
        turn: usize,
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            let cut = this.cuts[this.turn % this.cuts.len()];
            this.turn += 1;
            let n = cut.min(out.remaining()).min(this.bytes.len() - this.at);
            out.put_slice(&this.bytes[this.at..this.at + n]);
            this.at += n;
            Poll::Ready(Ok(()))
        }
    }

    fn pieces(len: usize, cuts: &[usize]) -> Pieces {
        Pieces {
            bytes: (0..len).map(|i| (i * 131 + i / 7) as u8).collect(),
            at: 0,
            cuts: cuts.to_vec(),
            turn: 0,
        }
    }

    #[tokio::test]
    async fn bytes_in_any_pieces_land_whole_with_the_checksum_of_the_whole() {
        let len = 3 * PIECE + 12_345;
        for cuts in [
            &[1usize, 7, 4096][..],
            &[PIECE + 1],
            &[usize::MAX],
            &[65_536, 3],
        ] {
            let mut r = pieces(len, cuts);
            let mut into = vec![0u8; len];
            let landed = read_checksummed(&mut r, &mut into).await.expect("read");
            assert_eq!(into, r.bytes, "cuts {cuts:?}");
            assert_eq!(landed.value(), crate::integrity::checksum(&r.bytes));
            assert!(
                r.turn >= len.div_ceil(PIECE),
                "at most a piece a read: {cuts:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_stream_that_ends_early_is_unexpected_eof() {
        let mut r = pieces(1000, &[300]);
        let mut into = vec![0u8; 1001];
        match read_checksummed(&mut r, &mut into).await {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            Ok(_) => panic!("the stream ended 1 byte short"),
        }
    }
}
