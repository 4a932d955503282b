//! The goodbye a closing engine says: every connection a peer watches this engine's life
//! on (a control connection's heartbeats, a same-host peer's shm connection) is told
//! before the engine lets go of it, so that the peer reports the loss as `closed` and not
//! as a crash. `close` starts it and waits, bounded, until each such connection said it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// The goodbye of one engine, shared by the connections that owe it.
#[derive(Debug, Default)]
pub(crate) struct Farewell {
    begun: CancellationToken,
    /// Connections served now that will say goodbye when it begins.
    owed: AtomicUsize,
}

/// One connection's goodbye, owed until it drops.
#[derive(Debug)]
pub(crate) struct Owed(Arc<Farewell>);

impl Drop for Owed {
    fn drop(&mut self) {
        self.0.owed.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Farewell {
    /// A connection that will say goodbye: it waits on [`Farewell::begun`], says it, and
    /// drops the guard.
    pub(crate) fn owe(self: &Arc<Self>) -> Owed {
        self.owed.fetch_add(1, Ordering::AcqRel);
        Owed(self.clone())
    }

    /// Fires when the engine begins to close.
    pub(crate) fn begun(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.begun.cancelled()
    }

    /// Begins the goodbye and waits until every connection owing one has said it, at most
    /// `bound`; returns whether they all did. Blocks the calling thread (not a runtime's).
    pub(crate) fn say(&self, bound: Duration) -> bool {
        self.begun.cancel();
        let deadline = Instant::now() + bound;
        while self.owed.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn say_waits_for_every_owed_goodbye_and_no_longer_than_its_bound() {
        let f = Arc::new(Farewell::default());
        assert!(f.say(Duration::ZERO), "nothing owed: said at once");
        let f = Arc::new(Farewell::default());
        let owed = f.owe();
        let started = Instant::now();
        assert!(
            !f.say(Duration::from_millis(20)),
            "an owed goodbye never said"
        );
        assert!(started.elapsed() >= Duration::from_millis(20));
        let f2 = f.clone();
        let sayer = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            rt.block_on(f2.begun());
            drop(owed);
        });
        assert!(f.say(Duration::from_secs(20)));
        sayer.join().expect("sayer");
    }
}
