//! Bounded waits: a test that hangs fails instead.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferry_core::{Engine, TaskSnapshot};

/// Runs `f` on its own thread and fails the test if it does not return within `limit`. A
/// panic in `f` (a failed assertion) is passed on as it is.
pub fn within<R: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    let body = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Disconnected) => match body.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what} ended without a result"),
        },
        // The body's thread is left behind: it cannot be stopped, and the test fails now.
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not return within {limit:?}"),
    }
}

/// Polls a batch until it is terminal (panics after `bound`); its tasks' snapshots.
pub fn wait_batch(engine: &Engine, batch: u64, bound: Duration) -> Vec<TaskSnapshot> {
    let deadline = Instant::now() + bound;
    loop {
        let s = engine.batch_status(batch).expect("status");
        if s.status.is_terminal() {
            return engine.transfer_status_list(batch).expect("list");
        }
        assert!(Instant::now() < deadline, "batch never ended");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The snapshot of a one-request transfer.
pub fn one(snaps: Vec<TaskSnapshot>) -> TaskSnapshot {
    snaps.into_iter().next().expect("one task")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_returns_the_result() {
        assert_eq!(within(Duration::from_secs(5), "sum", || 2 + 2), 4);
    }

    #[test]
    #[should_panic(expected = "the body's own message")]
    fn within_passes_a_panic_on() {
        within(Duration::from_secs(5), "body", || {
            panic!("the body's own message")
        })
    }

    #[test]
    #[should_panic(expected = "slow did not return within")]
    fn within_fails_a_body_past_its_limit() {
        let (_keep, rx) = mpsc::channel::<()>();
        within(Duration::from_millis(50), "slow", move || {
            // Bounded, so the thread left behind ends too.
            let _ = rx.recv_timeout(Duration::from_secs(5));
        })
    }
}
