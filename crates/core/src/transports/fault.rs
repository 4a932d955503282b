//! The fault transport: a decorator over any transport for tests and failover benchmarks.
//! It can fail submissions (at a rate, or after N), report completed attempts as failed,
//! delay submissions, and fail to install. Its random choices come from a seeded generator,
//! so a test run is reproducible.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;

pub use crate::config::fault::FaultSpec;
use crate::deadlines::Deadlines;
pub use crate::error::{is_injected, INJECTED};
use crate::error::{Error, Result};
use crate::kind::TransportKind;
use crate::memory::{Region, RegionId};
use crate::segment::Peer;
use crate::task::Task;
use crate::transport::{Attempt, BoxFuture, Transport, TransportContext, TransportFactory};

/// SplitMix64: tiny, seedable, and good enough to draw fault decisions.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Builds `inner`'s transport wrapped with fault injection.
#[derive(Debug)]
pub struct FaultFactory {
    /// The transport to wrap.
    pub inner: Arc<dyn TransportFactory>,
    /// What to inject.
    pub spec: FaultSpec,
}

impl TransportFactory for FaultFactory {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    fn build(&self, context: TransportContext) -> Result<Arc<dyn Transport>> {
        let handle = context.handle.clone();
        let deadlines = context.deadlines.clone();
        let inner = self.inner.build(context)?;
        let mut fault = FaultTransport::new(inner, self.spec.clone(), handle);
        fault.deadlines = deadlines;
        Ok(Arc::new(fault))
    }
}

/// A transport wrapped with fault injection.
pub struct FaultTransport {
    inner: Arc<dyn Transport>,
    spec: FaultSpec,
    rng: Mutex<Rng>,
    submits: AtomicU64,
    rt: Handle,
    /// The engine's attempt deadlines (`None`: none), for the attempts a delay hands to a
    /// transport that times them from their start.
    deadlines: Option<Arc<Deadlines<Task>>>,
    /// Attempts an injected delay still holds, by a number of their own: a peer lost
    /// meanwhile fails them at once (`fail_peer`), as the real transport fails what it
    /// holds towards a lost peer, instead of when the delay ends.
    delayed: Arc<Mutex<HashMap<u64, Attempt>>>,
    next_delayed: AtomicU64,
}

impl FaultTransport {
    /// Wraps `inner`; delayed submissions run on `rt`.
    pub fn new(inner: Arc<dyn Transport>, spec: FaultSpec, rt: Handle) -> Self {
        let seed = spec.seed;
        Self {
            inner,
            spec,
            rng: Mutex::new(Rng(seed)),
            submits: AtomicU64::new(0),
            rt,
            deadlines: None,
            delayed: Arc::default(),
            next_delayed: AtomicU64::new(0),
        }
    }

    /// Holds `attempts` for the delay; returns the numbers to take them back by.
    fn hold(&self, attempts: Vec<Attempt>) -> Vec<u64> {
        let mut delayed = self.delayed.lock().unwrap_or_else(|p| p.into_inner());
        attempts
            .into_iter()
            .map(|a| {
                let id = self.next_delayed.fetch_add(1, Ordering::Relaxed);
                delayed.insert(id, a);
                id
            })
            .collect()
    }

    fn draw(&self, rate: f64) -> bool {
        rate > 0.0
            && self
                .rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .next_f64()
                < rate
    }

    fn injected(what: &str, kind: TransportKind) -> Error {
        Error::injected(format_args!("{what} on {}", kind.name()))
    }
}

impl Transport for FaultTransport {
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    fn install(&self) -> Result<()> {
        if self.spec.fail_install {
            return Err(Error::TransportUnavailable(format!(
                "fault injection: {} failed to install",
                self.kind().name()
            )));
        }
        self.inner.install()
    }

    /// As the decorated transport, unless a delay is injected: that delay stands for a
    /// peer slow to answer, so the deadline runs through it, from submission. Once the
    /// delay is over, an attempt handed to a transport that reports starts is timed from
    /// its start there: the delay counts, the queue behind it does not.
    fn reports_starts(&self) -> bool {
        self.spec.delay.is_none() && self.inner.reports_starts()
    }

    fn submit(&self, attempts: &[Attempt]) -> Vec<Result<()>> {
        let kind = self.kind();
        let mut results: Vec<Option<Result<()>>> = vec![None; attempts.len()];
        let mut forward = Vec::with_capacity(attempts.len());
        let mut forward_index = Vec::with_capacity(attempts.len());
        for (i, a) in attempts.iter().enumerate() {
            let n = self.submits.fetch_add(1, Ordering::Relaxed) + 1;
            let over = self.spec.fail_after_submits.is_some_and(|limit| n > limit);
            if over || self.draw(self.spec.submit_failure_rate) {
                results[i] = Some(Err(Self::injected("submit failed", kind)));
                continue;
            }
            if self.draw(self.spec.corrupt_completion_rate) {
                a.task.corrupt_completion_of(a.attempt);
            }
            forward.push(a.clone());
            forward_index.push(i);
        }
        match self.spec.delay {
            Some(delay) if !forward.is_empty() => {
                let inner = self.inner.clone();
                let requeued = self.deadlines.clone().filter(|_| inner.reports_starts());
                let (held, ids) = (self.delayed.clone(), self.hold(forward));
                self.rt.spawn(async move {
                    tokio::time::sleep(delay).await;
                    // Those whose peer was lost meanwhile have been failed already.
                    let forward: Vec<Attempt> = {
                        let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                        ids.iter().filter_map(|id| held.remove(id)).collect()
                    };
                    if forward.is_empty() {
                        return;
                    }
                    if let Some(deadlines) = &requeued {
                        for a in &forward {
                            a.task.time_from_start(a.attempt, deadlines);
                        }
                    }
                    for (a, r) in forward.iter().zip(inner.submit(&forward)) {
                        if let Err(e) = r {
                            a.task.attempt_failed(a.attempt, e);
                        }
                    }
                });
                for i in forward_index {
                    results[i] = Some(Ok(()));
                }
            }
            _ => {
                for (i, r) in forward_index.into_iter().zip(self.inner.submit(&forward)) {
                    results[i] = Some(r);
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Io("fault layer lost a result".into()))))
            .collect()
    }

    fn fail_peer(&self, peer: &Peer, error: Error) {
        let towards_peer: Vec<Attempt> = {
            let mut held = self.delayed.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<u64> = held
                .iter()
                .filter(|(_, a)| a.task.request().peer.handle() == peer.handle())
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        for a in towards_peer {
            a.task.attempt_failed(a.attempt, error.clone());
        }
        self.inner.fail_peer(peer, error)
    }

    fn forget_peer(&self, peer: &Peer, error: Error) {
        self.inner.forget_peer(peer, error)
    }

    fn shutdown(&self) {
        self.inner.shutdown()
    }

    fn reachable(&self, peer: &Peer) -> std::result::Result<(), String> {
        self.inner.reachable(peer)
    }

    fn attach(&self, peer: &Arc<Peer>) -> Option<BoxFuture<Result<()>>> {
        self.inner.attach(peer)
    }

    fn setup_limit(&self, peer: &Peer) -> Option<String> {
        self.inner.setup_limit(peer)
    }

    fn region_added(&self, region: &Arc<Region>) -> Result<()> {
        self.inner.region_added(region)
    }

    fn region_released(&self, id: RegionId) {
        self.inner.region_released(id)
    }

    fn serves(&self, region: &Region) -> bool {
        self.inner.serves(region)
    }

    fn describe(&self) -> Option<serde_json::Value> {
        self.inner.describe()
    }

    fn spread(&self) -> crate::transport::TransportSpread {
        self.inner.spread()
    }

    fn describe_buffer(&self, region: &Region) -> Option<serde_json::Value> {
        self.inner.describe_buffer(region)
    }

    fn control(&self, request: &[u8]) -> Result<Vec<u8>> {
        self.inner.control(request)
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn rng_is_seeded_and_uniform_enough() {
        let mut a = Rng(7);
        let mut b = Rng(7);
        let xs: Vec<f64> = (0..1000).map(|_| a.next_f64()).collect();
        let ys: Vec<f64> = (0..1000).map(|_| b.next_f64()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let below = xs.iter().filter(|x| **x < 0.1).count();
        assert!((60..140).contains(&below), "{below}");
    }
}
