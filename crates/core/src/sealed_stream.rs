//! Streams of sealed records (`seal`): a reader that hands out only plaintext of records
//! whose tag verified, and a writer that seals what it is given, one record per write.
//! With no keys both pass bytes through untouched, so one connection type serves sealed
//! and plaintext connections.
//!
//! A record is opened whole before any of its bytes are handed out: a frame sealed as one
//! record (the writers seal a frame's header and payload in one write) cannot put a byte
//! into registered memory unless all of it is authentic. That costs a staging buffer per
//! connection (the largest record it met) and one copy out of it.
//!
//! `SealedConn` is a tcp connection past its handshake as control, notification and
//! descriptor clients and servers use it: split, sealed with the keys its own handshake
//! derived, or plaintext. The end that finds a record tampered with tells the other
//! (`tamper_notice`, sealed in the intact direction) before it drops the connection.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::error::{Error, TamperedIo};
use crate::seal::{record_len, Opener, SealKeys, Sealer, LEN_PREFIX, MAX_RECORD, TAG_LEN};
use crate::wire::{Header, Op, RejectCode};

/// The reading half of a [`SealedConn`].
pub(crate) type ConnRead = SealedRead<OwnedReadHalf>;
/// The writing half of a [`SealedConn`].
pub(crate) type ConnWrite = SealedWrite<OwnedWriteHalf>;

/// A tcp connection past its handshake, split into its halves: sealed with `keys` (the
/// connection's own, from its handshake's transcript), or plaintext without.
pub(crate) struct SealedConn {
    pub(crate) r: ConnRead,
    pub(crate) w: ConnWrite,
}

impl SealedConn {
    pub(crate) fn new(stream: TcpStream, keys: Option<SealKeys>) -> Self {
        let (rd, wr) = stream.into_split();
        let (sealer, opener) = keys.map(SealKeys::split).unzip();
        Self {
            r: SealedRead::new(rd, opener),
            w: SealedWrite::new(wr, sealer),
        }
    }
}

/// The frame an end sends, sealed, when a record from the other end failed its
/// authentication, just before it drops the connection: an `Error` of request id 0 with
/// the `Tampered` code, so the other end fails with `ERR_FERRY_TAMPERED`, not as if the
/// peer had vanished.
pub(crate) fn tamper_notice() -> Header {
    let mut notice = Header::new(Op::Error);
    notice.flags = RejectCode::Tampered as u16;
    notice
}

/// Tells the other end, on `w` (the intact direction), that a record from it failed its
/// authentication here, within `deadline`; the error the connection (a `what` one) ends
/// with.
pub(crate) async fn tell_tampered<W: AsyncWrite + Unpin>(
    w: &mut W,
    deadline: std::time::Duration,
    what: &str,
) -> Error {
    use tokio::io::AsyncWriteExt;
    let told = async {
        w.write_all(&tamper_notice().encode()).await?;
        w.flush().await
    };
    let _ = tokio::time::timeout(deadline, told).await;
    tracing::warn!("dropping a sealed {what} connection: a frame failed its authentication");
    Error::Tampered(format!(
        "a frame on a {what} connection failed its authentication"
    ))
}

/// The error a [`tamper_notice`] read on a sealed connection stands for; `None` for any
/// other frame (a plaintext connection has no notices: its peer cannot tell).
pub(crate) fn tampered_by_notice(h: &Header, sealed: bool) -> Option<Error> {
    let notice = sealed
        && h.op == Op::Error
        && h.request_id == 0
        && RejectCode::from_raw(h.flags) == RejectCode::Tampered;
    notice.then(|| {
        Error::Tampered("the peer found a frame from this engine tampered with on the way".into())
    })
}

fn io_error(e: Error) -> io::Error {
    match e {
        Error::Tampered(why) => io::Error::new(io::ErrorKind::InvalidData, TamperedIo(why)),
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// Reads records from `inner` and hands out their plaintext once each verified.
pub(crate) struct SealedRead<R> {
    inner: R,
    opener: Option<Opener>,
    prefix: [u8; LEN_PREFIX],
    prefix_got: usize,
    /// The record being read (ciphertext and tag), then its plaintext being handed out.
    record: Vec<u8>,
    /// Bytes of `record` read so far (while reading), or handed out (while serving).
    at: usize,
    /// Plaintext bytes in `record` (while serving); `None` while a record is being read.
    plain: Option<usize>,
    tampered: bool,
}

impl<R> SealedRead<R> {
    /// Reads sealed records with `opener`, or plaintext when `None`.
    pub(crate) fn new(inner: R, opener: Option<Opener>) -> Self {
        Self {
            inner,
            opener,
            prefix: [0; LEN_PREFIX],
            prefix_got: 0,
            record: Vec::new(),
            at: 0,
            plain: Some(0),
            tampered: false,
        }
    }

    /// Whether the stream is sealed.
    pub(crate) fn is_sealed(&self) -> bool {
        self.opener.is_some()
    }

    /// Whether a record failed to open: the stream is tampered with, and ends.
    pub(crate) fn tampered(&self) -> bool {
        self.tampered
    }

    /// Plaintext already opened and not yet handed out.
    pub(crate) fn opened_len(&self) -> usize {
        self.plain.map_or(0, |end| end - self.at)
    }
}

impl<T: AsyncRead> SealedRead<tokio::io::BufReader<T>> {
    /// Whether a whole record of at least `min_plain` plaintext bytes waits in the buffer
    /// under this reader, received and not yet opened, as the next one to open (nothing
    /// of a record is read partly): what the reader hands out next needs no network.
    pub(crate) fn whole_record_buffered(&self, min_plain: usize) -> bool {
        let at_a_record = self.prefix_got == 0 && self.plain.is_some();
        self.opener.is_some() && at_a_record && whole_record(self.inner.buffer(), min_plain)
    }
}

/// Whether `buf` starts with a whole record of at least `min_plain` plaintext bytes.
fn whole_record(buf: &[u8], min_plain: usize) -> bool {
    let Some(prefix) = buf.first_chunk::<LEN_PREFIX>() else {
        return false;
    };
    record_len(*prefix).is_ok_and(|len| len >= min_plain && buf.len() >= LEN_PREFIX + len + TAG_LEN)
}

impl<R: AsyncRead + Unpin> SealedRead<R> {
    /// Reads the next record whole and opens it; `Ok(false)` on a clean end of stream
    /// before its first byte.
    fn poll_next_record(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let Some(opener) = self.opener.as_mut() else {
            return Poll::Ready(Ok(false));
        };
        while self.prefix_got < LEN_PREFIX {
            let mut buf = ReadBuf::new(&mut self.prefix[self.prefix_got..]);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut buf))?;
            let n = buf.filled().len();
            if n == 0 {
                if self.prefix_got == 0 {
                    return Poll::Ready(Ok(false));
                }
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            self.prefix_got += n;
        }
        if self.plain.is_some() {
            let len = record_len(self.prefix).map_err(|e| {
                self.tampered = true;
                io_error(e)
            })?;
            // Resized, not cleared: only growth is zeroed, not every record's bytes again
            // (the whole record is read over them before it is opened).
            let want = len + TAG_LEN;
            if want > self.record.len() {
                self.record
                    .try_reserve(want - self.record.len())
                    .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
            }
            self.record.resize(want, 0);
            self.at = 0;
            self.plain = None;
        }
        while self.at < self.record.len() {
            let mut buf = ReadBuf::new(&mut self.record[self.at..]);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut buf))?;
            let n = buf.filled().len();
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            self.at += n;
        }
        let len = match opener.open_in_place(self.prefix, &mut self.record) {
            Ok(plain) => plain.len(),
            Err(e) => {
                self.tampered = true;
                return Poll::Ready(Err(io_error(e)));
            }
        };
        self.prefix_got = 0;
        self.at = 0;
        self.plain = Some(len);
        Poll::Ready(Ok(true))
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for SealedRead<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.opener.is_none() {
            return Pin::new(&mut this.inner).poll_read(cx, out);
        }
        loop {
            if let Some(end) = this.plain {
                if this.at < end {
                    let n = (end - this.at).min(out.remaining());
                    out.put_slice(&this.record[this.at..this.at + n]);
                    this.at += n;
                    return Poll::Ready(Ok(()));
                }
            }
            if !ready!(this.poll_next_record(cx))? {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Seals each write into one record and writes it to `inner`.
pub(crate) struct SealedWrite<W> {
    inner: W,
    sealer: Option<Sealer>,
    /// Sealed bytes not yet taken by `inner`.
    pending: Vec<u8>,
    sent: usize,
}

impl<W> SealedWrite<W> {
    /// Seals with `sealer`, or writes plaintext when `None`.
    pub(crate) fn new(inner: W, sealer: Option<Sealer>) -> Self {
        Self {
            inner,
            sealer,
            pending: Vec::new(),
            sent: 0,
        }
    }
}

impl<W: AsyncWrite + Unpin> SealedWrite<W> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Seals `bufs` (as many whole ones as fit in a record, and at least a part of the
    /// first) into one record; the bytes taken.
    fn poll_seal(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        ready!(self.poll_drain(cx))?;
        let Some(sealer) = self.sealer.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        let mut parts: smallvec::SmallVec<[&[u8]; 4]> = smallvec::SmallVec::new();
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let room = MAX_RECORD - total;
            if room == 0 {
                break;
            }
            let take = b.len().min(room);
            parts.push(&b[..take]);
            total += take;
        }
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        sealer
            .seal_into(&parts, &mut self.pending)
            .map_err(io_error)?;
        // Start it on its way; what the socket does not take now goes on the next write
        // or flush.
        if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(total))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SealedWrite<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.sealer.is_none() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        this.poll_seal(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.sealer.is_none() {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        this.poll_seal(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.sealer.is_some() || self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::seal::SealKeys;

    fn keys() -> (SealKeys, SealKeys) {
        crate::seal::tests::pair(b"t")
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn sealed_writes_read_back_whole_across_small_socket_reads() {
        rt().block_on(async {
            let (c, s) = keys();
            let (a, b) = tokio::io::duplex(1000);
            let mut w = SealedWrite::new(a, Some(c.sealer));
            let mut r = SealedRead::new(b, Some(s.opener));
            let big: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
            let writer = async {
                w.write_all(b"head").await.expect("write");
                w.write_all(&big).await.expect("write");
                w.flush().await.expect("flush");
                w.shutdown().await.expect("shutdown");
            };
            let reader = async {
                let mut got = Vec::new();
                r.read_to_end(&mut got).await.expect("read");
                got
            };
            let ((), got) = tokio::join!(writer, reader);
            assert_eq!(&got[..4], b"head");
            assert_eq!(&got[4..], &big[..]);
        });
    }

    #[test]
    fn a_flipped_byte_hands_out_nothing_of_its_record_and_is_tampered() {
        rt().block_on(async {
            let (mut c, s) = keys();
            let mut rec = Vec::new();
            c.sealer.seal_into(&[&[7u8; 4096]], &mut rec).expect("seal");
            rec[2000] ^= 0x80;
            let mut r = SealedRead::new(&rec[..], Some(s.opener));
            let mut dst = vec![0u8; 4096];
            let err = r.read_exact(&mut dst).await.expect_err("tampered");
            assert!(TamperedIo::within(&err).is_some(), "{err}");
            assert_eq!(Error::io("read", &err).code(), "ERR_FERRY_TAMPERED");
            assert!(dst.iter().all(|b| *b == 0), "no byte handed out");
        });
    }

    #[test]
    fn without_keys_bytes_pass_through() {
        rt().block_on(async {
            let (a, b) = tokio::io::duplex(64);
            let mut w = SealedWrite::new(a, None);
            let mut r = SealedRead::new(b, None);
            w.write_all(b"plain").await.expect("write");
            let mut got = [0u8; 5];
            r.read_exact(&mut got).await.expect("read");
            assert_eq!(&got, b"plain");
        });
    }
}
