//! The target's side of a notification connection. The connection was authenticated by
//! the handshake (`server::serve`), which named the sender's engine id; its first frame
//! opens the sender's session (`protocol::Open`), refused when the sender planned for
//! another incarnation of this engine. Every notification on it is from that name and
//! engine id, offered to the inbox under the session and answered with what became of it,
//! in the order it came: the sender's order. A peer's link (its control connection) carries
//! the same frames, served one at a time by `OnLink`.

use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader, BufWriter};

use super::inbox::{Inbox, Notification};
use super::protocol::{Answer, Open};
use super::sessions::Binding;
use crate::error::{Error, Result};
use crate::net::read_frame_within;
use crate::sealed_stream::{tell_tampered, ConnRead, ConnWrite, SealedConn};
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

/// Serves one notification connection from the engine `sender` until it closes (sealed
/// when its handshake sealed it: a tampered record ends it, and the sender is told).
pub(crate) async fn serve_notify(
    conn: SealedConn,
    local: Receiving<'_>,
    sender: u64,
) -> Result<()> {
    let mut r = BufReader::new(conn.r);
    let mut w = BufWriter::new(conn.w);
    let served = serve_opened(&mut r, &mut w, &local, sender).await;
    if r.get_ref().tampered() {
        return Err(tell_tampered(&mut w, local.frame_timeout, "notification").await);
    }
    served
}

async fn serve_opened(
    r: &mut BufReader<ConnRead>,
    w: &mut BufWriter<ConnWrite>,
    local: &Receiving<'_>,
    sender: u64,
) -> Result<()> {
    let Some((head, name)) = read_frame_within(r, local.frame_timeout).await? else {
        return Ok(());
    };
    let open = Open::decode(&head, name)?;
    let inbox = local.inbox;
    let here = inbox.engine_id();
    let binding = match inbox.open(sender, &open) {
        Ok(b) => b,
        Err(refused) => {
            answer(w, refused.frame(0, here), &[]).await?;
            w.flush()
                .await
                .map_err(|e| Error::io("flush notification ack", &e))?;
            return Ok(());
        }
    };
    let held = Held { inbox, binding };
    answer(w, Answer::Taken.frame(0, here), &[]).await?;
    w.flush()
        .await
        .map_err(|e| Error::io("flush notification ack", &e))?;
    serve_session(r, w, local, &held, open.name).await
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
async fn serve_session(
    r: &mut BufReader<ConnRead>,
    w: &mut BufWriter<ConnWrite>,
    local: &Receiving<'_>,
    held: &Held<'_>,
    from: String,
) -> Result<()> {
    while let Some((h, data)) = read_frame_within(r, local.frame_timeout).await? {
        if h.op != Op::Notify {
            return Err(Error::Protocol(format!(
                "unexpected {:?} on a notification connection",
                h.op
            )));
        }
        let (reply, text) = take(local, held, &h, data, &from);
        answer(w, reply, &text).await?;
        if Answer::from_raw(reply.flags) == Some(Answer::Superseded) && reply.op == Op::NotifyAck {
            // The sender reconnected: this connection is stale.
            return w
                .flush()
                .await
                .map_err(|e| Error::io("flush notification ack", &e));
        }
        // Acks of a burst leave in one write.
        if r.buffer().len() + r.get_ref().opened_len() < HEADER_LEN {
            w.flush()
                .await
                .map_err(|e| Error::io("flush notification ack", &e))?;
        }
    }
    Ok(())
}

/// Offers notification `h` (its payload `data`, from segment `from`) to the session `held`
/// holds; the answer to send, and its text.
fn take(
    local: &Receiving<'_>,
    held: &Held<'_>,
    h: &Header,
    data: Vec<u8>,
    from: &str,
) -> (Header, Vec<u8>) {
    let here = held.inbox.engine_id();
    if data.len() > local.max_bytes {
        // The sender checks its own cap; this one is the target's, which may be lower.
        // Its number is used all the same: the sender goes on with the next one.
        held.inbox.skip(&held.binding, h.request_id);
        let mut reply = Header::new(Op::Error);
        reply.request_id = h.request_id;
        reply.flags = RejectCode::BadRequest as u16;
        let text = format!(
            "a notification of {} bytes is larger than this engine's notifyMaxBytes ({})",
            data.len(),
            local.max_bytes
        )
        .into_bytes();
        reply.length = text.len() as u64;
        return (reply, text);
    }
    let note = Notification {
        from: from.to_string(),
        engine_id: held.binding.sender(),
        data,
        bytes: h.offset,
    };
    let answered = held.inbox.offer(&held.binding, h.request_id, note);
    if answered.is_refusal() {
        tracing::debug!(?answered, seq = h.request_id, "notification refused");
    }
    (answered.frame(h.request_id, here), Vec::new())
}

/// The notifications of one sender on its link (a control connection): the same session
/// rules as on a notification connection, frame by frame as the control loop reads them.
/// `NotifyOpen` opens (or reopens) the session this connection holds; each `Notify` is
/// answered as `serve_session` answers it. A session superseded by another connection is
/// let go, the link itself goes on.
pub(crate) struct OnLink<'a> {
    local: Receiving<'a>,
    /// The engine id the connection's handshake proved.
    sender: u64,
    session: Option<(Held<'a>, String)>,
}

impl<'a> OnLink<'a> {
    pub(crate) fn new(local: Receiving<'a>, sender: u64) -> Self {
        Self {
            local,
            sender,
            session: None,
        }
    }

    /// Answers one `NotifyOpen` or `Notify` frame; an error ends the connection.
    pub(crate) fn frame(&mut self, h: &Header, data: Vec<u8>) -> Result<(Header, Vec<u8>)> {
        let inbox = self.local.inbox;
        let here = inbox.engine_id();
        if h.op == Op::NotifyOpen {
            let open = Open::decode(h, data)?;
            // Released before the next is bound: one session per connection.
            self.session = None;
            return Ok(match inbox.open(self.sender, &open) {
                Ok(binding) => {
                    self.session = Some((Held { inbox, binding }, open.name));
                    (Answer::Taken.frame(0, here), Vec::new())
                }
                Err(refused) => (refused.frame(0, here), Vec::new()),
            });
        }
        let Some((held, from)) = self.session.as_ref() else {
            return Err(Error::Protocol(
                "a notification on a link with no session open".into(),
            ));
        };
        let (reply, text) = take(&self.local, held, h, data, from);
        if reply.op == Op::NotifyAck && Answer::from_raw(reply.flags) == Some(Answer::Superseded) {
            self.session = None;
        }
        Ok((reply, text))
    }
}
