//! Conversions between JS values and core types. No decisions live here.

use std::sync::Arc;

use ferry_core::transports::fault::FaultSpec;
use ferry_core::{
    EngineConfig, EngineEvent, Error, EtcdConfig, Metrics, Opcode, Request, SegmentInfo,
    TaskSnapshot, TransportKind,
};
use ferry_verbs::{ProviderChoice, RdmaConfig, RdmaFactory};
use napi_derive::napi;

/// A JS error carrying the core's stable code (`err.code`).
pub(crate) fn js_error(e: Error) -> napi::Error<String> {
    napi::Error::new(e.code().to_string(), e.to_string())
}

/// A JS number that must be a non-negative integer (exact in a double).
pub(crate) fn to_u64(value: f64, what: &str) -> Result<u64, Error> {
    if value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value <= 9_007_199_254_740_991.0
    {
        Ok(value as u64)
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} must be a non-negative integer, got {value}"
        )))
    }
}

/// Engine options. Every field is optional; defaults in brackets.
#[napi(object)]
#[derive(Default)]
pub struct EngineOptions {
    /// Listen address for control and data, `host:port` ["127.0.0.1:0": loopback, any port].
    pub listen: Option<String>,
    /// A silent peer is declared lost after this many ms [3000].
    pub peer_timeout_ms: Option<u32>,
    /// I/O threads [2].
    pub io_threads: Option<u32>,
    /// Enabled transports, of "tcp", "shm", "rdma" [["shm", "rdma", "tcp"]]; rdma is
    /// disabled with one log line where no RDMA device (or no libibverbs) is present.
    pub transports: Option<Vec<String>>,
    /// RDMA settings [see RdmaOptions].
    pub rdma: Option<RdmaOptions>,
    /// Overrides the machine identity used for same-host detection (tests) [auto].
    pub machine_id: Option<String>,
    /// The address peers reach this engine at, `host` or `host:port` (needed when listening
    /// on 0.0.0.0, e.g. in cluster mode) [the bound address].
    pub advertise: Option<String>,
    /// TCP data connections per peer [2].
    pub connections_per_peer: Option<u32>,
    /// TCP slice size in bytes [1048576].
    pub slice_size: Option<u32>,
    /// Connect timeout in ms [3000].
    pub connect_timeout_ms: Option<u32>,
    /// Transport switches allowed per task; 0 disables failover [3].
    pub max_failover_attempts: Option<u32>,
    /// Whether polled (batch) tasks fail over; the Promise path always does [true].
    pub enable_auto_failover_on_poll: Option<bool>,
    /// Deadline of one attempt in ms; 0 = none [10000].
    pub attempt_timeout_ms: Option<u32>,
    /// Fault injection per transport, for tests and benchmarks [none].
    pub faults: Option<Vec<FaultOptions>>,
    /// Metadata service: "p2p" (segment names are host:port), or
    /// "etcd://host:port[,host:port...]" for cluster mode ["p2p"].
    pub metadata: Option<String>,
    /// With etcd: key prefix of the segment records ["/ferry/segments/"].
    pub metadata_prefix: Option<String>,
    /// With etcd: the logical name this engine is published under [its host:port].
    pub segment_name: Option<String>,
    /// With etcd: lease TTL of this engine's record in ms, whole seconds, >= 1000; bounds
    /// the time until peers see this engine lost when it stops answering [5000].
    pub lease_ttl_ms: Option<u32>,
}

/// RDMA transport settings. Every field is optional; defaults in brackets.
#[napi(object)]
#[derive(Default)]
pub struct RdmaOptions {
    /// "ibverbs" (real NICs) or "emulated" (the software device for tests)
    /// [FERRY_RDMA_PROVIDER, else "ibverbs"].
    pub provider: Option<String>,
    /// Devices that may be used [every device with an active port].
    pub devices: Option<Vec<String>>,
    /// GID index [chosen automatically: RoCE v2 with an IPv4 address first].
    pub gid_index: Option<u32>,
    /// Port number [1].
    pub port: Option<u32>,
    /// Queue pairs per peer [2].
    pub qps_per_peer: Option<u32>,
    /// Bytes per work request [65536].
    pub slice_size: Option<u32>,
    /// Work requests outstanding per queue pair [64].
    pub max_outstanding: Option<u32>,
    /// A slice not completed within this resets its endpoint and fails over [5000].
    pub slice_timeout_ms: Option<u32>,
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
        c.gid_index = o.gid_index;
        if let Some(p) = o.port {
            c.port = u8::try_from(p)
                .map_err(|_| Error::InvalidArgument("rdma.port must be <= 255".into()))?;
        }
        if let Some(v) = o.qps_per_peer {
            c.qps_per_peer = v as usize;
        }
        if let Some(v) = o.slice_size {
            c.slice_size = v as usize;
        }
        if let Some(v) = o.max_outstanding {
            c.max_outstanding = v;
        }
        if let Some(v) = o.slice_timeout_ms {
            c.slice_timeout = std::time::Duration::from_millis(u64::from(v));
        }
        c.emulated_faults = o.emulated_faults;
        c.validate().map_err(Error::InvalidArgument)?;
        Ok(c)
    }
}

/// Fault injection on one transport.
#[napi(object)]
#[derive(Default)]
pub struct FaultOptions {
    /// "tcp", "shm" or "rdma".
    pub transport: String,
    /// Probability that submitting a request fails [0].
    pub submit_failure_rate: Option<f64>,
    /// Every submission after this many fails [never].
    pub fail_after_submits: Option<u32>,
    /// Probability that a completed attempt is reported FAILED [0].
    pub corrupt_completion_rate: Option<f64>,
    /// Delay before each submission, in ms [0].
    pub delay_ms: Option<u32>,
    /// The transport fails to install [false].
    pub fail_install: Option<bool>,
    /// Seed of the random choices [0].
    pub seed: Option<u32>,
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
        let kind = TransportKind::parse(&f.transport).ok_or_else(|| {
            Error::InvalidArgument(format!("unknown transport {:?}", f.transport))
        })?;
        Ok((
            kind,
            FaultSpec {
                submit_failure_rate: rate(f.submit_failure_rate, "submitFailureRate")?,
                fail_after_submits: f.fail_after_submits.map(u64::from),
                corrupt_completion_rate: rate(f.corrupt_completion_rate, "corruptCompletionRate")?,
                delay: f
                    .delay_ms
                    .filter(|d| *d > 0)
                    .map(|d| std::time::Duration::from_millis(u64::from(d))),
                fail_install: f.fail_install.unwrap_or(false),
                seed: u64::from(f.seed.unwrap_or(0)),
            },
        ))
    }
}

impl TryFrom<EngineOptions> for EngineConfig {
    type Error = Error;
    fn try_from(o: EngineOptions) -> Result<Self, Error> {
        let mut c = EngineConfig::default();
        if let Some(v) = o.listen {
            c.listen = v;
        }
        if let Some(v) = o.peer_timeout_ms {
            c.peer_timeout = std::time::Duration::from_millis(u64::from(v));
        }
        if let Some(v) = o.io_threads {
            if v == 0 {
                return Err(Error::InvalidArgument("ioThreads must be >= 1".into()));
            }
            c.io_threads = v as usize;
        }
        c.transports = vec![TransportKind::Shm, TransportKind::Rdma, TransportKind::Tcp];
        if let Some(list) = o.transports {
            let mut kinds = Vec::new();
            for name in list {
                let kind = TransportKind::parse(&name)
                    .ok_or_else(|| Error::InvalidArgument(format!("unknown transport {name:?}")))?;
                if !kinds.contains(&kind) {
                    kinds.push(kind);
                }
            }
            if kinds.is_empty() {
                return Err(Error::InvalidArgument(
                    "transports must name at least one of shm, rdma, tcp".into(),
                ));
            }
            c.transports = kinds;
        }
        let rdma = RdmaConfig::try_from(o.rdma.unwrap_or_default())?;
        c.extra_transports = vec![Arc::new(RdmaFactory { config: rdma })];
        if let Some(v) = o.connections_per_peer {
            if v == 0 || v > 64 {
                return Err(Error::InvalidArgument(
                    "connectionsPerPeer must be in 1..=64".into(),
                ));
            }
            c.tcp.connections_per_peer = v as usize;
        }
        if let Some(v) = o.slice_size {
            if v < 4096 {
                return Err(Error::InvalidArgument("sliceSize must be >= 4096".into()));
            }
            c.tcp.slice_size = u64::from(v);
        }
        if let Some(v) = o.connect_timeout_ms {
            c.tcp.connect_timeout = std::time::Duration::from_millis(u64::from(v.max(1)));
        }
        if let Some(v) = o.machine_id {
            c.machine_id = Some(v);
        }
        c.advertise = o.advertise;
        if let Some(v) = o.max_failover_attempts {
            c.failover.max_failover_attempts = v;
        }
        if let Some(v) = o.enable_auto_failover_on_poll {
            c.failover.auto_failover_on_poll = v;
        }
        if let Some(v) = o.attempt_timeout_ms {
            c.failover.attempt_timeout =
                (v > 0).then(|| std::time::Duration::from_millis(u64::from(v)));
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
            o.lease_ttl_ms,
        )?;
        if let Some(m) = &mut c.metadata {
            m.connect_timeout = c.tcp.connect_timeout;
        }
        Ok(c)
    }
}

/// The etcd settings of the metadata options; `None` for p2p.
fn metadata(
    url: &Option<String>,
    prefix: Option<String>,
    name: Option<String>,
    ttl_ms: Option<u32>,
) -> Result<Option<EtcdConfig>, Error> {
    let url = url.as_deref().unwrap_or("p2p");
    if url == "p2p" {
        if prefix.is_some() || name.is_some() || ttl_ms.is_some() {
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
        if p.is_empty() {
            return Err(Error::InvalidArgument(
                "metadataPrefix must not be empty".into(),
            ));
        }
        cfg.prefix = p;
    }
    cfg.segment_name = name;
    if let Some(ms) = ttl_ms {
        if ms < 1000 || ms % 1000 != 0 {
            return Err(Error::InvalidArgument(format!(
                "leaseTtlMs must be whole seconds >= 1000, got {ms}"
            )));
        }
        cfg.lease_ttl = std::time::Duration::from_millis(u64::from(ms));
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
    /// Transport hint for the first attempt.
    pub transport: Option<String>,
    /// Only `transport` may serve the request (no fallback) [false].
    pub require_transport: Option<bool>,
}

impl TryFrom<&TransferRequest> for Request {
    type Error = Error;
    fn try_from(r: &TransferRequest) -> Result<Self, Error> {
        Ok(Request {
            opcode: Opcode::parse(&r.opcode)?,
            local: to_u64(r.local, "local")?,
            local_offset: to_u64(r.local_offset.unwrap_or(0.0), "localOffset")?,
            segment: to_u64(r.segment, "segment")?,
            remote_buffer: to_u64(r.remote_buffer.unwrap_or(0.0), "remoteBuffer")?,
            remote_offset: to_u64(r.remote_offset.unwrap_or(0.0), "remoteOffset")?,
            length: to_u64(r.length, "length")?,
            transport: match &r.transport {
                None => None,
                Some(t) => {
                    Some(TransportKind::parse(t).ok_or_else(|| {
                        Error::InvalidArgument(format!("unknown transport {t:?}"))
                    })?)
                }
            },
            require_transport: r.require_transport.unwrap_or(false),
        })
    }
}

pub(crate) fn requests(list: &[TransferRequest]) -> Result<Vec<Request>, Error> {
    list.iter()
        .enumerate()
        .map(|(i, r)| {
            Request::try_from(r).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("request {i}: {m}")),
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

/// A buffer of a remote segment.
#[napi(object)]
pub struct RemoteBuffer {
    /// Buffer id.
    pub id: f64,
    /// Length in bytes.
    pub length: f64,
    /// "read-only" or "read-write".
    pub access: String,
    /// Transports it is registered with.
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

impl From<SegmentInfo> for SegmentDesc {
    fn from(s: SegmentInfo) -> Self {
        Self {
            handle: s.handle as f64,
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
    pub from: Option<String>,
    /// Failover: transport of the new attempt.
    pub to: Option<String>,
    /// Failover: switches made by the task, this one included.
    pub attempt: Option<u32>,
    /// transportDisabled: the transport.
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
    pub transport: String,
    /// "read" or "write".
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
    /// Tasks submitted and not yet ended.
    pub inflight: f64,
    /// Times a peer was declared lost.
    pub peers_lost: f64,
    /// Times a lost peer answered again.
    pub peers_recovered: f64,
    /// Attempts that failed over.
    pub failovers: f64,
    /// Attempts that passed their deadline.
    pub attempt_timeouts: f64,
    /// Times the rail monitor paused a (peer, transport) path.
    pub transports_disabled: f64,
    /// Remote segments open.
    pub segments_open: f64,
    /// Registered regions.
    pub regions: f64,
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
        }
    }
}
