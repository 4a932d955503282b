//! Automatic GID index choice.
//!
//! On RoCE a port has several GIDs (RoCE v1 and v2, link-local and per IP address); the
//! usable one for routed traffic is RoCE v2 with an IPv4-mapped address. On InfiniBand the
//! first entry is the port GID.

use crate::provider::{link_layer, Gid};

/// One GID table entry as read from the device (and sysfs for the type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Table index.
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// `"RoCE v2"`, `"IB/RoCE v1"`, … when the kernel reports it.
    pub kind: Option<String>,
}

fn is_ipv4_mapped(gid: &Gid) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Picks the GID index to use, or `None` when the table has no usable entry.
pub fn choose_gid_index(entries: &[GidEntry], link: u8) -> Option<u32> {
    let usable = entries.iter().filter(|e| e.gid.iter().any(|b| *b != 0));
    if link != link_layer::ETHERNET {
        return usable.map(|e| e.index).min();
    }
    usable
        .max_by_key(|e| {
            let v2 = e.kind.as_deref().is_some_and(|k| k.contains("v2"));
            let score = u8::from(v2) * 2 + u8::from(is_ipv4_mapped(&e.gid));
            // Highest score first, then the lowest index.
            (score, std::cmp::Reverse(e.index))
        })
        .map(|e| e.index)
}

/// The GID type the kernel reports for `device`/`port`/`index`, if any.
pub(crate) fn sysfs_gid_kind(device: &str, port: u8, index: u32) -> Option<String> {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}");
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Hex form of a GID, as published in descriptors.
pub fn gid_hex(gid: &Gid) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses `gid_hex`'s output.
pub fn parse_gid(hex: &str) -> Option<Gid> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: Gid, kind: &str) -> GidEntry {
        GidEntry {
            index,
            gid,
            kind: Some(kind.into()),
        }
    }

    const LINK_LOCAL: Gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    const V4: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];

    #[test]
    fn roce_prefers_v2_with_ipv4() {
        let table = [
            entry(0, LINK_LOCAL, "IB/RoCE v1"),
            entry(1, LINK_LOCAL, "RoCE v2"),
            entry(2, V4, "IB/RoCE v1"),
            entry(3, V4, "RoCE v2"),
        ];
        assert_eq!(choose_gid_index(&table, link_layer::ETHERNET), Some(3));
        assert_eq!(choose_gid_index(&table[..3], link_layer::ETHERNET), Some(1));
        assert_eq!(choose_gid_index(&table[..1], link_layer::ETHERNET), Some(0));
    }

    #[test]
    fn zero_gids_are_skipped_and_ib_takes_the_first() {
        let table = [entry(0, [0; 16], "RoCE v2"), entry(1, LINK_LOCAL, "")];
        assert_eq!(choose_gid_index(&table, link_layer::INFINIBAND), Some(1));
        assert_eq!(choose_gid_index(&table[..1], link_layer::ETHERNET), None);
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(parse_gid(&gid_hex(&V4)), Some(V4));
        assert_eq!(parse_gid("xyz"), None);
        assert_eq!(parse_gid(&"g".repeat(32)), None);
    }
}
