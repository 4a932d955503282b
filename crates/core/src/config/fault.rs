//! What the fault transport injects into the transport it decorates
//! (`EngineConfig::faults`, per transport): tests and failover benchmarks set it.

use std::time::Duration;

/// What to inject. `Default` injects nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultSpec {
    /// Probability that submitting a request fails (0.0..=1.0).
    pub submit_failure_rate: f64,
    /// After this many submitted requests, every submission fails.
    pub fail_after_submits: Option<u64>,
    /// Probability that a completed attempt is reported FAILED instead.
    pub corrupt_completion_rate: f64,
    /// Delay before each submission reaches the real transport.
    pub delay: Option<Duration>,
    /// The transport fails to install and is never selected.
    pub fail_install: bool,
    /// Seed of the random choices.
    pub seed: u64,
}
