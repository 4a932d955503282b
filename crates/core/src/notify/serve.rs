//! The target's side of a notification connection. The connection was authenticated by
//! the handshake (`server::serve`); its first frame names the sender (`NotifyOpen`), and
//! every notification on it is from that name and the engine id the handshake
//! established. Each is offered to the inbox and acknowledged with what became of it, in
//! the order it came: the sender's order.

use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

use super::inbox::{Inbox, Notification};
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
    let Some((open, name)) = read_frame_within(&mut r, local.frame_timeout).await? else {
        return Ok(());
    };
    if open.op != Op::NotifyOpen {
        return Err(Error::Protocol(format!(
            "a notification connection starts with NotifyOpen, got {:?}",
            open.op
        )));
    }
    let from = String::from_utf8(name)
        .map_err(|_| Error::Protocol("the sender's segment name is not UTF-8".into()))?;
    let inbox = local.inbox;
    while let Some((h, data)) = read_frame_within(&mut r, local.frame_timeout).await? {
        if h.op != Op::Notify {
            return Err(Error::Protocol(format!(
                "unexpected {:?} on a notification connection",
                h.op
            )));
        }
        let mut reply = Header::new(Op::NotifyAck);
        reply.request_id = h.request_id;
        let mut text = Vec::new();
        if data.len() > local.max_bytes {
            // The sender checks its own cap; this one is the target's, which may be lower.
            reply.op = Op::Error;
            reply.flags = RejectCode::BadRequest as u16;
            text = format!(
                "a notification of {} bytes is larger than this engine's notifyMaxBytes ({})",
                data.len(),
                local.max_bytes
            )
            .into_bytes();
            reply.length = text.len() as u64;
        } else {
            let note = Notification {
                from: from.clone(),
                engine_id: sender,
                data,
                bytes: h.offset,
            };
            reply.flags = inbox.offer(sender, h.request_id, note) as u16;
        }
        w.write_all(&reply.encode())
            .await
            .map_err(|e| Error::io("write notification ack", &e))?;
        w.write_all(&text)
            .await
            .map_err(|e| Error::io("write notification ack", &e))?;
        // Acks of a burst leave in one write.
        if r.buffer().len() < HEADER_LEN {
            w.flush()
                .await
                .map_err(|e| Error::io("flush notification ack", &e))?;
        }
    }
    Ok(())
}
