//! Cluster metadata in etcd.
//!
//! With `EngineConfig::metadata` set, an engine publishes a small record under
//! `<prefix><segment name>`: its control address, engine id, machine id and pid. The record
//! is bound to a lease that the engine keeps alive (a keep-alive every `lease_ttl / 3`), so
//! the entry of an engine that dies or loses its host disappears once the lease expires.
//!
//! `open_segment(name)` looks the record up and then fetches the full descriptor from the
//! control address as in p2p mode, so buffers registered later are seen and the data path
//! does not depend on etcd. Each opened peer's key is watched: a put from another engine
//! instance (re-registration after a restart) refreshes its address and descriptor and
//! reports it back; a delete (lease expired or the peer closed) is no loss by itself, only
//! a reason to check the peer directly: its control link pings it at once, and it is lost
//! only if it does not answer within the check's bound (`liveness::CHECK_TIMEOUT`). A lease
//! also expires while the peer is fine — etcd was paused or unreachable past the TTL, or
//! the peer could not reach etcd — and then the peer answers and publishes again.
//!
//! etcd going away later does not stop running transfers, and loses no peer; only opening
//! a name that is not cached fails (`ERR_FERRY_METADATA`). The keep-alive loop and the
//! watches retry with a bounded backoff; when etcd returns, a lease that expired meanwhile
//! is granted anew and the record published again at once, and the watches resume from the
//! last revision they saw.
//!
//! Time to peer-lost through etcd (a host that hangs, whose connections stay open): at
//! most `lease_ttl` plus etcd's expiry check (about half a second) after the last
//! keep-alive, plus the check's bound. A process death is seen sooner by the control link
//! (connection reset).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use crate::config::etcd::{parse_endpoints, EtcdConfig, DEFAULT_LEASE_TTL, DEFAULT_PREFIX};
use crate::control::{fetch_descriptor, LinkEvents};
use crate::error::{Error, Result};
pub use crate::etcd_access::{EtcdAuth, EtcdIdentity, EtcdTls};
use crate::segment::Peer;

/// First retry delay of the keep-alive loop and the watches.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How a keep-alive stream ends when etcd says the lease is gone.
const LEASE_EXPIRED: &str = "lease expired";

/// Checks a logical segment name.
///
/// # Errors
/// `InvalidArgument` for an empty name, or one with whitespace or control characters.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::InvalidArgument(format!(
            "segment name must be 1..=255 bytes, got {name:?}"
        )));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::InvalidArgument(format!(
            "segment name must not contain whitespace or control characters: {name:?}"
        )));
    }
    Ok(())
}

/// What an engine publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecord {
    /// Logical segment name.
    pub name: String,
    /// Control address, `host:port`.
    pub addr: String,
    /// Random id of the engine instance.
    pub engine_id: u64,
    /// Machine id.
    pub machine_id: String,
    /// Process id.
    pub pid: u32,
}

impl SegmentRecord {
    fn parse(value: &[u8]) -> Result<Self> {
        serde_json::from_slice(value).map_err(|e| Error::Metadata(format!("bad record: {e}")))
    }
}

/// What a watched record change means for an opened peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A record that calls for a descriptor refresh; `back` when the peer is to be
    /// reported back (it was lost, or another engine instance took the name).
    Refresh { addr: String, back: bool },
    /// Nothing to do.
    Same,
}

/// Decides what a put of `record` means for a peer last known at `addr` with `engine_id`.
pub(crate) fn on_put(record: &SegmentRecord, addr: &str, engine_id: u64, lost: bool) -> Change {
    let restarted = record.engine_id != engine_id;
    if restarted || lost || record.addr != addr {
        Change::Refresh {
            addr: record.addr.clone(),
            back: restarted || lost,
        }
    } else {
        Change::Same
    }
}

/// Whether the engine named in `holder` could still be answering at its address, so that
/// `ours` has to ask it before taking the name. Not when the address is our own: this
/// engine listens there already (bound before publishing, no port sharing), so the holder
/// is gone. A restarted worker comes back on its old host:port, and asking would only wait
/// out the probe's bound against our own listener, which does not serve yet.
fn may_still_answer(holder: &SegmentRecord, ours: &SegmentRecord) -> bool {
    holder.addr != ours.addr
}

fn etcd_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Metadata(format!("etcd {what}: {e}"))
}

async fn bounded<T, E: std::error::Error + 'static>(
    what: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(etcd_err(what, crate::etcd_access::describe(&e))),
        Err(_) => Err(etcd_err(
            what,
            format!("no answer within {} ms", limit.as_millis()),
        )),
    }
}

/// This engine's registration in etcd, and the client used for lookups and watches.
pub(crate) struct Registry {
    client: Client,
    cfg: EtcdConfig,
    record: SegmentRecord,
    /// The lease the record is bound to; 0 while none is granted.
    lease: AtomicI64,
    /// Test hook: keep-alives are not sent while set.
    paused: AtomicBool,
    cancel: CancellationToken,
}

impl Registry {
    /// Connects, grants a lease and publishes `record`, then keeps the lease alive on the
    /// current runtime until `cancel` fires.
    ///
    /// # Errors
    /// `Metadata` when etcd does not answer within `connect_timeout`.
    pub(crate) async fn start(
        cfg: EtcdConfig,
        record: SegmentRecord,
        cancel: CancellationToken,
    ) -> Result<Arc<Self>> {
        let t = cfg.connect_timeout;
        let ping = (cfg.lease_ttl / 3).max(Duration::from_millis(500));
        let options = ConnectOptions::new()
            .with_connect_timeout(t)
            .with_timeout(t)
            .with_keep_alive(ping, t)
            .with_keep_alive_while_idle(true);
        let (endpoints, options) = crate::etcd_access::secure(
            &cfg.endpoints,
            cfg.tls.as_ref(),
            cfg.auth.as_ref(),
            options,
        );
        let client = match tokio::time::timeout(t, Client::connect(&endpoints, Some(options))).await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(crate::etcd_access::connect_failed(
                    &endpoints,
                    cfg.tls.as_ref(),
                    &e,
                ))
            }
            Err(_) => {
                return Err(Error::Metadata(format!(
                    "cannot connect to etcd at {}: no answer within {} ms",
                    endpoints.join(","),
                    t.as_millis()
                )))
            }
        };
        let reg = Arc::new(Self {
            client,
            cfg,
            record,
            lease: AtomicI64::new(0),
            paused: AtomicBool::new(false),
            cancel,
        });
        let lease = reg.publish().await.map_err(|e| {
            Error::Metadata(format!(
                "cannot register with etcd at {}: {e}",
                reg.cfg.endpoints.join(",")
            ))
        })?;
        reg.lease.store(lease, Ordering::Release);
        tokio::spawn(reg.clone().keep_alive());
        Ok(reg)
    }

    /// The logical name this engine is published under.
    pub(crate) fn name(&self) -> &str {
        &self.record.name
    }

    /// Test hook: stops (or resumes) the keep-alives without revoking the lease.
    pub(crate) fn pause_keepalive(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    fn ttl_secs(&self) -> i64 {
        i64::try_from(self.cfg.lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX)
    }

    /// Grants a lease and puts the record under it; returns the lease id.
    ///
    /// A name is one engine's: when another engine's record holds it, the put only goes
    /// ahead if that engine no longer answers at its address (it died and its lease has not
    /// expired yet, e.g. a worker restarted at once); otherwise this fails with `Metadata`.
    async fn publish(&self) -> Result<i64> {
        let t = self.cfg.connect_timeout;
        let mut c = self.client.clone();
        let grant = bounded("lease grant", t, c.lease_grant(self.ttl_secs(), None)).await?;
        let value = serde_json::to_string(&self.record)
            .map_err(|e| Error::Metadata(format!("cannot encode record: {e}")))?;
        let key = self.cfg.key(&self.record.name);
        let opts = PutOptions::new().with_lease(grant.id());
        let create = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value.clone(), Some(opts.clone()))])
            .or_else([TxnOp::get(key.clone(), None)]);
        let created = bounded("put", t, c.txn(create)).await?;
        if !created.succeeded() {
            let holder = created.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .and_then(|kv| SegmentRecord::parse(kv.value()).ok()),
                _ => None,
            });
            if let Some(h) = holder.filter(|h| h.engine_id != self.record.engine_id) {
                if may_still_answer(&h, &self.record) && self.answers(&h).await {
                    let _ = bounded("lease revoke", t, c.lease_revoke(grant.id())).await;
                    return Err(Error::Metadata(format!(
                        "segment name {:?} is held by another live engine (pid {} at {}); \
                         names must be unique",
                        self.record.name, h.pid, h.addr
                    )));
                }
                tracing::info!(name = %self.record.name, previous = %h.addr, "taking over the name of an engine that no longer answers");
            }
            bounded("put", t, c.put(key, value, Some(opts))).await?;
        }
        tracing::debug!(name = %self.record.name, lease = grant.id(), ttl = grant.ttl(), "published in etcd");
        Ok(grant.id())
    }

    /// Whether the engine of `record` still answers at its address (as that engine).
    async fn answers(&self, record: &SegmentRecord) -> bool {
        let t = self.cfg.connect_timeout.min(Duration::from_secs(1));
        match fetch_descriptor(&record.addr, self.record.engine_id, t).await {
            Ok(desc) => desc.engine_id == record.engine_id,
            Err(_) => false,
        }
    }

    /// Keeps the lease alive; re-grants and re-publishes when it expired (after the
    /// shortest delay). Runs until `cancel` fires; each etcd call is bounded, retries back
    /// off up to `BACKOFF_MAX`.
    async fn keep_alive(self: Arc<Self>) {
        let mut backoff = BACKOFF_START;
        loop {
            let outcome = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                r = self.keep_alive_once(&mut backoff) => r,
            };
            if outcome == LEASE_EXPIRED {
                // etcd answers again and the record is gone: publish after the shortest
                // delay, not after the backoff that etcd's silence built up.
                backoff = BACKOFF_START;
            }
            tracing::info!(name = %self.record.name, reason = %outcome, "etcd keep-alive interrupted; retrying");
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One keep-alive stream's life; returns why it ended.
    async fn keep_alive_once(&self, backoff: &mut Duration) -> String {
        let t = self.cfg.connect_timeout;
        let interval = (self.cfg.lease_ttl / 3).max(Duration::from_millis(100));
        // Opening a keep-alive stream renews the lease: not while paused.
        while self.paused.load(Ordering::Acquire) {
            tokio::time::sleep(interval).await;
        }
        if self.lease.load(Ordering::Acquire) == 0 {
            match self.publish().await {
                Ok(id) => {
                    tracing::info!(name = %self.record.name, "lease granted again: record re-published");
                    self.lease.store(id, Ordering::Release);
                }
                Err(e) => return e.to_string(),
            }
        }
        let id = self.lease.load(Ordering::Acquire);
        let mut c = self.client.clone();
        let (mut keeper, mut stream) = match tokio::time::timeout(t, c.lease_keep_alive(id)).await {
            Ok(Ok(s)) => s,
            // The client's word for a keep-alive answered with TTL 0.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m.contains("not found") => {
                self.lease.store(0, Ordering::Release);
                return LEASE_EXPIRED.into();
            }
            Ok(Err(e)) => return etcd_err("lease keep-alive", e).to_string(),
            Err(_) => return "lease keep-alive: no answer".into(),
        };
        loop {
            if !self.paused.load(Ordering::Acquire) {
                if let Err(e) = bounded("lease keep-alive", t, keeper.keep_alive()).await {
                    return e.to_string();
                }
                match bounded("lease keep-alive", t, stream.message()).await {
                    Ok(Some(resp)) if resp.ttl() > 0 => *backoff = BACKOFF_START,
                    Ok(Some(_)) => {
                        self.lease.store(0, Ordering::Release);
                        return LEASE_EXPIRED.into();
                    }
                    Ok(None) => return "keep-alive stream closed".into(),
                    Err(e) => return e.to_string(),
                }
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Revokes the lease so that peers see this engine leave at once; waits at most
    /// `connect_timeout`. Stops the keep-alive loop first.
    pub(crate) async fn revoke(&self) {
        self.cancel.cancel();
        let id = self.lease.swap(0, Ordering::AcqRel);
        if id == 0 {
            return;
        }
        let mut c = self.client.clone();
        if let Err(e) = bounded("lease revoke", self.cfg.connect_timeout, c.lease_revoke(id)).await
        {
            tracing::info!(name = %self.record.name, error = %e, "lease not revoked; it expires by itself");
        }
    }

    /// Looks segment `name` up; returns its record and the store revision of the answer.
    ///
    /// # Errors
    /// `Metadata` when etcd does not answer or the record is malformed; `UnknownSegment`
    /// when no engine is registered under `name`.
    pub(crate) async fn resolve(&self, name: &str) -> Result<(SegmentRecord, i64)> {
        check_name(name)?;
        let mut c = self.client.clone();
        let resp = bounded(
            "get",
            self.cfg.connect_timeout,
            c.get(self.cfg.key(name), None),
        )
        .await
        .map_err(|e| Error::Metadata(format!("cannot look up segment {name:?}: {e}")))?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let kv = resp.kvs().first().ok_or_else(|| {
            Error::UnknownSegment(format!(
                "{name:?} is not registered in etcd under {}",
                self.cfg.prefix
            ))
        })?;
        Ok((SegmentRecord::parse(kv.value())?, revision))
    }

    /// Watches `peer`'s record from `revision + 1` until the peer's link is canceled.
    pub(crate) fn watch(
        self: &Arc<Self>,
        peer: Arc<Peer>,
        events: Arc<dyn LinkEvents>,
        revision: i64,
        local_engine_id: u64,
    ) {
        let reg = self.clone();
        tokio::spawn(async move {
            let cancel = peer.link_cancel.clone();
            let mut rev = revision;
            let mut backoff = BACKOFF_START;
            loop {
                let why = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    r = reg.watch_once(&peer, &events, &mut rev, local_engine_id, &mut backoff) => r,
                };
                tracing::info!(peer = peer.name(), reason = %why, "etcd watch interrupted; resuming");
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        });
    }

    /// One watch stream's life; returns why it ended.
    async fn watch_once(
        &self,
        peer: &Arc<Peer>,
        events: &Arc<dyn LinkEvents>,
        rev: &mut i64,
        local_engine_id: u64,
        backoff: &mut Duration,
    ) -> String {
        let key = self.cfg.key(peer.name());
        let mut c = self.client.clone();
        let opts = WatchOptions::new().with_start_revision(*rev + 1);
        let mut stream =
            match bounded("watch", self.cfg.connect_timeout, c.watch(key, Some(opts))).await {
                Ok(s) => s,
                Err(e) => return e.to_string(),
            };
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return "watch stream closed".into(),
                Err(e) => return format!("watch failed: {e}"),
            };
            *backoff = BACKOFF_START;
            if resp.canceled() {
                // Compacted past our revision: compare with the current record instead.
                self.reconcile(peer, events, rev, local_engine_id).await;
                return format!("watch canceled (compacted at {})", resp.compact_revision());
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                *rev = (*rev).max(kv.mod_revision());
                match ev.event_type() {
                    EventType::Delete => record_removed(peer),
                    EventType::Put => match SegmentRecord::parse(kv.value()) {
                        Ok(record) => self.apply(peer, events, &record, local_engine_id).await,
                        Err(e) => tracing::warn!(peer = peer.name(), error = %e, "ignored"),
                    },
                }
            }
        }
    }

    /// Brings `peer` in line with its current record (after a canceled watch).
    async fn reconcile(
        &self,
        peer: &Arc<Peer>,
        events: &Arc<dyn LinkEvents>,
        rev: &mut i64,
        local_engine_id: u64,
    ) {
        match self.resolve(peer.name()).await {
            Ok((record, revision)) => {
                *rev = revision;
                self.apply(peer, events, &record, local_engine_id).await;
            }
            Err(Error::UnknownSegment(_)) => record_removed(peer),
            Err(e) => tracing::info!(peer = peer.name(), error = %e, "etcd lookup failed"),
        }
    }

    /// Applies a put of `record` to `peer`.
    async fn apply(
        &self,
        peer: &Arc<Peer>,
        events: &Arc<dyn LinkEvents>,
        record: &SegmentRecord,
        local_engine_id: u64,
    ) {
        let known = peer.descriptor().engine_id;
        let Change::Refresh { addr, back } = on_put(record, &peer.addr(), known, peer.is_lost())
        else {
            return;
        };
        peer.set_addr(&addr);
        match fetch_descriptor(&addr, local_engine_id, self.cfg.connect_timeout).await {
            Ok(desc) => {
                tracing::info!(peer = peer.name(), %addr, "re-registered in etcd: descriptor refreshed");
                events.descriptor_seen(peer, desc);
                if back {
                    events.peer_back(peer);
                }
            }
            Err(e) => {
                tracing::info!(peer = peer.name(), %addr, error = %e, "re-registered peer not reachable yet")
            }
        }
    }
}

/// `peer`'s record went away: its link checks it directly (a loss only if it does not
/// answer).
fn record_removed(peer: &Peer) {
    tracing::info!(
        peer = peer.name(),
        "etcd record removed: asking the control link for a direct check"
    );
    peer.check.notify_one();
}

/// Publishes an engine in etcd: its segment name (`cfg.segment_name`, else its address),
/// its address, ids and pid.
///
/// # Errors
/// `InvalidArgument` for a bad segment name; `Metadata` when etcd cannot be reached.
pub(crate) fn register(
    handle: &tokio::runtime::Handle,
    cfg: &EtcdConfig,
    engine: EngineIdentity<'_>,
    shutdown: &CancellationToken,
) -> Result<Arc<Registry>> {
    if cfg.endpoints.is_empty() {
        return Err(Error::InvalidArgument(
            "metadata needs at least one etcd endpoint".into(),
        ));
    }
    if cfg.lease_ttl < Duration::from_secs(1) {
        return Err(Error::InvalidArgument("leaseTtlMs must be >= 1000".into()));
    }
    let name = cfg
        .segment_name
        .clone()
        .unwrap_or_else(|| engine.addr.to_string());
    check_name(&name)?;
    let record = SegmentRecord {
        name,
        addr: engine.addr.to_string(),
        engine_id: engine.engine_id,
        machine_id: engine.machine_id.to_string(),
        pid: std::process::id(),
    };
    start_blocking(handle, cfg.clone(), record, shutdown.child_token())
}

/// What etcd is told about the engine that registers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineIdentity<'a> {
    /// The address peers reach it at (its p2p segment name).
    pub addr: &'a str,
    /// Its random id.
    pub engine_id: u64,
    /// Its machine identity.
    pub machine_id: &'a str,
}

/// Starts the registry of an engine whose runtime is `handle`, from synchronous code;
/// waits at most about twice `connect_timeout`.
///
/// # Errors
/// `Metadata` when etcd cannot be reached or registration fails.
pub(crate) fn start_blocking(
    handle: &tokio::runtime::Handle,
    cfg: EtcdConfig,
    record: SegmentRecord,
    cancel: CancellationToken,
) -> Result<Arc<Registry>> {
    let limit = cfg.connect_timeout * 2 + Duration::from_secs(1);
    let endpoints = cfg.endpoints.join(",");
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let _ = tx.send(Registry::start(cfg, record, cancel).await);
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        Err(Error::Metadata(format!(
            "etcd at {endpoints} did not answer within {} ms",
            limit.as_millis()
        )))
    })
}

/// Revokes `registry`'s lease from synchronous code (engine close); waits at most about
/// `connect_timeout` plus a margin.
pub(crate) fn revoke_blocking(handle: &tokio::runtime::Handle, registry: &Arc<Registry>) {
    let limit = registry.cfg.connect_timeout + Duration::from_millis(200);
    let (tx, rx) = std::sync::mpsc::channel();
    let reg = registry.clone();
    handle.spawn(async move {
        reg.revoke().await;
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(limit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("prefill-0").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn a_holder_at_our_own_address_is_not_asked() {
        let record = |addr: &str, engine_id| SegmentRecord {
            name: "n".into(),
            addr: addr.into(),
            engine_id,
            machine_id: "m".into(),
            pid: 1,
        };
        let ours = record("10.0.0.2:7000", 2);
        assert!(!may_still_answer(&record("10.0.0.2:7000", 1), &ours));
        assert!(may_still_answer(&record("10.0.0.2:7001", 1), &ours));
        assert!(may_still_answer(&record("10.0.0.3:7000", 1), &ours));
    }

    #[test]
    fn puts_decide_refresh_and_recovery() {
        let rec = SegmentRecord {
            name: "n".into(),
            addr: "127.0.0.1:2".into(),
            engine_id: 7,
            machine_id: "m".into(),
            pid: 1,
        };
        assert_eq!(on_put(&rec, "127.0.0.1:2", 7, false), Change::Same);
        assert_eq!(
            on_put(&rec, "127.0.0.1:2", 7, true),
            Change::Refresh {
                addr: "127.0.0.1:2".into(),
                back: true
            }
        );
        assert_eq!(
            on_put(&rec, "127.0.0.1:1", 6, false),
            Change::Refresh {
                addr: "127.0.0.1:2".into(),
                back: true
            }
        );
        assert_eq!(
            on_put(&rec, "127.0.0.1:1", 7, false),
            Change::Refresh {
                addr: "127.0.0.1:2".into(),
                back: false
            }
        );
        let json = serde_json::to_vec(&rec).expect("encode");
        assert_eq!(SegmentRecord::parse(&json).expect("decode"), rec);
        assert_eq!(
            SegmentRecord::parse(b"{").expect_err("bad").code(),
            "ERR_FERRY_METADATA"
        );
    }
}
