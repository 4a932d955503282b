//! Linux primitives for same-host memory (the shared-memory transport and regions):
//!
//! - [`send_fds`] / [`recv_fds`] (and the tokio forms [`send_fds_async`] /
//!   [`recv_fds_async`]) pass descriptors over a unix stream socket with `SCM_RIGHTS`;
//! - [`peer_pid`] names the process at the other end of such a socket;
//! - [`Pidfd`] watches that process, so a dead target is noticed even though its memory
//!   stays mapped here;
//! - [`RemoteMapping`] maps a peer's memfd after checking that the file really is as long as
//!   the peer claims, and copies in and out of it with bounds checks;
//! - [`map_shared`] maps a memfd (ours or a peer's) at a placement of its own, so that two
//!   mappings made in turn never lie a multiple of [`ALIAS_SPAN`] apart.
//!
//! Thread safety: every type here is `Send + Sync`; the functions take shared references.
//! Resources: received descriptors are `OwnedFd`s from the moment they arrive, so none is
//! leaked on any error path; a `Pidfd` closes its descriptor and a `RemoteMapping` unmaps
//! and closes on drop.
//!
//! Each concern is a submodule of its own, with the `unsafe` it needs; the module comment of
//! each says what contract that `unsafe` relies on.
#![cfg(target_os = "linux")]

mod fd_passing;
mod invalid;
mod peer;
mod placement;
mod remote_mapping;
#[cfg(test)]
mod test_support;

pub use fd_passing::{recv_fds, recv_fds_async, send_fds, send_fds_async, MAX_FDS_PER_MESSAGE};
pub use peer::{peer_pid, peer_uid, Pidfd};
pub use placement::{map_shared, ALIAS_SPAN};
pub use remote_mapping::{RangeError, RemoteMapping, POPULATE_LIMIT};
