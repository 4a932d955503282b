//! The error the other files give an argument the caller (or a peer) got wrong. A leaf of
//! its own so that they need nothing from `linux/mod.rs`, which re-exports them.

use std::io;

/// An `InvalidInput` error for an argument the caller (or a peer) got wrong.
pub(super) fn invalid_input(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}
