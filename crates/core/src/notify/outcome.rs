//! What the target did with a notification it took, as its sender learns it.

/// What the target did with a notification it took. A resend after a reconnect is
/// answered with what became of its first copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyOutcome {
    /// Queued for the application.
    Queued,
    /// The queue was full: dropped and counted.
    Dropped,
}
