//! Calls that an AbortSignal ends early, on the binding's side. The TypeScript layer names
//! such a call by an id it picks (one per call of its engine) and, when the signal fires,
//! rejects the call's Promise with the `AbortError` at once and asks `abort` here: the
//! call's future is dropped, so what it was doing (connecting to a peer, its handshake)
//! stops, and its Promise settles with a default value that nobody reads, releasing the
//! event loop. Decides nothing about what an abort means for the call itself.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// The calls of one engine that an abort may still end, by id.
#[derive(Default)]
pub(crate) struct Aborts {
    armed: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl Aborts {
    fn armed(&self) -> MutexGuard<'_, HashMap<u64, oneshot::Sender<()>>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Call `id` may be aborted from now until it ends (the `Armed` is dropped).
    pub(crate) fn arm(self: &Arc<Self>, id: u64) -> Armed {
        let (tx, rx) = oneshot::channel();
        self.armed().insert(id, tx);
        Armed {
            aborts: self.clone(),
            id,
            aborted: rx,
        }
    }

    /// Aborts call `id`; false when it already ended (or was never armed).
    pub(crate) fn abort(&self, id: u64) -> bool {
        let tx = self.armed().remove(&id);
        tx.is_some_and(|tx| tx.send(()).is_ok())
    }
}

/// One call that may be aborted.
pub(crate) struct Armed {
    aborts: Arc<Aborts>,
    id: u64,
    aborted: oneshot::Receiver<()>,
}

impl Armed {
    /// `work`'s output, or `None` as soon as the call is aborted (`work` is dropped then).
    pub(crate) async fn run<F: Future>(mut self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            Ok(()) = &mut self.aborted => None,
            out = work => Some(out),
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        self.aborts.armed().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    #[test]
    fn an_aborted_call_ends_at_once_and_is_forgotten() {
        let aborts = Arc::new(Aborts::default());
        let armed = aborts.arm(7);
        assert!(aborts.abort(7));
        assert_eq!(block_on(armed.run(std::future::pending::<()>())), None);
        assert!(aborts.armed().is_empty());
        assert!(!aborts.abort(7), "aborted once");
    }

    #[test]
    fn a_call_that_ended_cannot_be_aborted_and_leaves_nothing() {
        let aborts = Arc::new(Aborts::default());
        let armed = aborts.arm(1);
        assert_eq!(block_on(armed.run(async { 5 })), Some(5));
        assert!(aborts.armed().is_empty());
        assert!(!aborts.abort(1));
    }

    #[test]
    fn aborting_one_call_leaves_the_others() {
        let aborts = Arc::new(Aborts::default());
        let first = aborts.arm(1);
        let second = aborts.arm(2);
        assert!(aborts.abort(2));
        assert_eq!(block_on(second.run(std::future::pending::<()>())), None);
        assert_eq!(block_on(first.run(async { "done" })), Some("done"));
    }
}
