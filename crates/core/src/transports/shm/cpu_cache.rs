//! The size of a core's own cache, as Linux describes it in sysfs: one of the figures the
//! copy plan reads of the machine (`copy_plan::Machine`), since a copy whose source and
//! destination fit one core's L2 runs at cache speed on that core.

use std::path::Path;

/// The per-core (unified or data) level-2 cache of CPU 0, in bytes; `None` where sysfs does
/// not say (another OS, a container without `/sys`).
pub(super) fn l2_bytes() -> Option<u64> {
    cache_bytes("2")
}

/// The last-level (level-3) cache CPU 0 shares with others, in bytes: what a block must
/// exceed to be copied from memory (`memory_speed`); `None` where sysfs does not say.
pub(super) fn l3_bytes() -> Option<u64> {
    cache_bytes("3")
}

/// CPU 0's (unified or data) cache of `level`, in bytes.
fn cache_bytes(level: &str) -> Option<u64> {
    let dir = Path::new("/sys/devices/system/cpu/cpu0/cache");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
        let is_level = read("level")?.trim() == level;
        let holds_data = matches!(read("type")?.trim(), "Unified" | "Data");
        (is_level && holds_data)
            .then(|| read("size"))
            .flatten()
            .and_then(|s| parse_size(&s))
    })
}

/// A sysfs cache size (`"1024K"`, `"2M"`, `"512"`) in bytes.
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_are_read_in_bytes() {
        assert_eq!(parse_size("1024K\n"), Some(1 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("512"), Some(512));
        for bad in ["", "K", "0K", "12Q", "1.5M", "-1K", "99999999999999999999G"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn this_machine_has_a_plausible_l2_or_none() {
        // Whatever the machine, a size read is between 64 KiB and 64 MiB.
        if let Some(l2) = l2_bytes() {
            assert!((64 << 10..=64 << 20).contains(&l2), "L2 of {l2} bytes");
        }
        if let (Some(l2), Some(l3)) = (l2_bytes(), l3_bytes()) {
            assert!(l3 >= l2, "L3 of {l3} bytes below the L2's {l2}");
        }
    }
}
