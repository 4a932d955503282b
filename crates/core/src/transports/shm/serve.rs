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

use crate::admission::{Admission, Handshake};
use crate::auth::{Failure, Secret};
use crate::error::{Error, Result};
use crate::farewell::Farewell;
use crate::life_word;
use crate::linux::send_fds_async;
use crate::memory::RegionTable;
use crate::net::{acknowledge, refuse, server_handshake, Refused};
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
    /// Said on every served connection as the engine closes (one byte, [`GOODBYE`]).
    pub(super) farewell: Arc<Farewell>,
}

/// The byte a closing target sends on each shm connection: its peers then report it
/// `closed`, not crashed, when the connection ends.
pub(super) const GOODBYE: u8 = 0x47;

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
                // Local processes are one source of the handshake budget (as an address
                // is for tcp): never refused here, the oldest handshake may be pushed out.
                let handshake = gate.admission.start_handshake(None);
                let gate = gate.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move {
                    let evicted = handshake.evicted();
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => {}
                        _ = evicted.cancelled() => {}
                        r = serve_one(stream, &gate, handshake) => {
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
async fn serve_one(mut stream: UnixStream, gate: &Gate, handshake: Handshake) -> Result<()> {
    if let Err(refused) = admit_peer(&mut stream, gate).await {
        refused
            .settle(&mut stream, &gate.admission, None, gate.timeout)
            .await;
        return Err(Error::Protocol(format!(
            "shm peer refused: {}",
            refused.why.label()
        )));
    }
    let _slot = match handshake.admit() {
        Ok(slot) => slot,
        Err(refusal) => {
            let why = gate.admission.describe(refusal);
            let told = refuse(&mut stream, refusal.reject_code(), why.as_bytes());
            let _ = tokio::time::timeout(gate.timeout, told).await;
            return Err(Error::Protocol(format!(
                "shm peer refused: {}",
                refusal.reason()
            )));
        }
    };
    tokio::time::timeout(gate.timeout, acknowledge(&mut stream, gate.engine_id))
        .await
        .map_err(|_| Error::Protocol("shm HelloAck not sent in time".into()))??;
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
    let _owed = gate.farewell.owe();
    loop {
        let mut id = [0u8; 8];
        let read = tokio::select! {
            biased;
            _ = gate.farewell.begun() => {
                let bye = stream.write_all(&[GOODBYE]);
                let _ = tokio::time::timeout(gate.timeout, bye).await;
                return Ok(());
            }
            read = stream.read_exact(&mut id) => read,
        };
        match read {
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
