//! What this transport publishes in a segment descriptor, and reads back from a peer's:
//! the engine's devices (`transport_info["rdma"]` of the descriptor) and each buffer's
//! registration (`transport_info["rdma"]` of a buffer). Pure: serde and lookups, no verbs.

use ferry_core::segment::SegmentDescriptor;
use serde::{Deserialize, Serialize};

/// The key both live under in a descriptor's `transport_info`.
const KEY: &str = "rdma";

/// What a peer publishes (`transport_info["rdma"]` of its descriptor).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PeerInfo {
    pub(super) provider: String,
    pub(super) devices: Vec<PeerDevice>,
}

/// One device of a peer, in its device order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PeerDevice {
    pub(super) name: String,
    pub(super) gid: String,
    pub(super) lid: u16,
    pub(super) mtu: u32,
}

/// What a buffer publishes (`transport_info["rdma"]` of a buffer).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RemoteMr {
    pub(super) addr: u64,
    /// One rkey per device of the peer, in its device order.
    pub(super) rkeys: Vec<u32>,
}

impl PeerInfo {
    /// What `desc` publishes about the peer's devices; `None` if nothing, or nothing this
    /// engine can read.
    pub(super) fn published(desc: &SegmentDescriptor) -> Option<Self> {
        let value = desc.transport_info.get(KEY)?;
        serde_json::from_value(value.clone()).ok()
    }
}

impl RemoteMr {
    /// The registration `desc` publishes for `buffer`; `None` if the buffer is unknown or
    /// not registered with rdma (or its entry cannot be read).
    pub(super) fn published(desc: &SegmentDescriptor, buffer: u64) -> Option<Self> {
        let value = desc.buffer(buffer)?.transport_info.get(KEY)?;
        serde_json::from_value(value.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::memory::Access;
    use ferry_core::segment::BufferDescriptor;
    use ferry_core::TransportKind;
    use serde_json::json;

    fn descriptor(
        info: Option<serde_json::Value>,
        buffer: Option<serde_json::Value>,
    ) -> SegmentDescriptor {
        let mut desc = SegmentDescriptor {
            engine_id: 7,
            name: "h:1".into(),
            machine_id: "m".into(),
            pid: 1,
            tcp_addr: "127.0.0.1:1".into(),
            token: String::new(),
            buffers: vec![BufferDescriptor {
                id: 3,
                length: 4096,
                access: Access::ReadWrite,
                transports: vec![TransportKind::Rdma],
                transport_info: Default::default(),
            }],
            transport_info: Default::default(),
        };
        if let Some(info) = info {
            desc.transport_info.insert(KEY.into(), info);
        }
        if let Some(mr) = buffer {
            desc.buffers[0].transport_info.insert(KEY.into(), mr);
        }
        desc
    }

    #[test]
    fn the_published_shapes_keep_their_field_names() {
        let info = PeerInfo {
            provider: "emulated".into(),
            devices: vec![PeerDevice {
                name: "emu0".into(),
                gid: "fe80".into(),
                lid: 1,
                mtu: 5,
            }],
        };
        assert_eq!(
            serde_json::to_value(&info).expect("encode"),
            json!({ "provider": "emulated",
                    "devices": [{ "name": "emu0", "gid": "fe80", "lid": 1, "mtu": 5 }] })
        );
        let mr = RemoteMr {
            addr: 4096,
            rkeys: vec![9, 10],
        };
        assert_eq!(
            serde_json::to_value(&mr).expect("encode"),
            json!({ "addr": 4096, "rkeys": [9, 10] })
        );
    }

    #[test]
    fn a_descriptor_yields_what_it_publishes() {
        let desc = descriptor(
            Some(json!({ "provider": "ibverbs", "devices": [] })),
            Some(json!({ "addr": 8192, "rkeys": [5] })),
        );
        let info = PeerInfo::published(&desc).expect("peer info");
        assert_eq!(info.provider, "ibverbs");
        assert!(info.devices.is_empty());
        let mr = RemoteMr::published(&desc, 3).expect("buffer 3");
        assert_eq!((mr.addr, mr.rkeys), (8192, vec![5]));
        assert!(RemoteMr::published(&desc, 4).is_none(), "no buffer 4");
    }

    #[test]
    fn missing_or_unreadable_entries_are_none() {
        let bare = descriptor(None, None);
        assert!(PeerInfo::published(&bare).is_none());
        assert!(RemoteMr::published(&bare, 3).is_none());
        let bad = descriptor(Some(json!({ "provider": 1 })), Some(json!("addr")));
        assert!(PeerInfo::published(&bad).is_none());
        assert!(RemoteMr::published(&bad, 3).is_none());
    }
}
