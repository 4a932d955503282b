//! How the engine spreads over the machine's cores when not told (`ioThreads` and
//! `connectionsPerPeer` left out or `'auto'`): pure functions of the core count, so that
//! what a 64-core machine gets is tested on any machine.
//!
//! - I/O threads: one per core, at least 2 and at most 32. They run every socket's reads
//!   (the replies and READ payloads an initiator receives, the WRITE payloads a target
//!   receives) and the writes a submitting thread leaves to them; N threads moving data
//!   want N cores copying on each side. Idle ones sleep; past 32, threads contending for
//!   the runtime's queues cost more than another core brings.
//! - Lanes (tcp data connections per peer): one per core, at least 2 and at most 32. A
//!   large request is striped over a few lanes (at most `STRIPE_WAYS` of the tcp
//!   transport), each submitting thread over a group of its own, so that threads side by
//!   side write to different sockets and the target reads them on different cores; one
//!   lane per core gives every core a socket to read. A peer's pool opens lanes only as
//!   requests wait for them or another thread stripes beside the first, so unused lanes
//!   cost no descriptor. Two cores keep 2: more connections than cores there only add
//!   sockets for the same two cores to serve.

/// What an engine uses (`Engine::spread`): its I/O threads, and per enabled transport how
/// it spreads (`None` for a transport that is not enabled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineSpread {
    /// The runtime's I/O threads.
    pub io_threads: usize,
    /// Tcp lanes (data connections) per peer.
    pub tcp_lanes: Option<usize>,
    /// Shm copy threads.
    pub shm_copy_threads: Option<usize>,
}

/// I/O threads for a machine of `cores` cores.
pub fn auto_io_threads(cores: usize) -> usize {
    cores.clamp(2, 32)
}

/// Tcp lanes (data connections) per peer for a machine of `cores` cores.
pub fn auto_lanes(cores: usize) -> usize {
    cores.clamp(2, 32)
}

/// The cores this process may run on (1 when the OS does not say).
pub fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::limits;

    #[test]
    fn io_threads_follow_the_cores_within_bounds() {
        assert_eq!(auto_io_threads(0), 2);
        assert_eq!(auto_io_threads(1), 2);
        assert_eq!(auto_io_threads(2), 2);
        assert_eq!(auto_io_threads(16), 16);
        assert_eq!(auto_io_threads(64), 32);
        assert_eq!(auto_io_threads(usize::MAX), 32);
    }

    #[test]
    fn lanes_are_one_per_core_within_bounds() {
        assert_eq!(auto_lanes(0), 2);
        assert_eq!(auto_lanes(1), 2);
        assert_eq!(auto_lanes(2), 2);
        assert_eq!(auto_lanes(16), 16);
        assert_eq!(auto_lanes(64), 32);
        assert_eq!(auto_lanes(usize::MAX), 32);
    }

    #[test]
    fn auto_values_pass_validation_on_any_machine() {
        for cores in [1, 2, 3, 8, 16, 64, 1024] {
            let io = auto_io_threads(cores);
            assert!(io >= limits::IO_THREADS.0 && io <= limits::IO_THREADS.1);
            let lanes = auto_lanes(cores);
            assert!(
                lanes >= limits::CONNECTIONS_PER_PEER.0 && lanes <= limits::CONNECTIONS_PER_PEER.1
            );
        }
    }

    #[test]
    fn more_cores_never_mean_fewer_threads_or_lanes() {
        for cores in 1..200 {
            assert!(auto_io_threads(cores + 1) >= auto_io_threads(cores));
            assert!(auto_lanes(cores + 1) >= auto_lanes(cores));
        }
    }
}
