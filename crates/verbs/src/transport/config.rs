//! RDMA transport settings and the choice of provider.

use std::sync::Arc;
use std::time::Duration;

use crate::provider::Provider;

/// Which verbs implementation to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderChoice {
    /// `FERRY_RDMA_PROVIDER` when set (`ibverbs` or `emulated`), else the real libibverbs.
    Auto,
    /// The system's libibverbs (real NICs).
    Ibverbs,
    /// The software device (tests, machines without NICs). Never chosen silently.
    Emulated,
}

impl ProviderChoice {
    /// Parses `auto`, `ibverbs` or `emulated`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "ibverbs" => Some(Self::Ibverbs),
            "emulated" => Some(Self::Emulated),
            _ => None,
        }
    }

    /// Resolves `Auto` with the environment variable's value.
    pub fn resolve(self, env: Option<&str>) -> Result<Self, String> {
        match (self, env) {
            (Self::Auto, None) | (Self::Auto, Some("")) => Ok(Self::Ibverbs),
            (Self::Auto, Some(v)) => match Self::parse(v) {
                Some(Self::Auto) | None => Err(format!(
                    "FERRY_RDMA_PROVIDER must be 'ibverbs' or 'emulated', got {v:?}"
                )),
                Some(c) => Ok(c),
            },
            (c, _) => Ok(c),
        }
    }
}

/// RDMA transport settings. The defaults are documented in docs/configuration.md.
#[derive(Clone)]
pub struct RdmaConfig {
    /// Verbs implementation.
    pub provider: ProviderChoice,
    /// Devices that may be used (empty = every device with an active port).
    pub devices: Vec<String>,
    /// GID index; chosen automatically when `None` (RoCE v2 with an IPv4 address first).
    pub gid_index: Option<u32>,
    /// Port number (1-based).
    pub port: u8,
    /// Queue pairs per peer (slices are spread over them, and over devices).
    pub qps_per_peer: usize,
    /// Bytes per RDMA work request.
    pub slice_size: usize,
    /// Work requests outstanding per queue pair; more wait in a backlog.
    pub max_outstanding: u32,
    /// A slice not completed within this is failed and its endpoint reset.
    pub slice_timeout: Duration,
    /// Local ACK timeout exponent (4.096 µs × 2^n).
    pub ack_timeout: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR`.
    pub retry_cnt: u8,
    /// Handshake and reconnect timeout.
    pub connect_timeout: Duration,
    /// The target side of a connection is released once its initiator has held no
    /// control connection here for this long (it closed the segment or died).
    pub passive_grace: Duration,
    /// Fault spec for the emulated device (see `EmulatedFaults::parse`); also read from
    /// `FERRY_RDMA_EMULATED_FAULTS`.
    pub emulated_faults: Option<String>,
    /// A provider instance to use instead of `provider` (tests).
    pub provider_instance: Option<Arc<dyn Provider>>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            provider: ProviderChoice::Auto,
            devices: Vec::new(),
            gid_index: None,
            port: 1,
            qps_per_peer: 2,
            slice_size: 64 << 10,
            max_outstanding: 64,
            slice_timeout: Duration::from_secs(5),
            ack_timeout: 14,
            retry_cnt: 7,
            connect_timeout: Duration::from_secs(5),
            passive_grace: Duration::from_secs(10),
            emulated_faults: None,
            provider_instance: None,
        }
    }
}

impl std::fmt::Debug for RdmaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConfig")
            .field("provider", &self.provider)
            .field("devices", &self.devices)
            .field("gid_index", &self.gid_index)
            .field("port", &self.port)
            .field("qps_per_peer", &self.qps_per_peer)
            .field("slice_size", &self.slice_size)
            .field("max_outstanding", &self.max_outstanding)
            .field("slice_timeout", &self.slice_timeout)
            .field("emulated_faults", &self.emulated_faults)
            .field(
                "provider_instance",
                &self.provider_instance.as_ref().map(|p| p.name()),
            )
            .finish()
    }
}

impl RdmaConfig {
    /// Checks the numbers; the message names the bad setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.qps_per_peer == 0 || self.qps_per_peer > 64 {
            return Err("rdma.qpsPerPeer must be in 1..=64".into());
        }
        if self.slice_size < 4096 || self.slice_size > (1 << 30) {
            return Err("rdma.sliceSize must be in 4 KiB..=1 GiB".into());
        }
        if self.max_outstanding == 0 || self.max_outstanding > 4096 {
            return Err("rdma.maxOutstanding must be in 1..=4096".into());
        }
        if self.slice_timeout < Duration::from_millis(10) {
            return Err("rdma.sliceTimeoutMs must be >= 10".into());
        }
        if self.port == 0 {
            return Err("rdma.port is 1-based".into());
        }
        if self.ack_timeout > 31 || self.retry_cnt > 7 {
            return Err("rdma ack timeout must be <= 31 and retry count <= 7".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_environment() {
        let auto = ProviderChoice::Auto;
        assert_eq!(auto.resolve(None), Ok(ProviderChoice::Ibverbs));
        assert_eq!(auto.resolve(Some("emulated")), Ok(ProviderChoice::Emulated));
        assert_eq!(auto.resolve(Some("ibverbs")), Ok(ProviderChoice::Ibverbs));
        assert!(auto.resolve(Some("soft")).is_err());
        assert!(auto.resolve(Some("auto")).is_err());
        // An explicit choice wins over the environment.
        assert_eq!(
            ProviderChoice::Ibverbs.resolve(Some("emulated")),
            Ok(ProviderChoice::Ibverbs)
        );
    }

    #[test]
    fn bad_numbers_are_named() {
        let mut c = RdmaConfig::default();
        assert!(c.validate().is_ok());
        c.slice_size = 100;
        assert!(c.validate().unwrap_err().contains("sliceSize"));
        c = RdmaConfig {
            qps_per_peer: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("qpsPerPeer"));
    }
}
