//! Request frames of a sealed pool connection on their way out: each frame (header and
//! payload) sealed as one record (`seal`), so the target verifies all of a WRITE's
//! payload before any of it reaches its memory. Whoever writes the connection (its writer
//! task, or a submitting thread writing small frames inline while it is idle) seals into
//! the connection's [`SealedOut`] under its lock (`outgoing::seal_frames`), and sealed
//! bytes reach the socket only from the front of its pending bytes: records leave in the
//! order of their nonces, whichever thread sealed them.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::tcp::OwnedWriteHalf;

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

/// Sealed bytes gathered before they are written: small frames (READ requests) leave
/// many in one write, and a large one starts on its way before the next is sealed.
const GATHER: usize = 128 << 10;

/// The sealing end of a pool connection: its sealer and the sealed bytes the socket has
/// not taken yet.
pub(super) struct SealedOut {
    sealer: Sealer,
    pending: Vec<u8>,
    sent: usize,
}

/// A connection's sealing end, shared by its writer task and inline writers.
pub(super) type SharedSealedOut = Arc<Mutex<SealedOut>>;

impl SealedOut {
    pub(super) fn shared(sealer: Sealer) -> SharedSealedOut {
        Arc::new(Mutex::new(Self {
            sealer,
            pending: Vec::new(),
            sent: 0,
        }))
    }

    /// Seals one frame (its header and payload) into one record behind what is pending,
    /// and starts the pending bytes on their way once [`GATHER`] of them wait (what the
    /// socket takes now: it never waits).
    pub(super) fn seal_frame(
        &mut self,
        half: &OwnedWriteHalf,
        header: &[u8],
        payload: &[u8],
    ) -> Result<(), Error> {
        self.sealer
            .seal_into(&[header, payload], &mut self.pending)?;
        if self.pending.len() - self.sent >= GATHER {
            self.send_now(half)?;
        }
        Ok(())
    }

    /// Writes what the socket takes now from the front of the pending bytes; whether
    /// all of them went.
    pub(super) fn send_now(&mut self, half: &OwnedWriteHalf) -> Result<bool, Error> {
        while self.sent < self.pending.len() {
            match half.try_write(&self.pending[self.sent..]) {
                Ok(0) => return Err(Error::io("send", &std::io::ErrorKind::WriteZero.into())),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(Error::io("send", &e)),
            }
        }
        self.pending.clear();
        self.sent = 0;
        Ok(true)
    }
}

/// The sealing end, for whoever writes the connection now.
pub(super) fn lock(out: &SharedSealedOut) -> MutexGuard<'_, SealedOut> {
    out.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends every pending sealed byte, waiting for the socket as it must.
pub(super) async fn drain(out: &SharedSealedOut, half: &OwnedWriteHalf) -> Result<(), Error> {
    loop {
        let all = lock(out).send_now(half)?;
        if all {
            return Ok(());
        }
        half.writable().await.map_err(|e| Error::io("send", &e))?;
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::super::outgoing::{seal_frames, seal_inline, Frame};
    use super::*;
    use crate::auth::Secret;
    use crate::memory::{Region, RegionTable, Window};
    use crate::seal::{SealKeys, Side};
    use crate::sealed_stream::SealedRead;

    /// Frames `range` of `region`, `len` bytes each: frame `i`'s header has offset `i`.
    fn frames(region: &Arc<Region>, range: std::ops::Range<u64>, len: u64) -> Vec<Frame> {
        range
            .map(|i| {
                let mut h = Header::new(Op::WriteReq);
                h.offset = i;
                h.length = len;
                Frame {
                    header: h.encode().into(),
                    payload: Window::new(region, i * len, len).expect("window"),
                    written: 0,
                }
            })
            .collect()
    }

    #[test]
    fn records_sealed_inline_and_by_the_writer_leave_in_nonce_order() {
        const LEN: u64 = 64 << 10;
        const COUNT: u64 = 64;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let extracted = Secret::new(vec![9u8; 32])
                .expect("secret")
                .extract_key(b"t");
            let client = SealKeys::derive(&extracted, Side::Client).expect("keys");
            let server = SealKeys::derive(&extracted, Side::Server).expect("keys");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            // A fixed, small send buffer (no autotuning): the socket takes a fraction of
            // what the first writer seals while nobody reads.
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.set_send_buffer_size(64 << 10).expect("send buffer");
            let sender = socket.connect(addr).await.expect("connect");
            let (receiver, _) = listener.accept().await.expect("accept");
            let (_sender_rd, half) = sender.into_split();
            let table = RegionTable::default();
            let region = table.allocate(COUNT * LEN).expect("region");
            let mut all = Window::new(&region, 0, COUNT * LEN).expect("window");
            for (i, b) in all.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let out = SealedOut::shared(client.sealer);
            // An inline writer seals its frames; nobody reads yet, so the socket takes only
            // part and the rest stays pending.
            let mut first = frames(&region, 0..COUNT / 2, LEN);
            assert!(
                !seal_inline(&out, &half, &mut first),
                "the socket took it all"
            );
            assert!(first.iter().all(|f| f.written == f.total()), "all sealed");
            // The writer task seals more behind it, then sends everything.
            let mut second = frames(&region, COUNT / 2..COUNT, LEN);
            seal_frames(&out, &half, &mut second).expect("seal");
            let read = async {
                let mut r = SealedRead::new(receiver, Some(server.opener));
                let mut got = vec![0u8; (COUNT * (HEADER_LEN as u64 + LEN)) as usize];
                r.read_exact(&mut got).await.expect("read");
                got
            };
            let (drained, got) = tokio::join!(drain(&out, &half), read);
            drained.expect("drain");
            for (i, frame) in got.chunks(HEADER_LEN + LEN as usize).enumerate() {
                let head: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().expect("header");
                assert_eq!(Header::decode(&head).expect("header").offset, i as u64);
                let at = i * LEN as usize;
                assert_eq!(&frame[HEADER_LEN..], &all.as_slice()[at..at + LEN as usize]);
            }
        });
    }
}
