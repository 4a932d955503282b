//! Request frames on their way out of a pool connection (`pool_conn`): a frame being
//! written, the `writev` that sends many at once, and the connection's write queue, which
//! either its writer task or one submitting thread writing inline owns at a time.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;

use smallvec::SmallVec;
use tokio::net::tcp::OwnedWriteHalf;

use super::request::Slice;
use crate::memory::Window;
use crate::wire::FrameHead;

/// Slices handed to one `writev` at most (two per frame; Linux takes 1024).
pub(super) const BATCH_IOVECS: usize = 1024;

/// A request frame being written: its header and the payload it points into.
pub(super) struct Frame {
    pub(super) header: FrameHead,
    /// The payload (empty for a READ request), its memory kept mapped by the window.
    pub(super) payload: Window,
    pub(super) written: usize,
}

impl Frame {
    pub(super) fn total(&self) -> usize {
        self.header.len() + self.payload.len()
    }

    /// The unwritten rest, as at most two slices.
    fn rest(&self) -> [IoSlice<'_>; 2] {
        let payload = self.payload.as_slice();
        let head = self.header.len();
        if self.written < head {
            [
                IoSlice::new(&self.header[self.written..]),
                IoSlice::new(payload),
            ]
        } else {
            [
                IoSlice::new(&payload[self.written - head..]),
                IoSlice::new(&[]),
            ]
        }
    }
}

/// Writes as much of `frames` as the socket takes now, in order, one `writev` per round
/// (at most [`BATCH_IOVECS`] slices), advancing each frame's `written`. Ok once every
/// frame is complete; `WouldBlock` (or the error met) otherwise, with whatever was
/// written kept in the frames ([`complete_prefix`] counts the finished ones).
pub(super) fn write_frames(half: &OwnedWriteHalf, frames: &mut [Frame]) -> std::io::Result<()> {
    let mut done = complete_prefix(frames);
    while done < frames.len() {
        let bufs: SmallVec<[IoSlice<'_>; 2]> = frames[done..]
            .iter()
            .take(BATCH_IOVECS / 2)
            .flat_map(|f| f.rest())
            .collect();
        let mut n = half.try_write_vectored(&bufs)?;
        drop(bufs);
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        for frame in &mut frames[done..] {
            let step = n.min(frame.total() - frame.written);
            frame.written += step;
            n -= step;
            if n == 0 {
                break;
            }
        }
        done = complete_prefix(frames);
    }
    Ok(())
}

/// How many frames from the front are completely written.
pub(super) fn complete_prefix(frames: &[Frame]) -> usize {
    frames.iter().take_while(|f| f.written == f.total()).count()
}

pub(super) enum Queued {
    /// Not yet registered or written.
    Fresh(Slice),
    /// Registered and partly written: it must finish before anything else is written.
    Partial(Frame),
}

#[derive(Default)]
pub(super) struct WriteState {
    pub(super) queue: VecDeque<Queued>,
    /// The writer task is writing a frame it took from the queue.
    pub(super) writer_busy: bool,
    /// A submitting thread is writing its frames itself (`PoolConn::send`), outside this
    /// lock: everything else waits in the queue, and the writer task takes nothing.
    pub(super) inline_busy: bool,
    /// The connected socket's write half; `None` while disconnected.
    pub(super) half: Option<Arc<OwnedWriteHalf>>,
    /// The connection is sealed: only the writer task writes it (`sealed_frames`).
    pub(super) sealed: bool,
}

impl WriteState {
    /// The next queued item for the writer task; none while a submitting thread writes
    /// inline (it owns the socket until it hands back).
    pub(super) fn take_for_writer(&mut self) -> Option<Queued> {
        if self.inline_busy {
            None
        } else {
            self.queue.pop_front()
        }
    }

    /// Ends a submitting thread's inline write on `half`: `partial` (frames it registered
    /// but the socket did not take whole) and then `unregistered` go to the writer task,
    /// in order, ahead of what others queued meanwhile. Partly written frames belong to the
    /// connection they started on: if it broke meanwhile (`half` is no longer the current
    /// one), their slices were registered there and are failed with it (`fail_all`), and
    /// their rest must not reach the next connection, so they are dropped.
    pub(super) fn hand_back(
        &mut self,
        half: &Arc<OwnedWriteHalf>,
        partial: impl Iterator<Item = Frame>,
        unregistered: impl IntoIterator<Item = Queued>,
    ) {
        self.inline_busy = false;
        let same = self.half.as_ref().is_some_and(|h| Arc::ptr_eq(h, half));
        let partial = partial.filter(|_| same).map(Queued::Partial);
        let rest: SmallVec<[Queued; 1]> = partial.chain(unregistered).collect();
        for q in rest.into_iter().rev() {
            self.queue.push_front(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Opcode;
    use crate::lanes::Lent;
    use crate::memory::{Region, RegionTable};
    use crate::wire::{Header, Op, HEADER_LEN};
    use tokio::io::AsyncReadExt;

    /// Frames of `region`: frame `i` has a header whose offset field is `i` and the
    /// `len`-byte payload at `i * len`.
    fn frames(region: &Arc<Region>, count: u64, len: u64) -> Vec<Frame> {
        (0..count)
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

    /// Runs `f` on a current-thread runtime with I/O and time.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// `n` connected sockets' write halves, and their other ends (kept open by the caller).
    async fn write_halves(n: usize) -> (Vec<Arc<OwnedWriteHalf>>, Vec<tokio::net::TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (mut halves, mut ends) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            ends.push(listener.accept().await.expect("accept").0);
            halves.push(Arc::new(client.into_split().1));
        }
        (halves, ends)
    }

    /// The header offsets of the queued frames (fresh slices read as `u64::MAX`).
    fn queued(st: &WriteState) -> Vec<u64> {
        st.queue
            .iter()
            .map(|q| match q {
                Queued::Partial(f) => Header::decode(&f.header).expect("header").offset,
                Queued::Fresh(_) => u64::MAX,
            })
            .collect()
    }

    #[test]
    fn an_inline_write_owns_the_socket_then_hands_its_rest_back_first() {
        block_on(async {
            let (halves, _ends) = write_halves(1).await;
            let table = RegionTable::default();
            let region = table.allocate(16 * 4096).expect("region");
            let mut ours = frames(&region, 2, 4096).into_iter();
            let theirs = frames(&region, 10, 4096).pop().expect("frame 9");
            let mut st = WriteState {
                half: Some(halves[0].clone()),
                inline_busy: true,
                ..WriteState::default()
            };
            // Another submitter queued behind the inline write: the writer takes nothing.
            st.queue.push_back(Queued::Partial(theirs));
            assert!(st.take_for_writer().is_none());
            // Frame 0 went out whole; frame 1 was cut short.
            ours.next();
            st.hand_back(&halves[0], ours, std::iter::empty());
            assert!(!st.inline_busy);
            assert_eq!(queued(&st), vec![1, 9], "the inline write's rest first");
            assert!(matches!(st.take_for_writer(), Some(Queued::Partial(_))));
        });
    }

    #[test]
    fn the_rest_of_an_inline_write_never_reaches_another_connection() {
        block_on(async {
            let (halves, _ends) = write_halves(2).await;
            let table = RegionTable::default();
            let region = table.allocate(16 * 4096).expect("region");
            let fresh = || {
                let task = crate::task::tests::waiting_task().0;
                Queued::Fresh(Slice {
                    landing: crate::fence::Landing::new(&task),
                    task,
                    attempt: 1,
                    opcode: Opcode::Write,
                    region: Lent::new(region.clone()),
                    local_offset: 0,
                    buffer: 0,
                    remote_offset: 0,
                    len: 4096,
                    token: [0; 16],
                    engine_id: 0,
                    starts_share: true,
                    payload_crc: None,
                })
            };
            // The connection the write started on broke (none now), or broke and another
            // took its place: its partly written frame is dropped (its slice fails with the
            // connection it was registered on); what was never registered is kept.
            for now in [None, Some(halves[1].clone())] {
                let mut st = WriteState {
                    half: now,
                    inline_busy: true,
                    ..WriteState::default()
                };
                st.hand_back(&halves[0], frames(&region, 1, 4096).into_iter(), [fresh()]);
                assert!(!st.inline_busy);
                assert_eq!(queued(&st), vec![u64::MAX]);
            }
        });
    }

    #[test]
    fn frames_written_together_arrive_whole_and_in_order_through_partial_writes() {
        block_on(async {
            let table = RegionTable::default();
            const COUNT: u64 = 700; // more frames than one writev takes
            const LEN: u64 = 4096;
            let region = table.allocate(COUNT * LEN).expect("region");
            let mut whole = Window::new(&region, 0, COUNT * LEN).expect("window");
            for (i, b) in whole.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let bytes = whole.as_slice();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            // A small send buffer: the writes are cut short and wait for room many times.
            socket.set_send_buffer_size(8192).expect("sndbuf");
            let client = socket.connect(addr).await.expect("connect");
            let (mut server, _) = listener.accept().await.expect("accept");
            let (_rd, wr) = client.into_split();
            let mut all = frames(&region, COUNT, LEN);
            let reader = tokio::spawn(async move {
                let mut got = vec![0u8; (COUNT * (HEADER_LEN as u64 + LEN)) as usize];
                server.read_exact(&mut got).await.expect("read");
                got
            });
            let mut blocked = 0;
            loop {
                match write_frames(&wr, &mut all) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        blocked += 1;
                        wr.writable().await.expect("writable");
                    }
                    Err(e) => panic!("write: {e}"),
                }
            }
            assert!(
                blocked > 0,
                "the small buffer never filled: test proves nothing"
            );
            assert_eq!(complete_prefix(&all), all.len());
            let got = reader.await.expect("reader");
            for (i, frame) in got.chunks(HEADER_LEN + LEN as usize).enumerate() {
                let h = Header::decode(&frame[..HEADER_LEN]).expect("header");
                assert_eq!((h.op, h.offset, h.length), (Op::WriteReq, i as u64, LEN));
                let at = i * LEN as usize;
                assert_eq!(
                    &frame[HEADER_LEN..],
                    &bytes[at..at + LEN as usize],
                    "frame {i}"
                );
            }
        });
    }
}
