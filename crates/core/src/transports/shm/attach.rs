//! The initiator's side of an attach: connecting to a same-host target's socket, proving
//! the token, receiving each shm buffer's memfd over SCM_RIGHTS and mapping it.

use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream as StdUnixStream};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use tokio::net::UnixStream;

use super::peer::Mappings;
use super::serve::AUTH_TIMEOUT;
use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::life_word::PeerLifeWord;
use crate::linux::{peer_pid, Pidfd, RemoteMapping};
use crate::net::{client_handshake, CUT_RETRIES};
use crate::segment::SegmentDescriptor;
use crate::wire::{ConnKind, Token};

/// Connects, proves the token, and maps every shm buffer of `desc`.
///
/// Everything that blocks runs on tokio's blocking pool, never on a runtime worker: the
/// connect, the fd exchange (blocking reads with a timeout) and above all the mapping,
/// whose `MAP_POPULATE` allocates and zeroes every page of a fresh memfd (about 1 s per
/// GiB on an idle machine, several under load). A worker blocked that long starves the
/// tasks queued on it, the heartbeats of every peer among them, until the engine declares
/// a healthy peer silent.
pub(super) async fn connect_and_map(
    socket: &str,
    local_engine_id: u64,
    token: &Token,
    desc: &SegmentDescriptor,
) -> Result<Attached> {
    let io = |what: &'static str| move |e: std::io::Error| Error::io(what, &e);
    // The handshake, as on tcp, and like tcp's `net::connect` on a new connection when the
    // target cut it before any verdict (its handshake budget was full), a few times, all
    // within one `AUTH_TIMEOUT`; then the token and fd requests, blocking with a timeout.
    let handshake = async {
        let mut cuts = 0;
        loop {
            let name = socket.to_string();
            let (std_stream, pidfd) = off_runtime(move || {
                let addr =
                    SocketAddr::from_abstract_name(name.as_bytes()).map_err(io("shm address"))?;
                let std_stream =
                    StdUnixStream::connect_addr(&addr).map_err(io("connect shm socket"))?;
                let pid = peer_pid(&std_stream).map_err(io("shm peer pid"))?;
                let pidfd = Pidfd::open(pid).map_err(io("pidfd_open"))?;
                Ok((std_stream, pidfd))
            })
            .await?;
            std_stream.set_nonblocking(true).map_err(io("shm socket"))?;
            let mut tokio_stream = UnixStream::from_std(std_stream).map_err(io("shm socket"))?;
            match client_handshake(&mut tokio_stream, ConnKind::Shm, local_engine_id).await {
                Ok(_) => return Ok((tokio_stream, pidfd)),
                Err(failure) if failure.is_cut() && cuts < CUT_RETRIES => cuts += 1,
                Err(failure) => return Err(failure.into_error(&format!("shm socket {socket}"))),
            }
        }
    };
    let (tokio_stream, pidfd) = tokio::time::timeout(AUTH_TIMEOUT, handshake)
        .await
        .map_err(|_| Error::Protocol("shm handshake timed out".into()))??;
    let std_stream = tokio_stream.into_std().map_err(io("shm socket"))?;
    let (token, desc) = (*token, desc.clone());
    let (std_stream, (maps, life)) = off_runtime(move || {
        let got = fetch_and_map(&std_stream, &token, &desc)?;
        Ok((std_stream, got))
    })
    .await?;
    std_stream.set_nonblocking(true).map_err(io("shm socket"))?;
    let stream = UnixStream::from_std(std_stream).map_err(io("shm socket"))?;
    Ok(Attached {
        stream,
        pidfd,
        maps,
        life,
    })
}

/// What an attach gives: the connection the target's death is watched on, its pidfd, its
/// shm buffers mapped, and its life word when it sent one.
pub(super) struct Attached {
    pub(super) stream: UnixStream,
    pub(super) pidfd: Pidfd,
    pub(super) maps: Mappings,
    pub(super) life: Option<PeerLifeWord>,
}

/// Runs blocking work on tokio's blocking pool and waits for it. Where the pool has no
/// thread and cannot start one (out of threads or memory), tokio panics in
/// `spawn_blocking`: that becomes a `ResourceLimit` here, not a panic of the open.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio::task::spawn_blocking(work)
    }))
    .map_err(|_| {
        Error::ResourceLimit(
            "threads: the I/O runtime could not start a blocking thread for the shm attach (RLIMIT_NPROC, threads-max, or memory for its stack) in this process"
                .into(),
        )
    })?;
    spawned
        .await
        .map_err(|e| Error::Io(format!("shm attach: {e}")))?
}

/// The blocking part of an attach, after the handshake: the token, then one fd request
/// per shm buffer of `desc`, each mapped as it comes. Reads time out after
/// [`AUTH_TIMEOUT`]: a peer that stops answering costs a blocking-pool thread that long.
fn fetch_and_map(
    std_stream: &StdUnixStream,
    token: &Token,
    desc: &SegmentDescriptor,
) -> Result<(Mappings, Option<PeerLifeWord>)> {
    let io = |what: &'static str| move |e: std::io::Error| Error::io(what, &e);
    std_stream
        .set_nonblocking(false)
        .map_err(io("shm socket"))?;
    std_stream
        .set_read_timeout(Some(AUTH_TIMEOUT))
        .map_err(io("shm socket"))?;
    let mut s = std_stream;
    s.write_all(token).map_err(io("shm token"))?;
    let mut ok = [0u8; 1];
    let (n, mut word) =
        crate::linux::recv_fds(std_stream, &mut ok, 1).map_err(io("shm token reply"))?;
    if n != 1 {
        return Err(Error::Protocol(
            "the shm socket closed before the token reply".into(),
        ));
    }
    let life = word.pop().and_then(|fd| {
        PeerLifeWord::map(fd)
            .map_err(|e| tracing::debug!(error = %e, "life word refused: the pidfd is polled"))
            .ok()
    });
    let mut maps = FxHashMap::default();
    for b in desc
        .buffers
        .iter()
        .filter(|b| b.transports.contains(&TransportKind::Shm))
    {
        s.write_all(&b.id.to_le_bytes())
            .map_err(io("shm fd request"))?;
        let mut reply = [0u8; 16];
        let (n, mut fds) =
            crate::linux::recv_fds(std_stream, &mut reply, 1).map_err(io("shm fd reply"))?;
        if n != reply.len() {
            return Err(Error::Protocol(format!("short shm reply ({n} bytes)")));
        }
        let status = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&reply[8..]);
        let len = u64::from_le_bytes(len);
        match (status, fds.pop()) {
            (0, Some(fd)) if len == b.length => {
                let len =
                    usize::try_from(len).map_err(|_| Error::Protocol("buffer too large".into()))?;
                let mapping = RemoteMapping::map(fd, len)
                    .map_err(|e| Error::mapping("map shm buffer", len as u64, &e))?;
                if !mapping.is_shrink_sealed() {
                    return Err(Error::Protocol(format!(
                        "buffer {} is not sealed against shrinking; refusing to map it",
                        b.id
                    )));
                }
                maps.insert(b.id, Arc::new(mapping));
            }
            (0, _) => {
                return Err(Error::Protocol(format!(
                    "bad shm reply for buffer {}",
                    b.id
                )))
            }
            _ => {} // released since the descriptor was made: not mapped, tcp serves it
        }
    }
    std_stream
        .set_read_timeout(None)
        .map_err(io("shm socket"))?;
    Ok((maps, life))
}

/// The abstract socket a peer serves its memfds on, from its descriptor.
pub(super) fn socket_of(desc: &SegmentDescriptor) -> Option<String> {
    desc.transport_info
        .get(TransportKind::Shm.name())?
        .get("socket")?
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    use super::*;
    use crate::net::{acknowledge, server_handshake};
    use crate::transports::shm::serve::bind;

    fn empty_descriptor() -> SegmentDescriptor {
        SegmentDescriptor {
            engine_id: 0x5eed,
            name: "127.0.0.1:1".into(),
            machine_id: String::new(),
            pid: std::process::id(),
            tcp_addr: "127.0.0.1:1".into(),
            token: String::new(),
            buffers: Vec::new(),
            transport_info: Default::default(),
        }
    }

    /// A target that cuts the first `cut` handshakes after reading them (as one whose
    /// handshake budget is full pushes them out) and serves the next; returns how many
    /// connections it accepted.
    fn cutting_target(
        listener: tokio::net::UnixListener,
        cut: usize,
    ) -> std::thread::JoinHandle<usize> {
        let listener = listener.into_std().expect("std");
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("target runtime");
            rt.block_on(async move {
                let listener = UnixListener::from_std(listener).expect("listener");
                let mut accepted = 0;
                loop {
                    let accept = tokio::time::timeout(Duration::from_secs(10), listener.accept());
                    let Ok(Ok((mut stream, _))) = accept.await else {
                        return accepted;
                    };
                    accepted += 1;
                    let shake = server_handshake(&mut stream, None, 0x5eed).await;
                    if accepted <= cut {
                        drop(stream); // pushed out: closed before any verdict
                        continue;
                    }
                    shake.expect("handshake");
                    acknowledge(&mut stream, 0x5eed).await.expect("HelloAck");
                    let mut token = [0u8; 16];
                    stream.read_exact(&mut token).await.expect("token");
                    stream.write_all(&[1]).await.expect("reply");
                    // Held until the initiator lets go.
                    let _ = stream.read(&mut token).await;
                    return accepted;
                }
            })
        })
    }

    #[test]
    fn an_attach_whose_handshake_was_cut_tries_again_on_a_new_connection() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // Socket names of their own: tests run at once.
        for (cut, id) in [(1, 0xc071), (CUT_RETRIES as usize, 0xc072)] {
            let (listener, name) = {
                let _guard = rt.enter();
                bind(id).expect("bind")
            };
            let target = cutting_target(listener, cut);
            let attached = rt.block_on(connect_and_map(&name, 1, &[7; 16], &empty_descriptor()));
            assert!(attached.is_ok(), "cut {cut}×: {:?}", attached.err());
            drop(attached);
            assert_eq!(target.join().expect("target"), cut + 1);
        }
        // One cut more than the retries: the attach fails, saying why.
        let (listener, name) = {
            let _guard = rt.enter();
            bind(0xc073).expect("bind")
        };
        let target = cutting_target(listener, CUT_RETRIES as usize + 1);
        let failed = rt.block_on(connect_and_map(&name, 1, &[7; 16], &empty_descriptor()));
        let error = failed.err().expect("cut every time");
        assert!(
            error.to_string().contains("closed during the handshake"),
            "{error}"
        );
        drop(target); // it waits for a connection that never comes, then ends by itself
    }

    #[test]
    fn an_attach_waiting_on_its_peer_leaves_the_runtime_running() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (listener, name) = {
            let _guard = rt.enter();
            bind(0x5eed).expect("bind")
        };
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = ticks.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticker.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The peer, on its own thread and runtime.
        let seen = ticks.clone();
        let peer = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("peer runtime");
            rt.block_on(async move {
                let listener =
                    UnixListener::from_std(listener.into_std().expect("std")).expect("listener");
                let (mut stream, _) = listener.accept().await.expect("accept");
                server_handshake(&mut stream, None, 0x5eed)
                    .await
                    .expect("handshake");
                acknowledge(&mut stream, 0x5eed).await.expect("HelloAck");
                let mut token = [0u8; 16];
                stream.read_exact(&mut token).await.expect("token");
                // The initiator now waits for the reply. Did its runtime tick meanwhile?
                let before = seen.load(Ordering::Relaxed);
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                let ticked = loop {
                    if seen.load(Ordering::Relaxed) >= before + 3 {
                        break true;
                    }
                    if std::time::Instant::now() > deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                stream.write_all(&[1]).await.expect("reply");
                ticked
            })
        });
        let desc = SegmentDescriptor {
            engine_id: 0x5eed,
            name: "127.0.0.1:1".into(),
            machine_id: String::new(),
            pid: std::process::id(),
            tcp_addr: "127.0.0.1:1".into(),
            token: String::new(),
            buffers: Vec::new(),
            transport_info: Default::default(),
        };
        let attached = rt.block_on(connect_and_map(&name, 1, &[7; 16], &desc));
        let ticked = peer.join().expect("peer thread");
        assert!(attached.is_ok(), "{:?}", attached.err());
        assert!(
            ticked,
            "the runtime stopped while the attach waited for its peer"
        );
    }
}
