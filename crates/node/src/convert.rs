//! Conversions between JS values and core types. No decisions live here.

use std::path::Path;
use std::sync::Arc;

use ferry_core::auth::Secret;
use ferry_core::handle::{HandleKind, Handles};
use ferry_core::transports::fault::FaultSpec;
use ferry_core::{
    EngineConfig, EngineEvent, Error, EtcdAuth, EtcdConfig, EtcdTls, Metrics, Opcode, Request,
    SegmentInfo, TaskSnapshot, TransportHint, TransportKind,
};
use ferry_verbs::{ProviderChoice, RdmaConfig, RdmaFactory};
use napi_derive::napi;

use crate::js::{opt_int, opt_ms, opt_u64, to_u64};

/// A failure of napi itself (making an object, a Promise) as an `ERR_FERRY_INTERNAL` JS error.
pub(crate) fn internal(e: napi::Error) -> napi::Error<String> {
    napi::Error::new("ERR_FERRY_INTERNAL".to_string(), e.to_string())
}

/// A JS error carrying the core's stable code (`err.code`).
pub(crate) fn js_error(e: Error) -> napi::Error<String> {
    napi::Error::new(e.code().to_string(), e.to_string())
}

/// Engine options. Every field is optional; defaults in brackets, then bounds (checked by
/// the core's `EngineConfig::validate`). An unknown key is refused.
#[napi(object)]
#[derive(Default, Clone)]
pub struct EngineOptions {
    /// Listen address for control and data, `host:port` ["127.0.0.1:0": loopback, any port].
    pub listen: Option<String>,
    /// A silent peer is declared lost after this many ms [3000; 10..=3600000].
    pub peer_timeout_ms: Option<f64>,
    /// I/O threads [2; 1..=64].
    pub io_threads: Option<f64>,
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
    /// TCP data connections per peer [2; 1..=64].
    pub connections_per_peer: Option<f64>,
    /// TCP slice size in bytes [524288; 4096..=1073741824].
    pub slice_size: Option<f64>,
    /// Connect timeout in ms [3000; 1..=600000].
    pub connect_timeout_ms: Option<f64>,
    /// Transport switches allowed per task; 0 disables failover [3; 0..=1000].
    pub max_failover_attempts: Option<f64>,
    /// Whether polled (batch) tasks fail over; the Promise path always does [true].
    pub enable_auto_failover_on_poll: Option<bool>,
    /// Deadline of one attempt in ms; 0 = none [10000; 0..=86400000].
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
    /// anything else is exchanged [FERRY_AUTH_SECRET_FILE's content, else none]. index.ts
    /// also takes a Buffer, passed on as `authSecretHex`.
    pub auth_secret: Option<String>,
    /// The cluster secret's bytes in hex (what index.ts makes of a Buffer `authSecret`).
    pub auth_secret_hex: Option<String>,
    /// Listen beyond loopback without a secret [false: refused].
    pub allow_unauthenticated: Option<bool>,
    /// Serve the shm socket to processes of any uid [false: this process's uid only].
    pub shm_any_uid: Option<bool>,
    /// Connections open at once, all peers [4096; 1..=1000000]; excess refused at once.
    pub max_connections: Option<f64>,
    /// Connections open at once from one address [1024; 1..=1000000].
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
    if h.len() % 2 != 0 {
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

/// RDMA transport settings. Every field is optional; defaults in brackets.
#[napi(object)]
#[derive(Default, Clone)]
pub struct RdmaOptions {
    /// "ibverbs" (real NICs) or "emulated" (the software device for tests)
    /// [FERRY_RDMA_PROVIDER, else "ibverbs"].
    #[napi(ts_type = "'ibverbs' | 'emulated'")]
    pub provider: Option<String>,
    /// Devices that may be used [every device with an active port].
    pub devices: Option<Vec<String>>,
    /// GID index [chosen automatically: RoCE v2 with an IPv4 address first].
    pub gid_index: Option<f64>,
    /// Port number [1].
    pub port: Option<f64>,
    /// Queue pairs per peer [2].
    pub qps_per_peer: Option<f64>,
    /// Bytes per work request [65536].
    pub slice_size: Option<f64>,
    /// Work requests outstanding per queue pair [64].
    pub max_outstanding: Option<f64>,
    /// A slice not completed within this resets its endpoint and fails over [5000].
    pub slice_timeout_ms: Option<f64>,
    /// Fault spec of the emulated device, e.g. "silent_loss=0.1,seed=7"
    /// [FERRY_RDMA_EMULATED_FAULTS, else none].
    pub emulated_faults: Option<String>,
}

impl TryFrom<RdmaOptions> for RdmaConfig {
    type Error = Error;
    fn try_from(o: RdmaOptions) -> Result<Self, Error> {
        let mut c = RdmaConfig::default();
        if let Some(p) = o.provider {
            c.provider = ProviderChoice::parse(&p).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rdma.provider must be 'ibverbs' or 'emulated', got {p:?}"
                ))
            })?;
        }
        if let Some(d) = o.devices {
            c.devices = d;
        }
        c.gid_index = opt_int(o.gid_index, "rdma.gidIndex")?;
        if let Some(p) = opt_int::<u8>(o.port, "rdma.port")? {
            c.port = p;
        }
        if let Some(v) = opt_int(o.qps_per_peer, "rdma.qpsPerPeer")? {
            c.qps_per_peer = v;
        }
        if let Some(v) = opt_int(o.slice_size, "rdma.sliceSize")? {
            c.slice_size = v;
        }
        if let Some(v) = opt_int(o.max_outstanding, "rdma.maxOutstanding")? {
            c.max_outstanding = v;
        }
        if let Some(v) = opt_ms(o.slice_timeout_ms, "rdma.sliceTimeoutMs")? {
            c.slice_timeout = v;
        }
        c.emulated_faults = o.emulated_faults;
        c.validate().map_err(Error::InvalidArgument)?;
        Ok(c)
    }
}

/// Fault injection on one transport.
#[napi(object)]
#[derive(Default, Clone)]
pub struct FaultOptions {
    /// "tcp", "shm" or "rdma".
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: String,
    /// Probability that submitting a request fails [0].
    pub submit_failure_rate: Option<f64>,
    /// Every submission after this many fails [never].
    pub fail_after_submits: Option<f64>,
    /// Probability that a completed attempt is reported FAILED [0].
    pub corrupt_completion_rate: Option<f64>,
    /// Delay before each submission, in ms [0].
    pub delay_ms: Option<f64>,
    /// The transport fails to install [false].
    pub fail_install: Option<bool>,
    /// Seed of the random choices [0].
    pub seed: Option<f64>,
}

fn rate(v: Option<f64>, what: &str) -> Result<f64, Error> {
    match v {
        None => Ok(0.0),
        Some(r) if (0.0..=1.0).contains(&r) => Ok(r),
        Some(r) => Err(Error::InvalidArgument(format!(
            "{what} must be in 0..=1, got {r}"
        ))),
    }
}

impl TryFrom<FaultOptions> for (TransportKind, FaultSpec) {
    type Error = Error;
    fn try_from(f: FaultOptions) -> Result<Self, Error> {
        let kind = transport(&f.transport, "faults[].transport")?;
        Ok((
            kind,
            FaultSpec {
                submit_failure_rate: rate(f.submit_failure_rate, "faults[].submitFailureRate")?,
                fail_after_submits: opt_u64(f.fail_after_submits, "faults[].failAfterSubmits")?,
                corrupt_completion_rate: rate(
                    f.corrupt_completion_rate,
                    "faults[].corruptCompletionRate",
                )?,
                delay: opt_ms(f.delay_ms, "faults[].delayMs")?.filter(|d| !d.is_zero()),
                fail_install: f.fail_install.unwrap_or(false),
                seed: opt_u64(f.seed, "faults[].seed")?.unwrap_or(0),
            },
        ))
    }
}

/// The transports named by the `transports` option, in order, each once.
fn transport_list(list: Vec<String>) -> Result<Vec<TransportKind>, Error> {
    let mut kinds = Vec::new();
    for name in list {
        let kind = transport(&name, "transports[]")?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
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
        if let Some(v) = opt_int(o.io_threads, "ioThreads")? {
            c.io_threads = v;
        }
        if let Some(list) = o.transports {
            c.transports = transport_list(list)?;
        }
        let rdma = RdmaConfig::try_from(o.rdma.unwrap_or_default())?;
        c.extra_transports = vec![Arc::new(RdmaFactory { config: rdma })];
        if let Some(v) = opt_int(o.connections_per_peer, "connectionsPerPeer")? {
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

/// One transfer request.
#[napi(object)]
pub struct TransferRequest {
    /// "read" or "write".
    pub opcode: String,
    /// Local region id.
    pub local: f64,
    /// Offset in the local region [0].
    pub local_offset: Option<f64>,
    /// Segment handle from openSegment.
    pub segment: f64,
    /// Remote buffer id [0].
    pub remote_buffer: Option<f64>,
    /// Offset in the remote buffer [0].
    pub remote_offset: Option<f64>,
    /// Bytes to move.
    pub length: f64,
    /// Transport to try first (fallback allowed).
    pub transport: Option<String>,
    /// The only transport that may serve the request (no fallback).
    pub require_transport: Option<String>,
}

/// A transport name from JS.
pub(crate) fn transport(name: &str, what: &str) -> Result<TransportKind, Error> {
    TransportKind::parse(name).ok_or_else(|| {
        Error::InvalidArgument(format!("{what} must be tcp, shm or rdma, got {name:?}"))
    })
}

/// One request, its region and segment handles checked to be this engine's.
fn request(r: &TransferRequest, handles: &Handles) -> Result<Request, Error> {
    Ok(Request {
        opcode: Opcode::parse(&r.opcode)?,
        local: handles.decode(HandleKind::Region, to_u64(r.local, "local")?)?,
        local_offset: to_u64(r.local_offset.unwrap_or(0.0), "localOffset")?,
        segment: handles.decode(HandleKind::Segment, to_u64(r.segment, "segment")?)?,
        remote_buffer: to_u64(r.remote_buffer.unwrap_or(0.0), "remoteBuffer")?,
        remote_offset: to_u64(r.remote_offset.unwrap_or(0.0), "remoteOffset")?,
        length: to_u64(r.length, "length")?,
        hint: TransportHint::from_fields(
            r.transport
                .as_deref()
                .map(|t| transport(t, "transport"))
                .transpose()?,
            r.require_transport
                .as_deref()
                .map(|t| transport(t, "requireTransport"))
                .transpose()?,
        )
        .map_err(Error::InvalidArgument)?,
    })
}

/// Every request of a call; a bad one names its index.
pub(crate) fn requests(list: &[TransferRequest], handles: &Handles) -> Result<Vec<Request>, Error> {
    if list.is_empty() {
        return Err(Error::InvalidArgument("no requests given".into()));
    }
    list.iter()
        .enumerate()
        .map(|(i, r)| {
            request(r, handles).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("request {i}: {m}")),
                Error::ForeignHandle(m) => Error::ForeignHandle(format!("request {i}: {m}")),
                other => other,
            })
        })
        .collect()
}

/// Status of one task.
#[napi(object)]
pub struct TaskStatus {
    /// Raw status (TENT numbering).
    pub status: u32,
    /// Status name.
    pub name: String,
    /// Bytes moved (a lower bound while pending).
    pub transferred_bytes: f64,
    /// Requested bytes.
    pub length: f64,
    /// Transport of the latest attempt.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: Option<String>,
    /// Attempts made.
    pub attempts: u32,
    /// Error code when it did not complete.
    pub code: Option<String>,
    /// Error message when it did not complete.
    pub message: Option<String>,
}

impl From<TaskSnapshot> for TaskStatus {
    fn from(s: TaskSnapshot) -> Self {
        Self {
            status: u32::from(s.status.raw()),
            name: s.status.name().to_string(),
            transferred_bytes: s.transferred as f64,
            length: s.length as f64,
            transport: s.transport.map(|t| t.name().to_string()),
            attempts: s.attempts,
            code: s.error.as_ref().map(|e| e.code().to_string()),
            message: s.error.as_ref().map(|e| e.to_string()),
        }
    }
}

/// Aggregate status of a batch.
#[napi(object)]
pub struct BatchStatus {
    /// Raw status.
    pub status: u32,
    /// Status name.
    pub name: String,
    /// Bytes moved.
    pub transferred_bytes: f64,
    /// Tasks in the batch.
    pub tasks: u32,
}

/// A local region as JS sees it.
#[napi(object)]
pub struct RegionInfo {
    /// Handle of the region in requests (names this engine).
    pub handle: f64,
    /// Buffer id: what peers name in `remoteBuffer`.
    pub id: f64,
    /// Length in bytes.
    pub length: f64,
}

/// A buffer of a remote segment.
#[napi(object)]
pub struct RemoteBuffer {
    /// Buffer id.
    pub id: f64,
    /// Length in bytes.
    pub length: f64,
    /// "read-only" or "read-write".
    #[napi(ts_type = "'read-only' | 'read-write'")]
    pub access: String,
    /// Transports it is registered with.
    #[napi(ts_type = "Array<'tcp' | 'shm' | 'rdma'>")]
    pub transports: Vec<String>,
}

/// An opened segment.
#[napi(object)]
pub struct SegmentDesc {
    /// Handle for requests.
    pub handle: f64,
    /// Segment name.
    pub name: String,
    /// Peer engine id (hex).
    pub engine_id: String,
    /// Exposed buffers.
    pub buffers: Vec<RemoteBuffer>,
}

impl SegmentDesc {
    /// The JS view of an opened segment, its handle encoded in this engine's space.
    pub(crate) fn new(s: SegmentInfo, handles: &Handles) -> Self {
        Self {
            handle: handles.encode(HandleKind::Segment, s.handle) as f64,
            name: s.name,
            engine_id: format!("{:016x}", s.engine_id),
            buffers: s
                .buffers
                .into_iter()
                .map(|b| RemoteBuffer {
                    id: b.id as f64,
                    length: b.length as f64,
                    access: match b.access {
                        ferry_core::Access::ReadOnly => "read-only".into(),
                        ferry_core::Access::ReadWrite => "read-write".into(),
                    },
                    transports: b.transports.iter().map(|t| t.name().to_string()).collect(),
                })
                .collect(),
        }
    }
}

/// Outcome of openSegment (a value; the TypeScript layer turns failures into rejections).
#[napi(object)]
#[derive(Default)]
pub struct OpenResult {
    /// The segment, when it opened.
    pub segment: Option<SegmentDesc>,
    /// Error code otherwise.
    pub code: Option<String>,
    /// Error message otherwise.
    pub message: Option<String>,
}

/// An engine event.
#[napi(object)]
pub struct EngineEventJs {
    /// "peerLost", "peerRecovered", "failover" or "transportDisabled".
    pub kind: String,
    /// Segment name (absent for a transport that failed to install).
    pub segment: Option<String>,
    /// Reason, for peerLost, failover and transportDisabled.
    pub reason: Option<String>,
    /// Failover: transport of the failed attempt.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub from: Option<String>,
    /// Failover: transport of the new attempt.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub to: Option<String>,
    /// Failover: switches made by the task, this one included.
    pub attempt: Option<u32>,
    /// transportDisabled: the transport.
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: Option<String>,
    /// transportDisabled: end of the pause, ms since the Unix epoch.
    pub until_ms: Option<f64>,
}

impl EngineEventJs {
    fn new(kind: &str, segment: Option<String>) -> Self {
        Self {
            kind: kind.into(),
            segment,
            reason: None,
            from: None,
            to: None,
            attempt: None,
            transport: None,
            until_ms: None,
        }
    }
}

impl From<EngineEvent> for EngineEventJs {
    fn from(e: EngineEvent) -> Self {
        match e {
            EngineEvent::PeerLost { segment, reason } => Self {
                reason: Some(reason),
                ..Self::new("peerLost", Some(segment))
            },
            EngineEvent::PeerRecovered { segment } => Self::new("peerRecovered", Some(segment)),
            EngineEvent::Failover {
                segment,
                from,
                to,
                attempt,
                reason,
            } => Self {
                reason: Some(reason),
                from: Some(from.name().into()),
                to: Some(to.name().into()),
                attempt: Some(attempt),
                ..Self::new("failover", Some(segment))
            },
            EngineEvent::TransportDisabled {
                transport,
                segment,
                reason,
                until_ms,
            } => Self {
                reason: Some(reason),
                transport: Some(transport.name().into()),
                until_ms: until_ms.map(|v| v as f64),
                ..Self::new("transportDisabled", segment)
            },
            _ => Self::new("unknown", None),
        }
    }
}

/// Bytes of completed transfers over one transport for one operation.
#[napi(object)]
pub struct BytesByTransport {
    /// "tcp", "shm" or "rdma".
    #[napi(ts_type = "'tcp' | 'shm' | 'rdma'")]
    pub transport: String,
    /// "read" or "write".
    #[napi(ts_type = "'read' | 'write'")]
    pub op: String,
    /// Bytes.
    pub bytes: f64,
}

/// Engine counters.
#[napi(object)]
pub struct EngineMetrics {
    /// Tasks submitted.
    pub tasks_submitted: f64,
    /// Tasks completed.
    pub tasks_completed: f64,
    /// Tasks that ended otherwise.
    pub tasks_failed: f64,
    /// Bytes moved by completed tasks.
    pub bytes_transferred: f64,
    /// Bytes of completed tasks by transport and op.
    pub bytes: Vec<BytesByTransport>,
    /// Tasks that ended, by final status name in lower case (completed, failed, timeout,
    /// canceled, invalid).
    pub transfers: std::collections::HashMap<String, f64>,
    /// Transfers submitted and not yet ended.
    pub inflight: f64,
    /// Times a peer was declared lost.
    pub peers_lost: f64,
    /// Times a lost peer answered again.
    pub peers_recovered: f64,
    /// Attempts that failed over.
    pub failovers: f64,
    /// Attempts that passed their deadline.
    pub attempt_timeouts: f64,
    /// Times the rail monitor took a (peer, transport) path out of use.
    pub transports_disabled: f64,
    /// Remote segments open.
    pub segments_open: f64,
    /// Registered regions.
    pub regions: f64,
    /// Notifications handed to a peer's outbox.
    pub notifications_sent: f64,
    /// Notifications their target acknowledged.
    pub notifications_delivered: f64,
    /// Notifications whose delivery failed.
    pub notifications_failed: f64,
    /// Notifications received and queued here.
    pub notifications_received: f64,
    /// Notifications dropped here: the receive queue was full.
    pub notifications_dropped: f64,
    /// Notifications waiting in the receive queue.
    pub notifications_queued: f64,
    /// Connections that failed the cluster-secret handshake, by reason (every reason,
    /// zeros too; `ferry_auth_failures_total{reason}`).
    pub auth_failures: std::collections::HashMap<String, f64>,
    /// Connections refused at once by a cap, by which (`total`, `per_address`).
    pub connections_refused: std::collections::HashMap<String, f64>,
}

fn by_reason(counts: &[(&'static str, u64)]) -> std::collections::HashMap<String, f64> {
    counts
        .iter()
        .map(|(r, n)| ((*r).to_string(), *n as f64))
        .collect()
}

impl From<Metrics> for EngineMetrics {
    fn from(m: Metrics) -> Self {
        Self {
            tasks_submitted: m.tasks_submitted as f64,
            tasks_completed: m.tasks_completed as f64,
            tasks_failed: m.tasks_failed as f64,
            bytes_transferred: m.bytes_transferred as f64,
            bytes: m
                .bytes_by
                .iter()
                .map(|b| BytesByTransport {
                    transport: b.transport.name().into(),
                    op: match b.op {
                        Opcode::Read => "read".into(),
                        Opcode::Write => "write".into(),
                    },
                    bytes: b.bytes as f64,
                })
                .collect(),
            transfers: m
                .transfers_by_status
                .iter()
                .map(|(s, n)| (s.name().to_ascii_lowercase(), *n as f64))
                .collect(),
            inflight: m.inflight as f64,
            peers_lost: m.peers_lost as f64,
            peers_recovered: m.peers_recovered as f64,
            failovers: m.failovers as f64,
            attempt_timeouts: m.attempt_timeouts as f64,
            transports_disabled: m.transports_disabled as f64,
            segments_open: m.segments_open as f64,
            regions: m.regions as f64,
            notifications_sent: m.notifications.sent as f64,
            notifications_delivered: m.notifications.delivered as f64,
            notifications_failed: m.notifications.failed as f64,
            notifications_received: m.notifications.received as f64,
            notifications_dropped: m.notifications.dropped as f64,
            notifications_queued: m.notifications.queued as f64,
            auth_failures: by_reason(&m.auth_failures),
            connections_refused: by_reason(&m.connections_refused),
        }
    }
}
