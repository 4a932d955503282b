//! Engine options: the `EngineOptions` object JS passes to `startEngine`, converted into
//! the core's `EngineConfig` (defaults from its `Default`, bounds from its `validate`).

use std::path::Path;
use std::sync::Arc;

use ferry_core::auth::Secret;
use ferry_core::transports::fault::FaultSpec;
use ferry_core::{EngineConfig, Error, EtcdAuth, EtcdConfig, EtcdTls, TransportKind};
use ferry_verbs::{RdmaConfig, RdmaFactory};
use napi::Either;
use napi_derive::napi;

use super::transport_options::{transport_named, FaultOptions, RdmaOptions};
use crate::js::{opt_int, opt_ms, opt_u64};

/// Engine options. Every field is optional; defaults in brackets, then bounds (checked by
/// the core's `EngineConfig::validate`). An unknown key is refused.
#[napi(object)]
#[derive(Default, Clone)]
pub struct EngineOptions {
    /// Listen address for control and data, `host:port` ["127.0.0.1:0": loopback, any port].
    pub listen: Option<String>,
    /// A silent peer is declared lost after this many ms [3000; 10..=3600000].
    pub peer_timeout_ms: Option<f64>,
    /// I/O threads, or "auto": one per core, 2..=32 ["auto"; 1..=64].
    #[napi(ts_type = "number | 'auto'")]
    pub io_threads: Option<Either<f64, String>>,
    /// Enabled transports, of "tcp", "shm", "rdma" [["shm", "rdma", "tcp"]]; rdma is
    /// disabled with one log line where no RDMA device (or no libibverbs) is present.
    #[napi(ts_type = "Array<'tcp' | 'shm' | 'rdma'>")]
    pub transports: Option<Vec<String>>,
    /// RDMA settings [see RdmaOptions].
    pub rdma: Option<RdmaOptions>,
    /// Overrides the machine identity used for same-host detection (tests) [auto].
    pub machine_id: Option<String>,
    /// The address peers reach this engine at, `host` or `host:port` (needed when listening
    /// on 0.0.0.0, e.g. in cluster mode) [the bound address].
    pub advertise: Option<String>,
    /// TCP lanes (data connections) per peer, or "auto": one per core, 2..=32 ["auto"; 1..=64].
    #[napi(ts_type = "number | 'auto'")]
    pub connections_per_peer: Option<Either<f64, String>>,
    /// TCP slice size in bytes [524288; 4096..=1073741824].
    pub slice_size: Option<f64>,
    /// Connect timeout in ms [3000; 1..=600000].
    pub connect_timeout_ms: Option<f64>,
    /// Transport switches allowed per task; 0 disables failover [3; 0..=1000].
    pub max_failover_attempts: Option<f64>,
    /// Whether polled (batch) tasks fail over; the Promise path always does [true].
    pub enable_auto_failover_on_poll: Option<bool>,
    /// Deadline of one attempt in ms, from when its bytes start moving (tcp, rdma; else from submission); 0 = none [10000; 0..=86400000].
    pub attempt_timeout_ms: Option<f64>,
    /// Fault injection per transport, for tests and benchmarks [none].
    pub faults: Option<Vec<FaultOptions>>,
    /// Metadata service: "p2p" (segment names are host:port), or
    /// "etcd://host:port[,host:port...]" for cluster mode ["p2p"].
    #[napi(ts_type = "'p2p' | `etcd://${string}`")]
    pub metadata: Option<String>,
    /// With etcd: key prefix of the segment records ["/ferry/segments/"].
    pub metadata_prefix: Option<String>,
    /// With etcd: the logical name this engine is published under [its host:port].
    pub segment_name: Option<String>,
    /// With etcd: lease TTL of this engine's record in ms, whole seconds [5000; 1000..=3600000];
    /// bounds the time until peers see this engine lost when it stops answering.
    pub lease_ttl_ms: Option<f64>,
    /// With etcd: PEM file of the CA that signed etcd's server certificate; turns on TLS
    /// (every endpoint dialled as https) [no TLS; https:// endpoints: the system store].
    pub etcd_ca_file: Option<String>,
    /// With etcd: PEM client certificate, for an etcd with `--client-cert-auth`; turns on
    /// TLS; needs `etcdKeyFile` [none].
    pub etcd_cert_file: Option<String>,
    /// With etcd: PEM private key of `etcdCertFile` [none].
    pub etcd_key_file: Option<String>,
    /// With etcd: user name for etcd's password auth; needs `etcdPassword` or
    /// `etcdPasswordFile` [no auth].
    pub etcd_user: Option<String>,
    /// With etcd: password of `etcdUser` [none].
    pub etcd_password: Option<String>,
    /// With etcd: file holding the password of `etcdUser` (one line) [none].
    pub etcd_password_file: Option<String>,
    /// The cluster secret, at least 32 bytes: every connection proves it both ways before
    /// anything else is exchanged [FERRY_AUTH_SECRET_FILE's content, else the per-user
    /// secret: this user's processes only]. index.ts also takes a Buffer, passed on as
    /// `authSecretHex`.
    pub auth_secret: Option<String>,
    /// The cluster secret's bytes in hex (what index.ts makes of a Buffer `authSecret`).
    pub auth_secret_hex: Option<String>,
    /// Without authSecret, no secret at all, not even the per-user one: anyone who can reach
    /// the engine may use it; needed to listen beyond loopback without a secret [false].
    pub allow_unauthenticated: Option<bool>,
    /// Serve the shm socket to processes of any uid [false: this process's uid only].
    pub shm_any_uid: Option<bool>,
    /// Check every request's bytes end to end with a CRC32C, as a request's `verify` does
    /// [false]; a mismatch fails the request with ERR_FERRY_INTEGRITY.
    pub verify: Option<bool>,
    /// Seal (encrypt and authenticate, AES-256-GCM) every tcp connection: 'auto' seals
    /// those to and from peers beyond loopback, true every one (peers that will not are
    /// refused), false none (peers that require it refuse this engine) ['auto'; 'auto' |
    /// true | false]. Needs a secret (authSecret or the per-user one).
    pub encrypt: Option<Either<bool, String>>,
    /// Authenticated connections open at once, all peers [4096; 1..=1000000]; excess
    /// refused at once.
    pub max_connections: Option<f64>,
    /// Authenticated connections open at once from one address [1024; 1..=1000000].
    pub max_connections_per_address: Option<f64>,
    /// A handshake or a started frame must complete within this many ms [30000; 10..=3600000].
    pub frame_timeout_ms: Option<f64>,
    /// Notifications the receive queue holds; past it they are dropped and counted
    /// (`ferry_notifications_dropped_total`) [1024; 1..=1000000].
    pub notify_queue_size: Option<f64>,
    /// Largest notification payload sent or accepted, in bytes [4096; 1..=65536].
    pub notify_max_bytes: Option<f64>,
}

/// The secret from `authSecret` / `authSecretHex`, else `FERRY_AUTH_SECRET_FILE`.
fn auth_secret(text: Option<String>, hex: Option<String>) -> Result<Option<Secret>, Error> {
    let bytes = match (text, hex) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidArgument(
                "give authSecret or authSecretHex, not both".into(),
            ))
        }
        (Some(t), None) => t.into_bytes(),
        (None, Some(h)) => decode_hex(&h)?,
        (None, None) => return Secret::from_env(),
    };
    Secret::new(bytes).map(Some)
}

fn decode_hex(h: &str) -> Result<Vec<u8>, Error> {
    let bad = || Error::InvalidArgument("authSecretHex must be an even count of hex digits".into());
    if !h.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..h.len())
        .step_by(2)
        .map(|i| {
            h.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// The transports named by the `transports` option, in order, each once.
fn transport_list(list: Vec<String>) -> Result<Vec<TransportKind>, Error> {
    let mut kinds = Vec::new();
    for name in list {
        let kind = transport_named(&name, "transports[]")?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

/// A count given as a whole number or "auto" (`auto` of this machine's cores).
fn opt_auto(
    value: Option<Either<f64, String>>,
    what: &str,
    auto: fn(usize) -> usize,
) -> Result<Option<usize>, Error> {
    match value {
        None => Ok(None),
        Some(Either::A(n)) => opt_int(Some(n), what),
        Some(Either::B(word)) if word == "auto" => Ok(Some(auto(ferry_core::machine_cores()))),
        Some(Either::B(word)) => Err(Error::InvalidArgument(format!(
            "{what} must be a whole number or 'auto', got {word:?}"
        ))),
    }
}

impl TryFrom<EngineOptions> for EngineConfig {
    type Error = Error;
    /// Converts only: defaults come from `EngineConfig::default()` and bounds from
    /// `EngineConfig::validate()` (run here too, so bad options fail before a start).
    fn try_from(o: EngineOptions) -> Result<Self, Error> {
        let (tls, auth) = etcd_access(&o)?;
        let mut c = EngineConfig::default();
        if let Some(v) = o.listen {
            c.listen = v;
        }
        if let Some(v) = opt_ms(o.peer_timeout_ms, "peerTimeoutMs")? {
            c.peer_timeout = v;
        }
        if let Some(v) = opt_auto(o.io_threads, "ioThreads", ferry_core::auto_io_threads)? {
            c.io_threads = v;
        }
        if let Some(list) = o.transports {
            c.transports = transport_list(list)?;
        }
        let rdma = RdmaConfig::try_from(o.rdma.unwrap_or_default())?;
        c.extra_transports = vec![Arc::new(RdmaFactory { config: rdma })];
        if let Some(v) = opt_auto(
            o.connections_per_peer,
            "connectionsPerPeer",
            ferry_core::auto_lanes,
        )? {
            c.tcp.connections_per_peer = v;
        }
        if let Some(v) = opt_u64(o.slice_size, "sliceSize")? {
            c.tcp.slice_size = v;
        }
        if let Some(v) = opt_ms(o.connect_timeout_ms, "connectTimeoutMs")? {
            c.tcp.connect_timeout = v;
        }
        if let Some(v) = o.machine_id {
            c.machine_id = Some(v);
        }
        c.advertise = o.advertise;
        if let Some(v) = opt_int(o.max_failover_attempts, "maxFailoverAttempts")? {
            c.failover.max_failover_attempts = v;
        }
        if let Some(v) = o.enable_auto_failover_on_poll {
            c.failover.auto_failover_on_poll = v;
        }
        if let Some(v) = opt_ms(o.attempt_timeout_ms, "attemptTimeoutMs")? {
            c.failover.attempt_timeout = (!v.is_zero()).then_some(v);
        }
        if let Some(faults) = o.faults {
            c.faults = faults
                .into_iter()
                .map(<(TransportKind, FaultSpec)>::try_from)
                .collect::<Result<_, _>>()?;
        }
        c.metadata = metadata(
            &o.metadata,
            o.metadata_prefix,
            o.segment_name,
            opt_ms(o.lease_ttl_ms, "leaseTtlMs")?,
        )?;
        match &mut c.metadata {
            Some(m) => {
                m.connect_timeout = c.tcp.connect_timeout;
                m.tls = tls;
                m.auth = auth;
            }
            None if tls.is_some() || auth.is_some() => {
                return Err(Error::InvalidArgument(
                    "etcd TLS and auth options need metadata 'etcd://host:port'".into(),
                ))
            }
            None => {}
        }
        c.auth_secret = auth_secret(o.auth_secret, o.auth_secret_hex)?;
        c.allow_unauthenticated = o.allow_unauthenticated.unwrap_or(false);
        c.shm_any_uid = o.shm_any_uid.unwrap_or(false);
        c.verify = o.verify.unwrap_or(false);
        c.encrypt = match o.encrypt {
            None => ferry_core::Encrypt::Auto,
            Some(Either::A(true)) => ferry_core::Encrypt::Always,
            Some(Either::A(false)) => ferry_core::Encrypt::Never,
            Some(Either::B(text)) => match text.as_str() {
                "auto" => ferry_core::Encrypt::Auto,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "encrypt must be 'auto', true or false, got {text:?}"
                    )))
                }
            },
        };
        if let Some(v) = opt_int(o.max_connections, "maxConnections")? {
            c.connections.total = v;
        }
        if let Some(v) = opt_int(o.max_connections_per_address, "maxConnectionsPerAddress")? {
            c.connections.per_address = v;
        }
        if let Some(v) = opt_ms(o.frame_timeout_ms, "frameTimeoutMs")? {
            c.frame_timeout = v;
        }
        if let Some(v) = opt_int(o.notify_queue_size, "notifyQueueSize")? {
            c.notify.queue_size = v;
        }
        if let Some(v) = opt_int(o.notify_max_bytes, "notifyMaxBytes")? {
            c.notify.max_bytes = v;
        }
        c.validate()?;
        Ok(c)
    }
}

/// The TLS and auth settings of the `etcd*` options (files read here, so a bad path is an
/// `InvalidArgument` naming it).
fn etcd_access(o: &EngineOptions) -> Result<(Option<EtcdTls>, Option<EtcdAuth>), Error> {
    let (ca, cert, key) = (
        o.etcd_ca_file.as_deref().map(Path::new),
        o.etcd_cert_file.as_deref().map(Path::new),
        o.etcd_key_file.as_deref().map(Path::new),
    );
    let tls = if ca.is_some() || cert.is_some() || key.is_some() {
        Some(EtcdTls::from_files(ca, cert, key)?)
    } else {
        None
    };
    let auth = match (&o.etcd_user, &o.etcd_password, &o.etcd_password_file) {
        (None, None, None) => None,
        (Some(u), Some(p), None) => Some(EtcdAuth::new(u, p)?),
        (Some(u), None, Some(f)) => Some(EtcdAuth::with_password_file(u, Path::new(f))?),
        (Some(_), Some(_), Some(_)) => {
            return Err(Error::InvalidArgument(
                "give etcdPassword or etcdPasswordFile, not both".into(),
            ))
        }
        _ => {
            return Err(Error::InvalidArgument(
                "etcd auth needs etcdUser and one of etcdPassword, etcdPasswordFile".into(),
            ))
        }
    };
    Ok((tls, auth))
}

/// The etcd settings of the metadata options; `None` for p2p.
fn metadata(
    url: &Option<String>,
    prefix: Option<String>,
    name: Option<String>,
    ttl: Option<std::time::Duration>,
) -> Result<Option<EtcdConfig>, Error> {
    let url = url.as_deref().unwrap_or("p2p");
    if url == "p2p" {
        if prefix.is_some() || name.is_some() || ttl.is_some() {
            return Err(Error::InvalidArgument(
                "metadataPrefix, segmentName and leaseTtlMs need metadata 'etcd://host:port'"
                    .into(),
            ));
        }
        return Ok(None);
    }
    if !url.starts_with("etcd://") {
        return Err(Error::InvalidArgument(format!(
            "metadata must be 'p2p' or 'etcd://host:port[,host:port...]', got {url:?}"
        )));
    }
    let mut cfg = EtcdConfig::from_url(url)?;
    if let Some(p) = prefix {
        cfg.prefix = p;
    }
    cfg.segment_name = name;
    if let Some(ttl) = ttl {
        cfg.lease_ttl = ttl;
    }
    Ok(Some(cfg))
}
