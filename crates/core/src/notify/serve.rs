//! The target's side of a notification connection. The connection was authenticated by
//! the handshake (`server::serve`), which named the sender's engine id; its first frame
//! opens the sender's session (`protocol::Open`), refused when the sender planned for
//! another incarnation of this engine. Every notification on it is from that name and
//! engine id, offered to the inbox under the session and answered with what became of it,
//! in the order it came: the sender's order.

use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

use super::inbox::{Inbox, Notification};
use super::protocol::{Answer, Open};
use super::sessions::Binding;
use crate::error::{Error, Result};
use crate::net::read_frame_within;
use crate::wire::{Header, Op, RejectCode, HEADER_LEN};

/// What the target's side takes from the local segment: where notifications go, and its
/// limits.
pub(crate) struct Receiving<'a> {
    /// The receive queue.
    pub(crate) inbox: &'a Inbox,
    /// Largest payload accepted here (`notifyMaxBytes`).
    pub(crate) max_bytes: usize,
    /// Deadline of each started frame.
    pub(crate) frame_timeout: Duration,
}

/// Serves one notification connection from the engine `sender` until it closes.
pub(crate) async fn serve_notify(
    stream: TcpStream,
    local: Receiving<'_>,
    sender: u64,
) -> Result<()> {
    let (rd, wr) = stream.into_split();
    let mut r = BufReader::new(rd);
    let mut w = BufWriter::new(wr);
    let Some((head, name)) = read_frame_within(&mut r, local.frame_timeout).await? else {
        return Ok(());
    };
    let open = Open::decode(&head, name)?;
    let inbox = local.inbox;
    let here = inbox.engine_id();
    let binding = match inbox.open(sender, &open) {
        Ok(b) => b,
        Err(refused) => {
            answer(&mut w, refused.frame(0, here), &[]).await?;
            w.flush()
                .await
                .map_err(|e| Error::io("flush notification ack", &e))?;
            return Ok(());
        }
    };
    let held = Held { inbox, binding };
    answer(&mut w, Answer::Taken.frame(0, here), &[]).await?;
    w.flush()
        .await
        .map_err(|e| Error::io("flush notification ack", &e))?;
    serve_session(&mut r, &mut w, &local, &held, open.name).await
}

/// Releases a connection's session when it ends, however it ends.
struct Held<'a> {
    inbox: &'a Inbox,
    binding: Binding,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.inbox.release(&self.binding);
    }
}

async fn answer<W: AsyncWriteExt + Unpin>(w: &mut W, h: Header, text: &[u8]) -> Result<()> {
    w.write_all(&h.encode())
        .await
        .map_err(|e| Error::io("write notification ack", &e))?;
    w.write_all(text)
        .await
        .map_err(|e| Error::io("write notification ack", &e))
}

/// Takes the notifications of an open session until the connection closes.
async fn serve_session<R, W>(
    r: &mut BufReader<R>,
    w: &mut W,
    local: &Receiving<'_>,
    held: &Held<'_>,
    from: String,
) -> Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let here = held.inbox.engine_id();
    while let Some((h, data)) = read_frame_within(r, local.frame_timeout).await? {
        if h.op != Op::Notify {
            return Err(Error::Protocol(format!(
                "unexpected {:?} on a notification connection",
                h.op
            )));
        }
        let mut text = Vec::new();
        let reply = if data.len() > local.max_bytes {
            // The sender checks its own cap; this one is the target's, which may be lower.
            // Its number is used all the same: the sender goes on with the next one.
            held.inbox.skip(&held.binding, h.request_id);
            let mut reply = Header::new(Op::Error);
            reply.request_id = h.request_id;
            reply.flags = RejectCode::BadRequest as u16;
            text = format!(
                "a notification of {} bytes is larger than this engine's notifyMaxBytes ({})",
                data.len(),
                local.max_bytes
            )
            .into_bytes();
            reply.length = text.len() as u64;
            reply
        } else {
            let note = Notification {
                from: from.clone(),
                engine_id: held.binding.sender(),
                data,
                bytes: h.offset,
            };
            let answered = held.inbox.offer(&held.binding, h.request_id, note);
            if answered.is_refusal() {
                tracing::debug!(?answered, seq = h.request_id, "notification refused");
            }
            if answered == Answer::Superseded {
                // The sender reconnected: this connection is stale.
                answer(w, answered.frame(h.request_id, here), &[]).await?;
                return w
                    .flush()
                    .await
                    .map_err(|e| Error::io("flush notification ack", &e));
            }
            answered.frame(h.request_id, here)
        };
        answer(w, reply, &text).await?;
        // Acks of a burst leave in one write.
        if r.buffer().len() < HEADER_LEN {
            w.flush()
                .await
                .map_err(|e| Error::io("flush notification ack", &e))?;
        }
    }
    Ok(())
}
