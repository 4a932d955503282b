//! How an outbox reaches its peer: on the peer's link when the incarnation the link reached
//! serves notifications there (`link_port`), else on a notification connection of its own
//! (an authenticated connection of kind `Notify`). Either way the outbox gets the same
//! thing: who it reached, where to write, and the answers in order, ending with the
//! connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::link_port::{LinkEnd, Read};
use crate::net::{connect, read_frame, write_frame};
use crate::sealed_stream::{tampered_by_notice, ConnWrite, SealedConn};
use crate::segment::Peer;
use crate::wire::{ConnKind, Header};

/// Answers read from a notification connection of its own and not taken yet.
const OWN_ANSWERS: usize = 64;

/// Where an outbox writes.
pub(super) enum Wire {
    /// Its own notification connection (boxed: a sealed one's keys are large).
    Own(Box<ConnWrite>),
    /// The peer's link.
    Link(LinkEnd),
}

impl Wire {
    /// Writes one frame, whole, by `deadline`: a target that stops reading must not hold
    /// the outbox past it.
    pub(super) async fn send(&mut self, h: &Header, body: &[u8], deadline: Instant) -> Result<()> {
        let sent = match self {
            Wire::Own(wr) => {
                tokio::time::timeout_at(deadline, write_frame(&mut **wr, h, body)).await
            }
            Wire::Link(end) => {
                tokio::time::timeout_at(deadline, end.send((*h, body.to_vec()))).await
            }
        };
        sent.map_err(|_| Error::Timeout)?
    }
}

/// A way to the peer, as `reach` found it.
pub(super) struct Path {
    /// The incarnation reached.
    pub(super) receiver: u64,
    pub(super) wire: Wire,
    /// The target's answers, in order; an error or the end once the connection ended.
    pub(super) answers: mpsc::Receiver<Read>,
    /// The reader of an own connection, stopped with the path.
    _reader: Option<AbortOnDrop>,
}

/// Reaches `peer`: waits (until `until`) for its link to be up on the incarnation its
/// descriptor names, then takes the link if that incarnation serves notifications there,
/// or connects on its own.
pub(super) async fn reach(
    peer: &Arc<Peer>,
    engine_id: u64,
    connect_timeout: Duration,
    until: Option<Instant>,
) -> Result<Path> {
    let mut watch = peer.link_port.watch();
    let end = loop {
        if peer.is_lost() {
            return Err(peer.lost_error());
        }
        // A link still on an incarnation older than the descriptor is about to move (a
        // new one was seen: `relink`); what is sent now is for whoever answers now.
        let current = watch.borrow_and_update().clone();
        if let Some(end) = current.filter(|e| e.engine_id == peer.engine_id()) {
            break end;
        }
        tokio::select! {
            changed = watch.changed() => changed.map_err(|_| Error::Closed)?,
            _ = sleep_until_opt(until) => return Err(Error::Timeout),
        }
    };
    if end.carries_notify {
        let answers = end.attach();
        return Ok(Path {
            receiver: end.engine_id,
            wire: Wire::Link(end),
            answers,
            _reader: None,
        });
    }
    let addr = peer.addr();
    let (stream, receiver, keys) =
        connect(&addr, ConnKind::Notify, engine_id, connect_timeout).await?;
    let SealedConn { r: mut rd, w: wr } = SealedConn::new(stream, keys);
    let sealed = rd.is_sealed();
    // Answers are read by their own task, so that a send never interrupts a half-read frame.
    let (tx, answers) = mpsc::channel::<Read>(OWN_ANSWERS);
    let reader = tokio::spawn(async move {
        loop {
            let got = match read_frame(&mut rd).await {
                // The target found a notification from here tampered with: the connection
                // ends with that error (the outbox resends on the next one).
                Ok(Some((h, body))) => match tampered_by_notice(&h, sealed) {
                    Some(tampered) => Err(tampered),
                    None => Ok(Some((h, body))),
                },
                other => other,
            };
            let end = !matches!(got, Ok(Some(_)));
            if tx.send(got).await.is_err() || end {
                return;
            }
        }
    });
    Ok(Path {
        receiver,
        wire: Wire::Own(Box::new(wr)),
        answers,
        _reader: Some(AbortOnDrop(reader)),
    })
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
