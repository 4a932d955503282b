//! The devices this engine uses: choosing the provider, opening each allowed device with
//! an active port and a usable GID, and making queue pairs on one (moved to INIT, with what
//! the peer needs to connect). An I/O shell over the provider; which device is allowed and
//! why none could be used are decided by the pure functions at the bottom.

use std::sync::Arc;

use super::config::{ProviderChoice, RdmaConfig};
use super::gid::{self, choose_gid_index, gid_hex, GidEntry};
use super::handshake::{self, Bringup, EndpointInfo};
use super::Shared;
use crate::provider::{
    port_state, CompletionQueue, Context, Gid, ProtectionDomain, Provider, QpCaps, QueuePair,
    VerbsError,
};

/// An opened device with its protection domain.
pub(super) struct Device {
    pub(super) name: String,
    ctx: Arc<dyn Context>,
    pub(super) pd: Arc<dyn ProtectionDomain>,
    pub(super) gid: Gid,
    gid_index: u32,
    pub(super) lid: u16,
    pub(super) mtu: u32,
}

/// A queue pair in INIT, its completion queue, and what the peer needs to connect to it.
type NewQueuePair = (Arc<dyn QueuePair>, Arc<dyn CompletionQueue>, EndpointInfo);

pub(super) fn open_provider(config: &RdmaConfig) -> std::result::Result<Arc<dyn Provider>, String> {
    if let Some(p) = &config.provider_instance {
        return Ok(p.clone());
    }
    let env = std::env::var("FERRY_RDMA_PROVIDER").ok();
    match config.provider.resolve(env.as_deref())? {
        #[cfg(not(target_os = "linux"))]
        ProviderChoice::Emulated => Err("the emulated verbs device is only built on Linux".into()),
        #[cfg(target_os = "linux")]
        ProviderChoice::Emulated => {
            let spec = config
                .emulated_faults
                .clone()
                .or_else(|| std::env::var("FERRY_RDMA_EMULATED_FAULTS").ok())
                .unwrap_or_default();
            let faults = crate::emulated::EmulatedFaults::parse(&spec)
                .map_err(|e| format!("bad emulated fault spec {spec:?}: {e}"))?;
            tracing::info!(
                faults = %spec,
                "rdma: using the EMULATED verbs device (software, for tests; not a NIC)"
            );
            Ok(Arc::new(crate::emulated::EmulatedProvider::new(faults)))
        }
        #[cfg(target_os = "linux")]
        ProviderChoice::Ibverbs | ProviderChoice::Auto => crate::ibverbs::IbverbsProvider::load()
            .map(|p| Arc::new(p) as Arc<dyn Provider>)
            .map_err(|e| e.to_string()),
        #[cfg(not(target_os = "linux"))]
        ProviderChoice::Ibverbs | ProviderChoice::Auto => {
            Err("libibverbs is only supported on Linux".into())
        }
    }
}

fn open_device(
    provider: &dyn Provider,
    name: &str,
    config: &RdmaConfig,
) -> std::result::Result<Device, VerbsError> {
    let ctx = provider.open(name)?;
    let port = ctx.query_port(config.port)?;
    if port.state != port_state::ACTIVE {
        return Err(VerbsError::Unavailable(format!(
            "{name} port {} is not active (state {})",
            config.port, port.state
        )));
    }
    let gid_index = match config.gid_index {
        Some(i) => i,
        None => {
            let entries: Vec<GidEntry> = (0..port.gid_table_len.min(64))
                .filter_map(|index| {
                    let gid = ctx.query_gid(config.port, index).ok()?;
                    Some(GidEntry {
                        index,
                        gid,
                        kind: gid::sysfs_gid_kind(name, config.port, index),
                    })
                })
                .collect();
            choose_gid_index(&entries, port.link_layer).ok_or_else(|| {
                VerbsError::Unavailable(format!("{name} port {} has no usable GID", config.port))
            })?
        }
    };
    let gid = ctx.query_gid(config.port, gid_index)?;
    let pd = ctx.alloc_pd()?;
    Ok(Device {
        name: name.to_string(),
        ctx,
        pd,
        gid,
        gid_index,
        lid: port.lid,
        mtu: port.active_mtu,
    })
}

/// Opens the devices of `provider` that `config` allows.
///
/// # Errors
/// Why none can be used: the provider lists none, none is allowed, or each allowed one
/// failed to open (each with its reason).
pub(super) fn open_devices(
    provider: &dyn Provider,
    config: &RdmaConfig,
) -> std::result::Result<Vec<Device>, String> {
    let listed = provider.devices().map_err(|e| e.to_string())?;
    let mut devices = Vec::new();
    let mut skipped = Vec::new();
    for d in &listed {
        if !allowed(&config.devices, &d.name) {
            continue;
        }
        match open_device(provider, &d.name, config) {
            Ok(dev) => devices.push(dev),
            Err(e) => skipped.push(format!("{}: {e}", d.name)),
        }
    }
    if devices.is_empty() {
        let names: Vec<&str> = listed.iter().map(|d| d.name.as_str()).collect();
        return Err(no_device(&names, &config.devices, &skipped));
    }
    for d in &devices {
        tracing::info!(
            provider = provider.name(),
            device = %d.name,
            gid_index = d.gid_index,
            gid = %gid_hex(&d.gid),
            "rdma device in use"
        );
    }
    Ok(devices)
}

impl Shared {
    pub(super) fn bringup(&self, dev: &Device) -> Bringup {
        Bringup {
            port: self.config.port,
            gid_index: dev.gid_index.min(255) as u8,
            ack_timeout: self.config.ack_timeout,
            retry_cnt: self.config.retry_cnt,
        }
    }

    /// A queue pair (with its own CQ) on `dev`, moved to INIT, and what the peer needs to
    /// connect to it.
    pub(super) fn new_queue_pair(
        &self,
        dev: &Device,
        send_slots: u32,
    ) -> std::result::Result<NewQueuePair, VerbsError> {
        let cq = dev.ctx.create_cq(send_slots * 2 + 16)?;
        let qp = dev.pd.create_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: send_slots,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
            },
        )?;
        handshake::to_init(qp.as_ref(), self.bringup(dev))?;
        let info = self.endpoint_info(dev, qp.as_ref());
        Ok((qp, cq, info))
    }

    fn endpoint_info(&self, dev: &Device, qp: &dyn QueuePair) -> EndpointInfo {
        EndpointInfo {
            qpn: qp.qpn(),
            psn: handshake::random_psn(),
            gid: gid_hex(&dev.gid),
            lid: dev.lid,
            mtu: dev.mtu,
        }
    }
}

/// Whether `allowlist` admits device `name` (an empty allowlist admits every device).
fn allowed(allowlist: &[String], name: &str) -> bool {
    allowlist.is_empty() || allowlist.iter().any(|a| a == name)
}

/// Why no device is in use: the provider listed none (`present` is empty), the allowlist
/// admitted none (nothing was `skipped`), or every admitted one failed to open.
fn no_device(present: &[&str], allowlist: &[String], skipped: &[String]) -> String {
    if present.is_empty() {
        "no RDMA device".to_string()
    } else if skipped.is_empty() {
        format!("no RDMA device matches the allowlist {allowlist:?} (present: {present:?})")
    } else {
        format!("no usable RDMA device: {}", skipped.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_allowlist_admits_every_device() {
        assert!(allowed(&[], "mlx5_0"));
        let list = vec!["mlx5_1".to_string()];
        assert!(allowed(&list, "mlx5_1"));
        assert!(!allowed(&list, "mlx5_0"));
        assert!(!allowed(&list, "mlx5_10"), "names match whole");
    }

    #[test]
    fn the_reason_for_no_device_names_what_was_there() {
        assert_eq!(no_device(&[], &[], &[]), "no RDMA device");
        let list = vec!["mlx5_9".to_string()];
        assert_eq!(
            no_device(&["mlx5_0", "mlx5_1"], &list, &[]),
            r#"no RDMA device matches the allowlist ["mlx5_9"] (present: ["mlx5_0", "mlx5_1"])"#
        );
        let skipped = vec![
            "mlx5_0: port 1 is not active".to_string(),
            "mlx5_1: x".to_string(),
        ];
        assert_eq!(
            no_device(&["mlx5_0", "mlx5_1"], &[], &skipped),
            "no usable RDMA device: mlx5_0: port 1 is not active; mlx5_1: x"
        );
    }
}
