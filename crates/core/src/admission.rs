//! Who may hold a connection to this engine: caps on connections per peer address and in
//! total (excess refused at once), the counters of refusals and failed handshakes, and a
//! rate-limited log line per refusal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth::Failure;

/// Connection caps (`maxConnections`, `maxConnectionsPerAddress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once, every peer together (control, data and shm sockets).
    pub total: usize,
    /// Connections open at once from one peer address.
    pub per_address: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            total: 4096,
            per_address: 1024,
        }
    }
}

/// Why a connection was refused before its handshake: the `reason` label of
/// `ferry_connections_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `maxConnections` reached.
    Total,
    /// `maxConnectionsPerAddress` reached.
    PerAddress,
}

impl Refusal {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Total => "total",
            Refusal::PerAddress => "per_address",
        }
    }
}

/// The least time between two refusal log lines; the ones in between are counted in the
/// next line.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Connection accounting shared by the listener and the shm socket.
#[derive(Debug)]
pub(crate) struct Admission {
    limits: ConnLimits,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    refused: [AtomicU64; 2],
    auth_failures: [AtomicU64; Failure::ALL.len()],
    log: Mutex<(Option<Instant>, u64)>,
}

/// A counted connection; dropping it frees its place.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    addr: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.admission.open);
        open.0 = open.0.saturating_sub(1);
        if let Some(a) = self.addr {
            if let Some(n) = open.1.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    open.1.remove(&a);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    pub(crate) fn new(limits: ConnLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::new((0, HashMap::new())),
            refused: Default::default(),
            auth_failures: Default::default(),
            log: Mutex::new((None, 0)),
        })
    }

    /// Counts a new connection from `addr` (`None`: a local unix peer, counted in the
    /// total only), or refuses it.
    pub(crate) fn enter(self: &Arc<Self>, addr: Option<IpAddr>) -> Result<Slot, Refusal> {
        let refused = {
            let mut open = lock(&self.open);
            let from_addr = addr.map(|a| open.1.get(&a).copied().unwrap_or(0));
            if open.0 >= self.limits.total {
                Some(Refusal::Total)
            } else if from_addr.is_some_and(|n| n >= self.limits.per_address) {
                Some(Refusal::PerAddress)
            } else {
                open.0 += 1;
                if let Some(a) = addr {
                    *open.1.entry(a).or_insert(0) += 1;
                }
                None
            }
        };
        match refused {
            None => Ok(Slot {
                admission: self.clone(),
                addr,
            }),
            Some(r) => {
                self.refused[r as usize].fetch_add(1, Ordering::Relaxed);
                self.log_refusal(&format!("{} connection cap reached", r.label()), addr);
                Err(r)
            }
        }
    }

    /// Which cap `refusal` met, and its value: what a refused peer is told.
    pub(crate) fn describe(&self, refusal: Refusal) -> String {
        match refusal {
            Refusal::Total => format!(
                "connection cap: the target's maxConnections ({}) reached",
                self.limits.total
            ),
            Refusal::PerAddress => format!(
                "connection cap: the target's maxConnectionsPerAddress ({}) reached",
                self.limits.per_address
            ),
        }
    }

    /// Counts a failed handshake and logs it (rate-limited).
    pub(crate) fn auth_failed(&self, why: Failure, addr: Option<IpAddr>) {
        let i = Failure::ALL.iter().position(|f| *f == why).unwrap_or(0);
        self.auth_failures[i].fetch_add(1, Ordering::Relaxed);
        self.log_refusal(&format!("handshake failed: {}", why.label()), addr);
    }

    /// Refused connections by reason, every reason (zeros too).
    pub(crate) fn refused(&self) -> Vec<(&'static str, u64)> {
        [Refusal::Total, Refusal::PerAddress]
            .iter()
            .map(|r| (r.label(), self.refused[*r as usize].load(Ordering::Relaxed)))
            .collect()
    }

    /// Failed handshakes by reason, every reason (zeros too).
    pub(crate) fn auth_failures(&self) -> Vec<(&'static str, u64)> {
        Failure::ALL
            .iter()
            .zip(&self.auth_failures)
            .map(|(f, n)| (f.label(), n.load(Ordering::Relaxed)))
            .collect()
    }

    fn log_refusal(&self, what: &str, addr: Option<IpAddr>) {
        let mut log = lock(&self.log);
        let now = Instant::now();
        if log.0.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            log.1 += 1;
            return;
        }
        let suppressed = std::mem::take(&mut log.1);
        log.0 = Some(now);
        let from = addr.map_or_else(|| "a local process".to_string(), |a| a.to_string());
        tracing::warn!(%from, suppressed, "refused a connection: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_address_and_total_refuse_excess_and_free_on_drop() {
        let a = Admission::new(ConnLimits {
            total: 3,
            per_address: 2,
        });
        let x: IpAddr = [10, 0, 0, 1].into();
        let y: IpAddr = [10, 0, 0, 2].into();
        let s1 = a.enter(Some(x)).expect("1st");
        let _s2 = a.enter(Some(x)).expect("2nd");
        assert_eq!(a.enter(Some(x)).err(), Some(Refusal::PerAddress));
        let _s3 = a.enter(Some(y)).expect("other address");
        assert_eq!(a.enter(None).err(), Some(Refusal::Total));
        drop(s1);
        let _s4 = a.enter(Some(x)).expect("freed");
        assert_eq!(a.refused(), vec![("total", 1), ("per_address", 1)]);
        assert!(a
            .describe(Refusal::PerAddress)
            .contains("maxConnectionsPerAddress (2)"));
        assert!(a.describe(Refusal::Total).contains("maxConnections (3)"));
    }

    #[test]
    fn auth_failures_are_counted_by_reason() {
        let a = Admission::new(ConnLimits::default());
        a.auth_failed(Failure::BadProof, None);
        a.auth_failed(Failure::BadProof, None);
        a.auth_failed(Failure::Uid, None);
        let f = a.auth_failures();
        assert!(f.contains(&("bad_proof", 2)));
        assert!(f.contains(&("uid", 1)));
        assert!(f.contains(&("no_secret", 0)));
    }
}
