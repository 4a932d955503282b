//! A count of things in progress that `close` waits for, with a bound (the futures
//! started with `Engine::spawn`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A count of things in progress that `close` waits for, with a bound.
#[derive(Default)]
pub(crate) struct Pending {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Pending {
    pub(crate) fn enter(self: &Arc<Self>) -> PendingGuard {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        PendingGuard(self.clone())
    }

    /// Waits until nothing is pending or `bound` has passed; returns whether it is idle.
    pub(crate) fn wait_idle(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *count > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = self
                .idle
                .wait_timeout(count, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

pub(crate) struct PendingGuard(Arc<Pending>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().unwrap_or_else(|p| p.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.0.idle.notify_all();
        }
    }
}
