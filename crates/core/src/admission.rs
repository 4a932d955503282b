//! Who may hold a connection to this engine. A connection first waits in the handshake
//! budget (`handshakes`: small, per source address and in total, the oldest pushed out
//! when full), where it costs authenticated peers nothing; once it proved the secret it
//! counts against the caps on authenticated connections per peer address and in total
//! (excess refused at once, told why). Also the counters of refusals and failed handshakes,
//! and a rate-limited log line per refusal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::auth::Failure;
use crate::handshakes::{fitted_to_open_files, Handshakes};
use crate::wire::RejectCode;

/// Connection caps (`maxConnections`, `maxConnectionsPerAddress`) and the handshake
/// budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Authenticated connections open at once, every peer together (control, data and shm
    /// sockets).
    pub total: usize,
    /// Authenticated connections open at once from one peer address.
    pub per_address: usize,
    /// Connections in their handshake at once, every source together; past it a new one
    /// takes the place of the oldest of the source that holds the most.
    pub handshakes: usize,
    /// Connections in their handshake at once from one source address (local processes on
    /// the shm socket are one source); past it a new one takes the place of that source's
    /// oldest.
    pub handshakes_per_address: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            total: 4096,
            per_address: 1024,
            // A handshake costs a socket and a few KiB here: 1024 of them hold about 4 MiB
            // whatever their senders announce. 256 per address leaves room for the peers
            // of one host opening this engine all at once, and a peer's handshake is lost
            // only if 256 newer ones from its address arrive before it completes.
            handshakes: 1024,
            handshakes_per_address: 256,
        }
    }
}

/// Why a connection was refused or closed before it was let in: the `reason` label of
/// `ferry_connections_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `maxConnections` reached.
    Total,
    /// `maxConnectionsPerAddress` reached.
    PerAddress,
    /// Pushed out of a full handshake budget by a newer connection.
    Evicted,
}

impl Refusal {
    const ALL: [Refusal; 3] = [Refusal::Total, Refusal::PerAddress, Refusal::Evicted];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Total => "total",
            Refusal::PerAddress => "per_address",
            Refusal::Evicted => "evicted",
        }
    }

    /// The reject code a refused peer reads: a cap is a resource limit (its client fails
    /// with `ERR_FERRY_RESOURCE_LIMIT`, naming the cap); a handshake pushed out is refused.
    pub(crate) fn reject_code(self) -> RejectCode {
        match self {
            Refusal::Total | Refusal::PerAddress => RejectCode::ResourceLimit,
            Refusal::Evicted => RejectCode::Auth,
        }
    }

    /// What the peer is told, and the log says.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::Total => "connection cap reached (maxConnections)",
            Refusal::PerAddress => "connection cap reached (maxConnectionsPerAddress)",
            Refusal::Evicted => "handshake budget full: the oldest handshake was closed",
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
    open: Mutex<Open>,
    refused: [AtomicU64; Refusal::ALL.len()],
    auth_failures: [AtomicU64; Failure::ALL.len()],
    log: Mutex<(Option<Instant>, u64)>,
}

/// What is open now: authenticated connections (in total and by address) and handshakes,
/// each with the token that ends it when it is pushed out.
#[derive(Debug)]
struct Open {
    total: usize,
    by_addr: HashMap<IpAddr, usize>,
    handshakes: Handshakes<Option<IpAddr>, CancellationToken>,
}

/// A connection in its handshake, counted in the handshake budget until it is admitted
/// ([`Handshake::admit`]) or dropped.
pub(crate) struct Handshake {
    admission: Arc<Admission>,
    addr: Option<IpAddr>,
    id: u64,
    evicted: CancellationToken,
    counted: bool,
}

impl Handshake {
    /// Fires when a newer connection pushed this one out of the budget: its handshake
    /// should end at once.
    pub(crate) fn evicted(&self) -> CancellationToken {
        self.evicted.clone()
    }

    /// The peer proved the secret: it leaves the handshake budget and counts against the
    /// caps on authenticated connections, or is refused (counted) when they are reached or
    /// it was pushed out meanwhile.
    pub(crate) fn admit(mut self) -> Result<Slot, Refusal> {
        self.counted = false;
        self.admission.admit(self.addr, self.id)
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        if self.counted {
            lock(&self.admission.open)
                .handshakes
                .leave(&self.addr, self.id);
        }
    }
}

/// An admitted connection; dropping it frees its place.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    addr: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.admission.open);
        open.total = open.total.saturating_sub(1);
        if let Some(a) = self.addr {
            if let Some(n) = open.by_addr.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    open.by_addr.remove(&a);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    /// Admission under `limits`, its handshake budget fitted to `nofile`, the process's
    /// soft open-file limit (`handshakes::fitted_to_open_files`; `None`: unlimited).
    pub(crate) fn new(limits: ConnLimits, nofile: Option<u64>) -> Arc<Self> {
        let (handshakes, per_source) =
            fitted_to_open_files(limits.handshakes, limits.handshakes_per_address, nofile);
        let limits = ConnLimits {
            handshakes,
            handshakes_per_address: per_source,
            ..limits
        };
        Arc::new(Self {
            limits,
            open: Mutex::new(Open {
                total: 0,
                by_addr: HashMap::new(),
                handshakes: Handshakes::new(handshakes, per_source),
            }),
            refused: Default::default(),
            auth_failures: Default::default(),
            log: Mutex::new((None, 0)),
        })
    }

    /// Counts a new connection from `addr` (`None`: a local unix peer) in the handshake
    /// budget; never refuses it, but may push out (and end) an older handshake.
    pub(crate) fn start_handshake(self: &Arc<Self>, addr: Option<IpAddr>) -> Handshake {
        let evicted = CancellationToken::new();
        let entered = lock(&self.open).handshakes.enter(addr, evicted.clone());
        if let Some(oldest) = entered.evicted {
            oldest.cancel();
            self.count(Refusal::Evicted, addr);
        }
        Handshake {
            admission: self.clone(),
            addr,
            id: entered.id,
            evicted,
            counted: true,
        }
    }

    /// Moves handshake `id` into the authenticated connections, or refuses it.
    fn admit(self: &Arc<Self>, addr: Option<IpAddr>, id: u64) -> Result<Slot, Refusal> {
        let refused = {
            let mut open = lock(&self.open);
            if open.handshakes.leave(&addr, id).is_none() {
                // Pushed out just before: counted then.
                return Err(Refusal::Evicted);
            }
            let from_addr = addr.map(|a| open.by_addr.get(&a).copied().unwrap_or(0));
            if open.total >= self.limits.total {
                Some(Refusal::Total)
            } else if from_addr.is_some_and(|n| n >= self.limits.per_address) {
                Some(Refusal::PerAddress)
            } else {
                open.total += 1;
                if let Some(a) = addr {
                    *open.by_addr.entry(a).or_insert(0) += 1;
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
                self.count(r, addr);
                Err(r)
            }
        }
    }

    fn count(&self, r: Refusal, addr: Option<IpAddr>) {
        self.refused[r as usize].fetch_add(1, Ordering::Relaxed);
        self.log_refusal(r.reason(), addr);
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
            Refusal::Evicted => refusal.reason().to_string(),
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
        Refusal::ALL
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

    fn limits(total: usize, per_address: usize) -> ConnLimits {
        ConnLimits {
            total,
            per_address,
            handshakes: 4,
            handshakes_per_address: 2,
        }
    }

    #[test]
    fn caps_per_address_and_total_refuse_excess_and_free_on_drop() {
        let a = Admission::new(limits(3, 2), None);
        let x: IpAddr = [10, 0, 0, 1].into();
        let y: IpAddr = [10, 0, 0, 2].into();
        let s1 = a.start_handshake(Some(x)).admit().expect("1st");
        let _s2 = a.start_handshake(Some(x)).admit().expect("2nd");
        assert_eq!(
            a.start_handshake(Some(x)).admit().err(),
            Some(Refusal::PerAddress)
        );
        let _s3 = a.start_handshake(Some(y)).admit().expect("other address");
        assert_eq!(a.start_handshake(None).admit().err(), Some(Refusal::Total));
        drop(s1);
        let _s4 = a.start_handshake(Some(x)).admit().expect("freed");
        assert_eq!(
            a.refused(),
            vec![("total", 1), ("per_address", 1), ("evicted", 0)]
        );
        assert!(a
            .describe(Refusal::PerAddress)
            .contains("maxConnectionsPerAddress (2)"));
        assert!(a.describe(Refusal::Total).contains("maxConnections (3)"));
        assert_eq!(Refusal::Total.reject_code(), RejectCode::ResourceLimit);
        assert_eq!(Refusal::Evicted.reject_code(), RejectCode::Auth);
    }

    #[test]
    fn handshakes_count_apart_from_authenticated_peers_and_the_oldest_is_pushed_out() {
        let a = Admission::new(limits(10, 1), None);
        let x: IpAddr = [10, 0, 0, 1].into();
        let first = a.start_handshake(Some(x));
        let second = a.start_handshake(Some(x));
        // The budget of 2 per address is full: a third pushes out the first.
        let third = a.start_handshake(Some(x));
        assert!(first.evicted().is_cancelled());
        assert!(!second.evicted().is_cancelled());
        assert_eq!(first.admit().err(), Some(Refusal::Evicted));
        // Handshakes held meanwhile did not use the authenticated cap of 1 per address.
        let peer = third.admit().expect("admitted");
        drop(second);
        assert_eq!(
            a.start_handshake(Some(x)).admit().err(),
            Some(Refusal::PerAddress)
        );
        drop(peer);
        let _again = a.start_handshake(Some(x)).admit().expect("freed");
        assert_eq!(
            a.refused(),
            vec![("total", 0), ("per_address", 1), ("evicted", 1)]
        );
        assert_eq!(lock(&a.open).handshakes.len(), 0, "every handshake left");
    }

    #[test]
    fn the_handshake_budget_is_fitted_to_the_open_file_limit() {
        // Allowed 64 descriptors: 16 handshakes (a quarter), not the default 1024 / 256.
        let a = Admission::new(ConnLimits::default(), Some(64));
        let x: IpAddr = [10, 0, 0, 1].into();
        let y: IpAddr = [10, 0, 0, 2].into();
        let held: Vec<Handshake> = (0..16).map(|_| a.start_handshake(Some(x))).collect();
        assert!(held.iter().all(|h| !h.evicted().is_cancelled()));
        // The 17th from anywhere pushes out the oldest of the fullest source.
        let peer = a.start_handshake(Some(y));
        assert!(held[0].evicted().is_cancelled());
        assert!(held[1..].iter().all(|h| !h.evicted().is_cancelled()));
        let _slot = peer.admit().expect("the other source's peer gets in");
        // Unlimited: the configured budget.
        let b = Admission::new(ConnLimits::default(), None);
        let many: Vec<Handshake> = (0..256).map(|_| b.start_handshake(Some(x))).collect();
        assert!(many.iter().all(|h| !h.evicted().is_cancelled()));
    }

    #[test]
    fn auth_failures_are_counted_by_reason() {
        let a = Admission::new(ConnLimits::default(), None);
        a.auth_failed(Failure::BadProof, None);
        a.auth_failed(Failure::BadProof, None);
        a.auth_failed(Failure::Uid, None);
        let f = a.auth_failures();
        assert!(f.contains(&("bad_proof", 2)));
        assert!(f.contains(&("uid", 1)));
        assert!(f.contains(&("no_secret", 0)));
    }
}
