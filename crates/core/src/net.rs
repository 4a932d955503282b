//! Small async helpers over the wire codec: connecting with a hello, reading and writing
//! whole control frames.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, Result};
use crate::wire::{ConnKind, Header, Op, HEADER_LEN};

/// Writes `head` then `body` with vectored writes: a header and its payload leave in one
/// system call (and one TCP segment train) instead of two.
pub(crate) async fn write_all_pair<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut head: &[u8],
    mut body: &[u8],
) -> std::io::Result<()> {
    while !head.is_empty() || !body.is_empty() {
        let n = if head.is_empty() {
            w.write(body).await?
        } else {
            let bufs = [std::io::IoSlice::new(head), std::io::IoSlice::new(body)];
            w.write_vectored(&bufs).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    Ok(())
}

/// Reads one header; `Ok(None)` on a clean EOF before any byte.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Header>> {
    let mut buf = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r
            .read(&mut buf[got..])
            .await
            .map_err(|e| Error::io("read", &e))?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(Error::Protocol(format!(
                "truncated frame: connection closed after {got} of {HEADER_LEN} header bytes"
            )));
        }
        got += n;
    }
    Header::decode(&buf)
        .map(Some)
        .map_err(|e| Error::Protocol(e.to_string()))
}

/// Reads a header and its (small) payload into memory.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(Header, Vec<u8>)>> {
    let Some(header) = read_header(r).await? else {
        return Ok(None);
    };
    let len = usize::try_from(header.payload_len())
        .map_err(|_| Error::Protocol("payload length overflows usize".into()))?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)
        .await
        .map_err(|e| Error::Protocol(format!("truncated payload: {e}")))?;
    Ok(Some((header, payload)))
}

/// Writes a header and payload.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &Header,
    payload: &[u8],
) -> Result<()> {
    w.write_all(&header.encode())
        .await
        .map_err(|e| Error::io("write", &e))?;
    if !payload.is_empty() {
        w.write_all(payload)
            .await
            .map_err(|e| Error::io("write", &e))?;
    }
    w.flush().await.map_err(|e| Error::io("flush", &e))
}

fn tune(stream: &TcpStream, _kind: ConnKind) {
    // Latency matters on every connection; socket buffers are left to the kernel's
    // autotuning, which measured as fast as fixed 4 MiB buffers on loopback.
    let _ = stream.set_nodelay(true);
}

/// Tunes an accepted connection once its kind is known.
pub(crate) fn tune_accepted(stream: &TcpStream, kind: ConnKind) {
    tune(stream, kind)
}

/// Connects, says hello, and returns the stream and the peer's engine id.
pub(crate) async fn connect(
    addr: &str,
    kind: ConnKind,
    local_engine_id: u64,
    timeout: Duration,
) -> Result<(TcpStream, u64)> {
    let fail = |reason: String| Error::Connect {
        peer: addr.to_string(),
        reason,
    };
    let attempt = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| fail(e.to_string()))?;
        tune(&stream, kind);
        let mut hello = Header::new(Op::Hello);
        hello.buffer_id = kind as u64;
        hello.request_id = local_engine_id;
        write_frame(&mut stream, &hello, &[]).await?;
        match read_header(&mut stream).await? {
            Some(h) if h.op == Op::HelloAck => Ok((stream, h.request_id)),
            Some(h) => Err(fail(format!("expected HelloAck, got {:?}", h.op))),
            None => Err(fail("closed during hello".into())),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| fail(format!("no answer within {} ms", timeout.as_millis())))?
}
