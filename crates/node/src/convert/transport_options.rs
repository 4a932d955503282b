//! The per-transport parts of the engine options: RDMA settings and fault injection.

use ferry_core::transports::fault::FaultSpec;
use ferry_core::{Error, TransportKind};
use ferry_verbs::{ProviderChoice, RdmaConfig};
use napi_derive::napi;

use crate::js::{opt_int, opt_ms, opt_u64};

/// A transport named in the engine options (`transports`, `faults[].transport`). Options
/// are the one place transports come by name: `EngineOptions` is the public options type
/// itself, read once per engine; requests, block lists and bench cases carry numbers.
pub(super) fn transport_named(name: &str, what: &str) -> Result<TransportKind, Error> {
    TransportKind::parse(name).ok_or_else(|| {
        Error::InvalidArgument(format!("{what} must be tcp, shm or rdma, got {name:?}"))
    })
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
        let kind = transport_named(&f.transport, "faults[].transport")?;
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
