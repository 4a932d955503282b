//! The target's side: an abstract unix socket that hands this engine's memfds to same-host
//! peers that prove who they are (the handshake, the segment token), one buffer id at a
//! time.

use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::auth::{Failure, Secret};
use crate::error::{Error, Result};
use crate::life_word;
use crate::linux::send_fds_async;
use crate::memory::RegionTable;
use crate::net::{server_handshake, Refused};
use crate::resource::Overflow;
use crate::wire::{token_eq, ConnKind, Token};

/// How long either side of an shm connection waits for the other's token and replies.
pub(super) const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the abstract unix socket that serves this engine's memfds.
pub(super) fn bind(engine_id: u64) -> Result<(UnixListener, String)> {
    let name = format!("ferry-shm-{engine_id:016x}-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::io("shm socket name", &e))?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)
        .map_err(|e| Error::io("bind shm socket", &e))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("bind shm socket", &e))?;
    crate::net::deepen_backlog(&std_listener)?;
    let listener =
        UnixListener::from_std(std_listener).map_err(|e| Error::io("bind shm socket", &e))?;
    Ok((listener, name))
}

/// Who may have this engine's memfds, and what they must prove.
pub(super) struct Gate {
    pub(super) engine_id: u64,
    pub(super) regions: Arc<RegionTable>,
    pub(super) token: Token,
    pub(super) secret: Option<Secret>,
    pub(super) admission: Arc<Admission>,
    /// Any uid may connect, not only this process's.
    pub(super) any_uid: bool,
    /// How long the handshake may take.
    pub(super) timeout: Duration,
}

/// Serves fd requests until `cancel` fires. The spare descriptor for running out is
/// taken now, as the engine starts.
pub(super) fn serve(
    listener: UnixListener,
    gate: Arc<Gate>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send {
    serve_until(listener, gate, cancel, Overflow::new())
}

async fn serve_until(
    listener: UnixListener,
    gate: Arc<Gate>,
    cancel: CancellationToken,
    mut overflow: Overflow,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let Ok(slot) = gate.admission.enter(None) else {
                    continue;
                };
                let gate = gate.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => {}
                        r = serve_one(stream, &gate) => {
                            if let Err(e) = r {
                                tracing::debug!(error = %e, "shm connection ended");
                            }
                        }
                    }
                });
            }
            // As the tcp listener does: out of descriptors, a waiting peer is told at once.
            Err(e) => {
                if !overflow.refuse_waiting(&e, &listener) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Checks the peer's uid (unless any uid may connect) and runs the handshake.
async fn admit_peer(stream: &mut UnixStream, gate: &Gate) -> std::result::Result<(), Refused> {
    if !gate.any_uid {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let ours = unsafe { libc::geteuid() };
        if crate::linux::peer_uid(&*stream).ok() != Some(ours) {
            return Err(Refused::silent(Failure::Uid));
        }
    }
    let handshake = server_handshake(stream, gate.secret.as_ref(), gate.engine_id);
    let hello = tokio::time::timeout(gate.timeout, handshake)
        .await
        .unwrap_or(Err(Refused::silent(Failure::Timeout)))?;
    if hello.buffer_id != ConnKind::Shm as u64 {
        return Err(Refused::silent(Failure::Protocol));
    }
    Ok(())
}

/// One client: the handshake, a 16-byte token, then 8-byte buffer ids, each answered with
/// 16 bytes (status u32, reserved u32, length u64) and, on success, the buffer's memfd.
async fn serve_one(mut stream: UnixStream, gate: &Gate) -> Result<()> {
    if let Err(refused) = admit_peer(&mut stream, gate).await {
        refused
            .settle(&mut stream, &gate.admission, None, gate.timeout)
            .await;
        return Err(Error::Protocol(format!(
            "shm peer refused: {}",
            refused.why.label()
        )));
    }
    let (regions, token) = (&gate.regions, &gate.token);
    let io = |e: std::io::Error| Error::io("shm serve", &e);
    let mut got = [0u8; 16];
    tokio::time::timeout(AUTH_TIMEOUT, stream.read_exact(&mut got))
        .await
        .map_err(|_| Error::Protocol("no shm token in time".into()))?
        .map_err(io)?;
    if !token_eq(&got, token) {
        return Err(Error::Protocol("shm client sent a wrong token".into()));
    }
    // The reply carries this process's life word, when it has one: peers then check that
    // it still runs with a load instead of a syscall (see `life_word`).
    match life_word::share() {
        Ok(word) => send_fds_async(&stream, &[1], &[word.as_fd()])
            .await
            .map_err(io)?,
        Err(e) => {
            tracing::debug!(error = %e, "no life word: peers poll this process's pidfd");
            stream.write_all(&[1]).await.map_err(io)?;
        }
    }
    loop {
        let mut id = [0u8; 8];
        match stream.read_exact(&mut id).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        }
        let id = u64::from_le_bytes(id);
        let mut reply = [0u8; 16];
        match regions.get(id).ok().filter(|r| r.mapping().is_some()) {
            Some(region) => {
                reply[8..].copy_from_slice(&(region.len() as u64).to_le_bytes());
                let fd = region
                    .mapping()
                    .ok_or_else(|| Error::Protocol("region lost its mapping".into()))?
                    .dup_fd()?;
                send_fds_async(&stream, &reply, &[fd.as_fd()])
                    .await
                    .map_err(io)?;
            }
            None => {
                reply[..4].copy_from_slice(&1u32.to_le_bytes());
                stream.write_all(&reply).await.map_err(io)?;
            }
        }
    }
}
