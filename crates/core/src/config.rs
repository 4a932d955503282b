//! Engine settings: what each one means, its default, its bounds. Options are declared
//! once, here; the binding converts JS values into these fields and takes its defaults
//! from `Default`. The settings types of a concern whose module imports them are defined
//! here, in a submodule each (`etcd`, `fault`, `notify`), so that `config` imports no
//! module it configures.

pub(crate) mod etcd;
pub(crate) mod fault;
pub(crate) mod notify;
pub(crate) mod spread;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::admission::ConnLimits;
use crate::auth::Secret;
use crate::error::{Error, Result};
use crate::failover::FailoverPolicy;
use crate::health::RailPolicy;
use crate::kind::TransportKind;
use crate::transport::TransportFactory;
use etcd::EtcdConfig;
use fault::FaultSpec;
use notify::NotifyConfig;

/// Engine settings. `Default` gives the embedded, loopback-only default.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Listen address for control and data (`host:port`, port 0 = any). Default
    /// `127.0.0.1:0`: loopback only.
    pub listen: String,
    /// A peer silent for this long is declared lost and its in-flight work fails.
    pub peer_timeout: Duration,
    /// I/O threads of the engine's runtime. Default: from the cores (`spread::auto_io_threads`).
    pub io_threads: usize,
    /// Transports enabled here. Default: every one, in `kind::DEFAULT_ORDER`; one this
    /// build or machine lacks is disabled with the reason (`transportDisabled`).
    pub transports: Vec<TransportKind>,
    /// TCP transport settings.
    pub tcp: TcpConfig,
    /// Failover budget, poll behaviour and attempt deadline.
    pub failover: FailoverPolicy,
    /// When a (peer, transport) path that keeps failing is ranked last, and for how long.
    pub rail: RailPolicy,
    /// Fault injection per transport (tests and benchmarks).
    pub faults: Vec<(TransportKind, FaultSpec)>,
    /// Overrides the machine identity used for same-host detection (tests).
    pub machine_id: Option<String>,
    /// The address peers use to reach this engine (`host` or `host:port`; the bound port
    /// when none is given): the segment name in p2p mode and the published address with
    /// etcd. Needed when listening on all interfaces (`0.0.0.0:…`). Default: the bound
    /// address (127.0.0.1 for an unspecified one).
    pub advertise: Option<String>,
    /// Transports built outside this crate (e.g. RDMA from `ferry-verbs`); each is used
    /// when its kind is in `transports`.
    pub extra_transports: Vec<Arc<dyn TransportFactory>>,
    /// Cluster metadata in etcd; `None` (default) is p2p: segments are named `host:port`.
    pub metadata: Option<EtcdConfig>,
    /// The cluster secret (`authSecret`, or the file named by `FERRY_AUTH_SECRET_FILE`):
    /// every connection, both ways, proves it before anything else is exchanged. `None`:
    /// the per-user secret (`user_secret`), so that processes of this user work together
    /// and no other uid can — unless `allow_unauthenticated`.
    pub auth_secret: Option<Secret>,
    /// Without `auth_secret`, no secret at all, not even the per-user one: anyone who can
    /// reach the engine may use it, and only engines that do the same can reach it
    /// (`allowUnauthenticated`). Needed to listen beyond loopback without a secret.
    pub allow_unauthenticated: bool,
    /// Whether tcp connections (data, control, notifications) are sealed (AES-256-GCM,
    /// keys from each connection's handshake):
    /// `Auto` (default) seals them to and from peers beyond loopback, `Always` everywhere,
    /// `Never` nowhere. Needs a secret (`auth_secret`, or the per-user one); `Always`
    /// without any (`allow_unauthenticated`) is refused.
    pub encrypt: crate::sealing::Encrypt,
    /// Serves the shm socket to processes of any uid, not only this one's (`shmAnyUid`).
    pub shm_any_uid: bool,
    /// Caps on authenticated connections per peer address and in total, and the budget of
    /// connections still in their handshake.
    pub connections: ConnLimits,
    /// A started frame (header and payload) must be complete within this long
    /// (`frameTimeoutMs`); a handshake too.
    pub frame_timeout: Duration,
    /// Notifications: the receive queue's size and the payload cap.
    pub notify: NotifyConfig,
    /// Check every request's bytes end to end, as its `verify` option does (`verify`).
    /// Default off: a CRC32C pass over the bytes at each end.
    pub verify: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            peer_timeout: Duration::from_millis(3000),
            io_threads: spread::auto_io_threads(spread::machine_cores()),
            transports: crate::kind::DEFAULT_ORDER.to_vec(),
            tcp: TcpConfig::default(),
            failover: FailoverPolicy::default(),
            rail: RailPolicy::default(),
            faults: Vec::new(),
            machine_id: None,
            advertise: None,
            extra_transports: Vec::new(),
            metadata: None,
            auth_secret: None,
            allow_unauthenticated: false,
            encrypt: crate::sealing::Encrypt::Auto,
            shm_any_uid: false,
            connections: ConnLimits::default(),
            frame_timeout: Duration::from_secs(30),
            notify: NotifyConfig::default(),
            verify: false,
        }
    }
}

/// Settings of the TCP transport.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// Data connections per peer, the lanes a peer's requests are spread and striped over.
    /// Default: from the cores (`spread::auto_lanes`).
    pub connections_per_peer: usize,
    /// Requests larger than this are cut into slices of this size.
    pub slice_size: u64,
    /// Connect (and hello) timeout.
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            connections_per_peer: spread::auto_lanes(spread::machine_cores()),
            // Half a MiB: a 1 MiB request goes out on two connections at once, so two
            // cores copy (one op in flight moved 0.55-0.6x iperf3 with 1 MiB slices,
            // 0.75-0.96x with these, in the same runs).
            slice_size: 512 << 10,
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// Bounds of the engine settings, checked by [`EngineConfig::validate`]. Named as the JS
/// options are, since that is where users set them.
pub(crate) mod limits {
    use std::time::Duration;

    /// `peerTimeoutMs`: 10 ms ..= 1 h.
    pub(crate) const PEER_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(10), Duration::from_secs(3600));
    /// `ioThreads`: 1 ..= 64.
    pub(crate) const IO_THREADS: (usize, usize) = (1, 64);
    /// `connectionsPerPeer`: 1 ..= 64.
    pub(crate) const CONNECTIONS_PER_PEER: (usize, usize) = (1, 64);
    /// `sliceSize`: 4 KiB ..= 1 GiB.
    pub(crate) const SLICE_SIZE: (u64, u64) = (4096, 1 << 30);
    /// `connectTimeoutMs`: 1 ms ..= 10 min.
    pub(crate) const CONNECT_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(600));
    /// `attemptTimeoutMs` (when set): 1 ms ..= 24 h.
    pub(crate) const ATTEMPT_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(86_400));
    /// `leaseTtlMs`: whole seconds, 1 s ..= 1 h.
    pub(crate) const LEASE_TTL: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(3600));
    /// `maxConnections` and `maxConnectionsPerAddress`: 1 ..= 1 000 000.
    pub(crate) const CONNECTIONS: (usize, usize) = (1, 1_000_000);
    /// `notifyQueueSize`: 1 ..= 1 000 000 notifications.
    pub(crate) const NOTIFY_QUEUE: (usize, usize) = (1, 1_000_000);
    /// `notifyMaxBytes`: 1 B ..= 64 KiB (the wire's cap).
    pub(crate) const NOTIFY_BYTES: (usize, usize) = (1, crate::wire::MAX_NOTIFY_PAYLOAD as usize);
    /// `frameTimeoutMs`: 10 ms ..= 1 h.
    pub(crate) const FRAME_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(10), Duration::from_secs(3600));
}

impl EngineConfig {
    /// Checks every setting against [`limits`]; the message names the option and its
    /// bounds. `Engine::new` calls it, so no engine starts with a nonsense setting.
    pub fn validate(&self) -> Result<()> {
        fn within<T: PartialOrd + std::fmt::Debug>(
            name: &str,
            v: T,
            (lo, hi): (T, T),
            show: impl Fn(&T) -> String,
        ) -> Result<()> {
            if v < lo || v > hi {
                return Err(Error::InvalidArgument(format!(
                    "{name} must be in {}..={}, got {}",
                    show(&lo),
                    show(&hi),
                    show(&v)
                )));
            }
            Ok(())
        }
        let ms = |d: &Duration| d.as_millis().to_string();
        let n = |v: &usize| v.to_string();
        within("peerTimeoutMs", self.peer_timeout, limits::PEER_TIMEOUT, ms)?;
        within("ioThreads", self.io_threads, limits::IO_THREADS, n)?;
        within(
            "connectionsPerPeer",
            self.tcp.connections_per_peer,
            limits::CONNECTIONS_PER_PEER,
            n,
        )?;
        within("sliceSize", self.tcp.slice_size, limits::SLICE_SIZE, |v| {
            v.to_string()
        })?;
        within(
            "connectTimeoutMs",
            self.tcp.connect_timeout,
            limits::CONNECT_TIMEOUT,
            ms,
        )?;
        within(
            "maxFailoverAttempts",
            self.failover.max_failover_attempts,
            (0, crate::failover::MAX_FAILOVER_ATTEMPTS),
            |v| v.to_string(),
        )?;
        if let Some(t) = self.failover.attempt_timeout {
            within("attemptTimeoutMs", t, limits::ATTEMPT_TIMEOUT, ms)?;
        }
        within(
            "maxConnections",
            self.connections.total,
            limits::CONNECTIONS,
            n,
        )?;
        within(
            "maxConnectionsPerAddress",
            self.connections.per_address,
            limits::CONNECTIONS,
            n,
        )?;
        within(
            "connections.handshakes",
            self.connections.handshakes,
            limits::CONNECTIONS,
            n,
        )?;
        within(
            "connections.handshakes_per_address",
            self.connections.handshakes_per_address,
            limits::CONNECTIONS,
            n,
        )?;
        within(
            "frameTimeoutMs",
            self.frame_timeout,
            limits::FRAME_TIMEOUT,
            ms,
        )?;
        within(
            "notifyQueueSize",
            self.notify.queue_size,
            limits::NOTIFY_QUEUE,
            n,
        )?;
        within(
            "notifyMaxBytes",
            self.notify.max_bytes,
            limits::NOTIFY_BYTES,
            n,
        )?;
        if self.transports.is_empty() {
            return Err(Error::InvalidArgument(
                "transports must name at least one of shm, rdma, tcp".into(),
            ));
        }
        for (i, t) in self.transports.iter().enumerate() {
            if self.transports[..i].contains(t) {
                return Err(Error::InvalidArgument(format!(
                    "transports names {} twice",
                    t.name()
                )));
            }
        }
        if let Some(m) = &self.metadata {
            within("leaseTtlMs", m.lease_ttl, limits::LEASE_TTL, ms)?;
            if m.lease_ttl.subsec_nanos() != 0 {
                return Err(Error::InvalidArgument(format!(
                    "leaseTtlMs must be whole seconds, got {}",
                    m.lease_ttl.as_millis()
                )));
            }
            if m.prefix.is_empty() {
                return Err(Error::InvalidArgument(
                    "metadataPrefix must not be empty".into(),
                ));
            }
        }
        Ok(())
    }
}

/// What this engine proves and asks for: its `auth_secret`; else none where
/// `allow_unauthenticated`; else the per-user secret, from the file `user_secret` reads
/// (made on first use).
pub(crate) fn effective_secret(
    config: &EngineConfig,
    per_user: impl FnOnce() -> Result<Secret>,
) -> Result<Option<Secret>> {
    match (&config.auth_secret, config.allow_unauthenticated) {
        (Some(secret), _) => Ok(Some(secret.clone())),
        (None, true) => Ok(None),
        (None, false) => per_user().map(Some),
    }
}

/// Refuses `encrypt: Always` where there is no secret to derive keys from.
pub(crate) fn check_encrypt(config: &EngineConfig) -> Result<()> {
    if config.encrypt == crate::sealing::Encrypt::Always
        && config.auth_secret.is_none()
        && config.allow_unauthenticated
    {
        return Err(Error::InvalidArgument(
            "encrypt: true needs a cluster secret (authSecret or FERRY_AUTH_SECRET_FILE): \
             the keys are derived from it; allowUnauthenticated has none"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses to serve beyond loopback without a secret, unless that was asked for. The
/// per-user secret does not count: no other host holds it.
pub(crate) fn check_exposure(config: &EngineConfig, bound: SocketAddr) -> Result<()> {
    match exposure_warning(config, bound) {
        None => Ok(()),
        Some(warning) if config.allow_unauthenticated => {
            tracing::warn!(%bound, "{warning}");
            Ok(())
        }
        Some(_) => Err(Error::InvalidArgument(format!(
            "listening on {bound} (beyond loopback) needs a cluster secret: set authSecret \
             (at least 32 bytes) or FERRY_AUTH_SECRET_FILE=PATH on every engine, or \
             allowUnauthenticated: true to accept anyone who can reach it"
        ))),
    }
}

/// What an engine serving on `bound` without a secret exposes, or `None` when it is on
/// loopback or holds a secret. An engine that started with a warning was allowed by
/// `allowUnauthenticated`.
pub(crate) fn exposure_warning(config: &EngineConfig, bound: SocketAddr) -> Option<String> {
    if bound.ip().is_loopback() || config.auth_secret.is_some() {
        return None;
    }
    Some(format!(
        "listening on {bound} beyond loopback WITHOUT authentication (allowUnauthenticated): \
         anyone who can reach this address can read and write registered memory"
    ))
}

/// The segment name for an advertise address: `host:port` as given, or `host` with the
/// bound port.
pub(crate) fn advertised_name(advertise: &str, bound_port: u16) -> Result<String> {
    let bad = |why: &str| Error::InvalidArgument(format!("advertise {advertise:?}: {why}"));
    let a = advertise.trim();
    if a.is_empty() || a.contains(char::is_whitespace) || a.contains('/') {
        return Err(bad("expected host or host:port"));
    }
    if let Ok(sa) = a.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(bad("port 0 cannot be reached"));
        }
        return Ok(sa.to_string());
    }
    if let Ok(ip) = a
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<std::net::IpAddr>()
    {
        if ip.is_unspecified() {
            return Err(bad("an unspecified address cannot be reached"));
        }
        return Ok(SocketAddr::new(ip, bound_port).to_string());
    }
    match a.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains(':') => {
            let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
            if port == 0 {
                return Err(bad("port 0 cannot be reached"));
            }
            Ok(format!("{host}:{port}"))
        }
        Some(_) => Err(bad("expected host or host:port")),
        None => Ok(format!("{a}:{bound_port}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{advertised_name, check_encrypt, EngineConfig, TransportKind};
    use std::time::Duration;

    #[test]
    fn settings_out_of_bounds_are_refused_by_name() {
        assert_eq!(EngineConfig::default().validate(), Ok(()));
        type Change = Box<dyn Fn(&mut EngineConfig)>;
        let bad: Vec<(&str, Change)> = vec![
            (
                "peerTimeoutMs",
                Box::new(|c| c.peer_timeout = Duration::ZERO),
            ),
            (
                "peerTimeoutMs",
                Box::new(|c| c.peer_timeout = Duration::from_secs(3601)),
            ),
            ("ioThreads", Box::new(|c| c.io_threads = 0)),
            (
                "connectionsPerPeer",
                Box::new(|c| c.tcp.connections_per_peer = 65),
            ),
            ("sliceSize", Box::new(|c| c.tcp.slice_size = 100)),
            (
                "connectTimeoutMs",
                Box::new(|c| c.tcp.connect_timeout = Duration::ZERO),
            ),
            (
                "maxFailoverAttempts",
                Box::new(|c| c.failover.max_failover_attempts = 100_000),
            ),
            (
                "attemptTimeoutMs",
                Box::new(|c| c.failover.attempt_timeout = Some(Duration::ZERO)),
            ),
            ("transports", Box::new(|c| c.transports.clear())),
            ("notifyQueueSize", Box::new(|c| c.notify.queue_size = 0)),
            (
                "notifyMaxBytes",
                Box::new(|c| c.notify.max_bytes = 65 << 10),
            ),
            (
                "transports",
                Box::new(|c| c.transports = vec![TransportKind::Tcp, TransportKind::Tcp]),
            ),
        ];
        for (name, change) in bad {
            let mut c = EngineConfig::default();
            change(&mut c);
            let err = c.validate().expect_err(name);
            assert_eq!(err.code(), "ERR_FERRY_INVALID_ARGUMENT");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
        let mut c = EngineConfig::default();
        c.failover.max_failover_attempts = crate::failover::MAX_FAILOVER_ATTEMPTS;
        c.failover.attempt_timeout = None;
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn advertise_takes_host_or_host_port() {
        assert_eq!(
            advertised_name("10.0.0.2", 7000).expect("ip"),
            "10.0.0.2:7000"
        );
        assert_eq!(
            advertised_name("10.0.0.2:9", 7000).expect("ip:port"),
            "10.0.0.2:9"
        );
        assert_eq!(
            advertised_name("node-3", 7000).expect("host"),
            "node-3:7000"
        );
        assert_eq!(
            advertised_name("node-3:81", 7000).expect("host:port"),
            "node-3:81"
        );
        assert_eq!(advertised_name("::1", 7000).expect("v6"), "[::1]:7000");
        assert_eq!(
            advertised_name("[::1]:5", 7000).expect("v6 port"),
            "[::1]:5"
        );
        for bad in [
            "",
            " ",
            "0.0.0.0",
            "a:b",
            "a:0",
            "10.0.0.1:0",
            "h:70000",
            "http://x",
        ] {
            let e = advertised_name(bad, 7000).expect_err(bad);
            assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT", "{bad}");
        }
    }

    #[test]
    fn encrypt_always_needs_a_secret_to_derive_keys_from() {
        use crate::sealing::Encrypt;
        let none = EngineConfig {
            encrypt: Encrypt::Always,
            allow_unauthenticated: true,
            ..EngineConfig::default()
        };
        let err = check_encrypt(&none).expect_err("no secret");
        assert_eq!(err.code(), "ERR_FERRY_INVALID_ARGUMENT", "{err}");
        // The per-user secret is one (the default without authSecret).
        let per_user = EngineConfig {
            encrypt: Encrypt::Always,
            ..EngineConfig::default()
        };
        assert!(check_encrypt(&per_user).is_ok());
        let auto = EngineConfig {
            allow_unauthenticated: true,
            ..EngineConfig::default()
        };
        assert!(
            check_encrypt(&auto).is_ok(),
            "auto without a secret seals nothing"
        );
    }
}
