//! The completion thread: polls every endpoint's completion queue, reports slices, posts
//! backlogs, and resets endpoints whose oldest slice passed the deadline (`stuck_after`).
//!
//! Waiting adapts to load: while slices are outstanding it spins briefly, then yields,
//! then sleeps in growing steps (up to 1 ms); with nothing outstanding it parks until a
//! submit wakes it. It never spins at 100 % on an idle engine — on a 2-core machine that
//! would starve the very threads it waits for.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::Error;

use super::endpoint::Endpoint;
use super::peer_link::PeerLink;
use super::Shared;
use crate::provider::{WcStatus, WorkCompletion};

const SPINS: u32 = 64;
const YIELDS: u32 = 64;
const MAX_SLEEP: Duration = Duration::from_millis(1);
const IDLE_PARK: Duration = Duration::from_millis(100);
const SWEEP_EVERY: Duration = Duration::from_millis(10);
const ORPHANS_EVERY: Duration = Duration::from_secs(1);

pub(crate) fn run(shared: Arc<Shared>) {
    let mut wcs = [WorkCompletion::default(); 32];
    let mut endpoints: Vec<(Arc<PeerLink>, Arc<Endpoint>)> = Vec::new();
    let mut seen = u64::MAX;
    let mut idle = 0u32;
    let mut last_sweep = Instant::now();
    let mut last_orphans = Instant::now();
    while !shared.stopping.load(Ordering::Acquire) {
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != seen {
            seen = generation;
            endpoints = collect(&shared);
        }
        let mut busy = false;
        for (link, ep) in &endpoints {
            if ep.is_broken() {
                continue;
            }
            match ep.cq.poll(&mut wcs) {
                Ok(n) => {
                    busy |= n > 0;
                    for wc in &wcs[..n] {
                        on_completion(&shared, link, ep, wc);
                    }
                }
                Err(e) => {
                    let why = format!("completion queue failed: {e}");
                    shared.reset_endpoint(link, ep, &why, || Error::Io(format!("rdma: {why}")));
                    continue;
                }
            }
            if let Err(e) = ep.pump() {
                let why = format!("post_send failed: {e}");
                shared.reset_endpoint(link, ep, &why, || Error::Io(format!("rdma: {why}")));
            }
        }
        let now = Instant::now();
        if now.duration_since(last_sweep) >= SWEEP_EVERY {
            last_sweep = now;
            sweep(&shared, &endpoints, now);
        }
        if now.duration_since(last_orphans) >= ORPHANS_EVERY {
            last_orphans = now;
            shared.release_orphans(now);
        }
        if busy {
            idle = 0;
            continue;
        }
        if endpoints.iter().all(|(_, ep)| ep.outstanding() == 0) {
            idle = 0;
            std::thread::park_timeout(IDLE_PARK);
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < SPINS {
            std::hint::spin_loop();
        } else if idle < SPINS + YIELDS {
            std::thread::yield_now();
        } else {
            let step = (idle - SPINS - YIELDS).min(6);
            std::thread::park_timeout(Duration::from_micros(16u64 << step).min(MAX_SLEEP));
        }
    }
}

fn collect(shared: &Shared) -> Vec<(Arc<PeerLink>, Arc<Endpoint>)> {
    let peers = shared.peers.read().unwrap_or_else(|p| p.into_inner());
    peers
        .values()
        .flat_map(|link| {
            link.endpoints
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|ep| (link.clone(), ep.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn on_completion(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    ep: &Arc<Endpoint>,
    wc: &WorkCompletion,
) {
    let slot = ep.complete(wc.wr_id);
    if wc.status == WcStatus::Success {
        if let Some(slot) = slot {
            slot.task.slice_done(slot.attempt, u64::from(slot.bytes));
            // A verified attempt completes with its check, after every work request.
            if let Some(check) = slot.check.as_ref().filter(|c| c.landed()) {
                shared.start_check(link, slot.task.clone(), slot.attempt, check);
            }
        }
        return;
    }
    let peer = link.peer.name().to_string();
    let error = completion_error(wc.status, &peer);
    let why = format!("{} on queue pair {}", wc.status.name(), wc.qp_num);
    if let Some(slot) = slot {
        slot.task.attempt_failed(slot.attempt, error);
    }
    shared.reset_endpoint(link, ep, &why, || {
        Error::Io(format!("rdma: endpoint to {peer} reset after {why}"))
    });
}

/// The error a failed work completion gives its task.
pub(crate) fn completion_error(status: WcStatus, peer: &str) -> Error {
    match status {
        WcStatus::RemAccessErr => Error::RemoteRejected(format!(
            "rdma {}: {peer} refused the access (bad rkey, bounds or permission)",
            status.name()
        )),
        WcStatus::RetryExcErr => Error::Io(format!(
            "rdma {}: {peer} did not acknowledge (transport retries exhausted)",
            status.name()
        )),
        other => Error::Io(format!("rdma {} towards {peer}", other.name())),
    }
}

/// How long a posted slice may go without completing before its endpoint counts as stuck:
/// the slice deadline, or the attempt deadline if that is shorter. Attempts are timed from
/// when their slices are posted, so the backlog behind an endpoint runs no clock of its
/// own; this is what bounds its wait when the peer stops completing.
pub(crate) fn stuck_after(slice_timeout: Duration, attempt_timeout: Option<Duration>) -> Duration {
    attempt_timeout.map_or(slice_timeout, |a| a.min(slice_timeout))
}

fn sweep(shared: &Arc<Shared>, endpoints: &[(Arc<PeerLink>, Arc<Endpoint>)], now: Instant) {
    let limit = stuck_after(shared.config.slice_timeout, shared.attempt_timeout);
    for (link, ep) in endpoints {
        let Some(oldest) = ep.oldest() else { continue };
        if now.duration_since(oldest) > limit {
            let why = format!("a slice passed its {} ms deadline", limit.as_millis());
            // The late slice, and all behind it, end TIMEOUT; the engine fails them over.
            shared.reset_endpoint(link, ep, &why, || Error::Timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_stuck_after_the_shorter_of_the_two_deadlines() {
        let ms = Duration::from_millis;
        assert_eq!(stuck_after(ms(5000), None), ms(5000));
        assert_eq!(stuck_after(ms(5000), Some(ms(1000))), ms(1000));
        assert_eq!(stuck_after(ms(300), Some(ms(1000))), ms(300));
    }

    #[test]
    fn completion_errors_fail_over_and_name_the_status() {
        let e = completion_error(WcStatus::RemAccessErr, "h:1");
        assert_eq!(e.code(), "ERR_FERRY_REMOTE_REJECTED");
        assert!(e.to_string().contains("IBV_WC_REM_ACCESS_ERR"));
        let e = completion_error(WcStatus::RetryExcErr, "h:1");
        assert!(e.to_string().contains("IBV_WC_RETRY_EXC_ERR"));
        assert_eq!(e.status(), ferry_core::TransferStatus::Failed);
    }
}
