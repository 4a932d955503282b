//! The copy threads and their job queue: split copies (`shared_copy::Shared`) are offered
//! on the queue, once per copy thread asked to help, and each copy thread that takes one
//! copies jobs from its back end until none is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::shared_copy::Shared;
use crate::error::{Error, Result};

/// How long a copy thread that just finished a job keeps looking for the next before it
/// sleeps. Waking a sleeping thread costs tens of microseconds on a VM (more than
/// copying 64 KiB): a stream of calls, each shared with the copy threads, finds them
/// still awake.
const COPY_THREAD_SPIN: Duration = Duration::from_micros(100);

/// The copy threads of one transport.
pub(super) struct CopyThreads {
    /// Where split copies are offered to the copy threads; `None` once stopped.
    jobs: Mutex<Option<mpsc::Sender<Arc<Shared>>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Copy threads looking for a copy now (not sleeping, not copying): what a copy too
    /// small to repay waking one may be shared with (`CopyPolicy::inline_after_all`).
    awake: Arc<AtomicUsize>,
}

impl CopyThreads {
    /// Starts `count` copy threads.
    pub(super) fn start(count: usize) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Arc<Shared>>();
        let rx = Arc::new(Mutex::new(rx));
        let awake = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for i in 0..count {
            let (rx, looking) = (rx.clone(), awake.clone());
            let handle = std::thread::Builder::new()
                .name(format!("ferry-shm-copy-{i}"))
                .spawn(move || {
                    // Until the transport shuts down.
                    while let Ok(shared) = next_shared(&rx, &looking, COPY_THREAD_SPIN) {
                        shared.copy_back();
                    }
                })
                .map_err(|e| Error::thread("an shm copy thread", &e))?;
            threads.push(handle);
        }
        Ok(Self {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
            awake,
        })
    }

    /// How many copy threads look for a copy now: they take one at once, with no wake-up.
    pub(super) fn awake(&self) -> usize {
        self.awake.load(Ordering::Relaxed)
    }

    /// Runs `shared`'s jobs on `helpers` copy threads (those that come in time) and on
    /// this thread, which copies up to `own_bytes` of it (`Shared::copy_front`).
    pub(super) fn share(&self, shared: Shared, own_bytes: u64, helpers: usize) -> Result<()> {
        let shared = Arc::new(shared);
        {
            let queue = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let Some(tx) = queue.as_ref() else {
                return Err(Error::Closed);
            };
            shared.expect_outcome();
            for _ in 0..helpers {
                if tx.send(shared.clone()).is_err() {
                    break;
                }
            }
        }
        shared.copy_front(own_bytes);
        Ok(())
    }

    /// Closes the queue, which ends the copy threads once they finish their current job,
    /// and waits for them (unless called on one of them).
    pub(super) fn stop(&self) {
        drop(self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take());
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The next shared copy for a copy thread: looked for during `spin` (counted in `awake`
/// meanwhile), then waited for. An error once the transport shut down.
///
/// One copy thread at a time looks, holding the queue's lock; the lock is let go before
/// the copy is returned, so that another copy thread takes the next copy (or the next
/// helper's turn at this one) while this one copies. Held through the copy, it would
/// leave one copy thread copying at a time, however many a copy asked to help.
fn next_shared<T>(
    queue: &Mutex<mpsc::Receiver<T>>,
    awake: &AtomicUsize,
    spin: Duration,
) -> std::result::Result<T, mpsc::RecvError> {
    let rx = queue.lock().unwrap_or_else(|p| p.into_inner());
    awake.fetch_add(1, Ordering::Relaxed);
    let looked = look(&rx, spin);
    awake.fetch_sub(1, Ordering::Relaxed);
    match looked {
        Some(found) => found,
        None => rx.recv(),
    }
}

/// Looks at `rx` for `spin`: what it found (a copy, or the transport shut down), `None`
/// if nothing came.
fn look<T>(
    rx: &mpsc::Receiver<T>,
    spin: Duration,
) -> Option<std::result::Result<T, mpsc::RecvError>> {
    let until = std::time::Instant::now() + spin;
    // The clock is read every few tries only: a look at the queue costs a few
    // nanoseconds, a clock read several times that, and the sooner a copy is seen the
    // more of it this thread takes.
    let mut tries = 0u32;
    loop {
        match rx.try_recv() {
            Ok(m) => return Some(Ok(m)),
            Err(mpsc::TryRecvError::Disconnected) => return Some(Err(mpsc::RecvError)),
            Err(mpsc::TryRecvError::Empty) => {
                tries = tries.wrapping_add(1);
                if tries % 64 == 0 && std::time::Instant::now() >= until {
                    return None;
                }
                std::hint::spin_loop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_thread_lets_go_of_the_queue_while_it_copies() {
        ferry_testkit::within(Duration::from_secs(10), "copy threads' queue", || {
            let (tx, rx) = mpsc::channel::<u32>();
            let queue = Arc::new(Mutex::new(rx));
            tx.send(1).expect("send");
            tx.send(2).expect("send");
            // This thread took a copy and is still copying it: another copy thread takes
            // the next one meanwhile.
            let awake = Arc::new(AtomicUsize::new(0));
            let taken = next_shared(&queue, &awake, COPY_THREAD_SPIN).expect("first");
            let other = {
                let (queue, awake) = (queue.clone(), awake.clone());
                std::thread::spawn(move || next_shared(&queue, &awake, COPY_THREAD_SPIN))
            };
            assert_eq!(other.join().expect("join").expect("second"), 2);
            assert_eq!(taken, 1);
            // Shut down: a waiting copy thread hears it.
            drop(tx);
            assert!(next_shared(&queue, &awake, COPY_THREAD_SPIN).is_err());
        });
    }

    #[test]
    fn a_copy_thread_counts_as_awake_only_while_it_looks() {
        ferry_testkit::within(Duration::from_secs(20), "copy threads awake", || {
            let (tx, rx) = mpsc::channel::<u32>();
            let queue = Arc::new(Mutex::new(rx));
            let awake = Arc::new(AtomicUsize::new(0));
            // Looking for longer than the test: awake until a copy comes.
            let looking = {
                let (queue, awake) = (queue.clone(), awake.clone());
                std::thread::spawn(move || next_shared(&queue, &awake, Duration::from_secs(60)))
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while awake.load(Ordering::Relaxed) == 0 {
                assert!(std::time::Instant::now() < deadline, "never looked");
                std::thread::yield_now();
            }
            assert_eq!(awake.load(Ordering::Relaxed), 1);
            tx.send(7).expect("send");
            assert_eq!(looking.join().expect("join").expect("found"), 7);
            assert_eq!(
                awake.load(Ordering::Relaxed),
                0,
                "took it: copying, not looking"
            );
            // No spin: it sleeps at once, and does not count while it sleeps.
            let sleeping = {
                let (queue, awake) = (queue.clone(), awake.clone());
                std::thread::spawn(move || next_shared(&queue, &awake, Duration::ZERO))
            };
            tx.send(8).expect("send");
            assert_eq!(sleeping.join().expect("join").expect("found"), 8);
            assert_eq!(awake.load(Ordering::Relaxed), 0);
        });
    }
}
