//! Ports for servers a test starts in another process (etcd) or restarts on a known port.
//!
//! Binding port 0, reading the port and closing the listener leaves a window in which the
//! kernel may hand that same port to any outgoing connection on the machine (it is in the
//! ephemeral range), and the server started later then fails "address in use". Tests run
//! side by side open connections all the time, so that window was hit. A port below the
//! kernel's ephemeral range is never handed out by `connect` or by binding port 0; only
//! another explicit pick can take it, and picks are spread at random over thousands.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

/// The lowest port picked: above the well-known and most registered service ports.
const LOWEST: u16 = 10_000;
/// Fewer candidates than this outside the ephemeral range and the range is not used.
const MIN_CANDIDATES: u16 = 1_000;

/// A loopback port that is free now and that the kernel does not hand out by itself.
///
/// Falls back to a port the kernel picked (the old way) when the ephemeral range leaves no
/// room below it.
pub fn unused_port() -> u16 {
    let (low, _) = ephemeral_range().unwrap_or((32_768, 60_999));
    if low >= LOWEST + MIN_CANDIDATES {
        let span = u64::from(low - LOWEST);
        for _ in 0..256 {
            let port = LOWEST + (next_random() % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// `net.ipv4.ip_local_port_range`: the ports `connect` and port 0 draw from.
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some((parts.next()??, parts.next()??))
}

/// A cheap spread of picks across processes and calls (splitmix64 over pid, time, count).
fn next_random() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNT
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_below_the_ephemeral_range_and_free() {
        let port = unused_port();
        if let Some((low, _)) = ephemeral_range() {
            if low >= LOWEST + MIN_CANDIDATES {
                assert!((LOWEST..low).contains(&port), "{port} not below {low}");
            }
        }
        TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
    }

    #[test]
    fn picks_spread() {
        let picks: std::collections::HashSet<u16> = (0..32).map(|_| unused_port()).collect();
        assert!(picks.len() > 24, "{picks:?}");
    }
}
