//! Helpers shared by the bench crate's integration tests.

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on its own thread and fails the test if it does not return within `limit`.
pub fn within<R: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(_) => panic!("{what} did not return within {limit:?}"),
    }
}
