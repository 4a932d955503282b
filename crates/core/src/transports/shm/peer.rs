//! A same-host peer as the initiator knows it: its buffers mapped, and whether its process
//! still runs. A dead process's memory stays mapped, so a copy into it would "succeed"
//! silently: the pidfd (exit) and the unix connection (EOF) report its death at once
//! ([`watch`]), and each copy checks after it finishes ([`ShmPeer::confirm_alive`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

use super::serve::GOODBYE;
use crate::life_word::PeerLifeWord;
use crate::linux::{Pidfd, RemoteMapping};
use crate::liveness::LossReason;
use crate::segment::Peer;

/// A peer's shm buffers, mapped, by buffer id.
/// By the peer's own buffer ids (an authenticated peer's, read per copy: a fast hash).
pub(super) type Mappings = FxHashMap<u64, Arc<RemoteMapping>>;

/// Called when a same-host peer's process is seen to exit, or its engine says goodbye.
pub(super) type DeathHook = Arc<dyn Fn(&Arc<Peer>, LossReason) + Send + Sync>;

/// What the transport knows about one same-host peer.
pub(super) struct ShmPeer {
    pub(super) peer: Arc<Peer>,
    /// The incarnation of the peer these mappings are of (its engine id).
    pub(super) engine_id: u64,
    pidfd: Pidfd,
    /// The target's life word, when it sent one: read after each copy instead of polling
    /// `pidfd`.
    life: Option<PeerLifeWord>,
    dead: AtomicBool,
    cancel: CancellationToken,
}

impl ShmPeer {
    /// `peer`, attached: its pidfd, its life word if it sent one (its buffers' mappings
    /// are the transport's table's); `cancel` stops its watcher.
    pub(super) fn new(
        peer: Arc<Peer>,
        engine_id: u64,
        pidfd: Pidfd,
        life: Option<PeerLifeWord>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            peer,
            engine_id,
            pidfd,
            life,
            dead: AtomicBool::new(false),
            cancel,
        }
    }

    /// Whether the target's death is not known yet: a flag read, no syscall. The watcher
    /// (pidfd, connection EOF), `fail_peer` and [`ShmPeer::confirm_alive`] set it. Good for
    /// the checks before a copy: copying into a dead target's memory is harmless as long as
    /// the copy is not reported done, and the check after it ([`ShmPeer::confirm_alive`])
    /// is what decides that.
    pub(super) fn known_alive(&self) -> bool {
        !self.dead.load(Ordering::Acquire)
    }

    /// Whether the target still runs: its life word (a load; the kernel marks it as the
    /// process ends, before it counts as exited), else asked of the kernel (one `poll` of
    /// the pidfd). Run once after each copy, so no copy that ends after the target exited
    /// completes; the first that sees the death records it for every later check.
    pub(super) fn confirm_alive(&self) -> bool {
        if !self.known_alive() {
            return false;
        }
        let running = match &self.life {
            Some(word) => word.is_alive(),
            None => self.pidfd.is_alive(),
        };
        if running {
            return true;
        }
        self.mark_dead();
        false
    }

    /// Records the target's death: every later copy fails.
    pub(super) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Lets go of the peer: its watcher stops. Its buffers are unmapped once the
    /// transport's table let go of them and the copies in flight (which hold their
    /// mapping) end.
    pub(super) fn let_go(&self) {
        self.cancel.cancel();
    }
}

/// Reports the peer gone when its engine says goodbye, its process exits or its unix
/// connection closes. The connection is looked at first: a goodbye already sent by a
/// process that then exited is still a goodbye.
pub(super) async fn watch(peer: Arc<ShmPeer>, mut stream: UnixStream, on_death: DeathHook) {
    let mut byte = [0u8; 1];
    let crashed = |why: String| LossReason::Transport(why);
    let why = tokio::select! {
        biased;
        _ = peer.cancel.cancelled() => return,
        r = stream.read(&mut byte) => match r {
            Ok(1) if byte[0] == GOODBYE => LossReason::Closed,
            Ok(0) => crashed("shm connection closed by the target without a goodbye".into()),
            Ok(_) => crashed("unexpected bytes on the shm connection".into()),
            Err(e) => crashed(format!("shm connection failed: {e}")),
        },
        r = peer.pidfd.exited() => match r {
            Ok(()) => crashed("target process exited".into()),
            Err(e) => crashed(format!("pidfd failed: {e}")),
        },
    };
    peer.mark_dead();
    tracing::warn!(peer = peer.peer.name(), reason = %why, "same-host peer gone");
    on_death(&peer.peer, why);
}
