//! The transport trait. The engine owns the loop around it: validation, selection,
//! bookkeeping and failover happen above; a transport only moves slices and writes each
//! task's outcome into the task's shared state.

use std::sync::Arc;

use crate::error::Result;
use crate::segment::Peer;
use crate::task::Task;

/// Which transport served (or is serving) a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// TCP sockets.
    Tcp = 1,
    /// Shared memory on the same host.
    Shm = 2,
    /// RDMA verbs.
    Rdma = 3,
}

impl TransportKind {
    /// Parses a lowercase name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "tcp" => Some(Self::Tcp),
            "shm" => Some(Self::Shm),
            "rdma" => Some(Self::Rdma),
            _ => None,
        }
    }
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Shm => "shm",
            Self::Rdma => "rdma",
        }
    }
    /// Reads the raw value stored in a task (0 = none yet).
    pub fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            1 => Some(Self::Tcp),
            2 => Some(Self::Shm),
            3 => Some(Self::Rdma),
            _ => None,
        }
    }
}

/// One attempt of a task, handed to a transport.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The task.
    pub task: Arc<Task>,
    /// The attempt number every completion must quote.
    pub attempt: u32,
}

/// A way of moving bytes to and from peers.
pub trait Transport: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Prepares the transport for use; a failure leaves it uninstalled (never selected).
    fn install(&self) -> Result<()> {
        Ok(())
    }

    /// Takes attempts (requests already validated) and returns one result per attempt.
    /// An `Err` means nothing of that attempt was sent, so it can safely be retried on
    /// another transport. `Ok` means the transport owns the attempt until it reports every
    /// slice done (`Task::slice_done`) or the attempt failed (`Task::attempt_failed`).
    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>>;

    /// Fails every in-flight and queued slice towards `peer` at once and drops its
    /// connections (the peer was declared lost).
    fn fail_peer(&self, peer: &Peer, error: crate::Error);

    /// Like `fail_peer`, and forgets the peer (its segment was closed).
    fn forget_peer(&self, peer: &Peer, error: crate::Error) {
        self.fail_peer(peer, error);
    }

    /// Stops every thread and connection. Idempotent.
    fn shutdown(&self);
}
