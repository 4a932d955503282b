//! Notification settings (`EngineConfig::notify`): the receive queue's size and the
//! payload cap, which `notify` enforces on both sides.

/// Notification settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyConfig {
    /// Notifications the receive queue holds (`notifyQueueSize`); past it they are dropped
    /// and counted.
    pub queue_size: usize,
    /// Largest payload sent or accepted (`notifyMaxBytes`).
    pub max_bytes: usize,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            queue_size: 1024,
            max_bytes: 4096,
        }
    }
}
