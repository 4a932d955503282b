//! The one error type of the core. Each variant maps to a stable `ErrorCode` (a number
//! and an `ERR_FERRY_*` name) that the binding carries to JS, so callers can branch on
//! `err.code`.

use crate::liveness::LossReason;
use crate::numbered::Numbered;
use crate::status::TransferStatus;

/// Result alias for the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How every injected error's message starts: those of the fault transport, and a
/// completion it has a task report as failed.
pub const INJECTED: &str = "fault injection: ";

/// An I/O error's inner error that carries a sealed stream's `Error::Tampered` through the
/// `std::io` interfaces (`sealed_stream`), recovered by [`Error::io`].
#[derive(Debug)]
pub(crate) struct TamperedIo(pub(crate) String);

impl TamperedIo {
    /// The tampering `e` reports, if it is a sealed stream's.
    pub(crate) fn within(e: &std::io::Error) -> Option<String> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<TamperedIo>())
            .map(|t| t.0.clone())
    }
}

impl std::fmt::Display for TamperedIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TamperedIo {}

/// Whether `error` was injected (not a sign of anything about the peer).
pub fn is_injected(error: &Error) -> bool {
    matches!(error, Error::Io(m) if m.starts_with(INJECTED))
}

/// The stable codes of errors: a number (the discriminant, which the binding carries) and
/// an `ERR_FERRY_*` name (`err.code` in JS). Every `Error` variant has one
/// (`Error::error_code`); `Internal` is the binding's, for failures of the JS runtime
/// itself, and the core never returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `Error::InvalidArgument`.
    InvalidArgument = 1,
    /// `Error::OutOfRange`.
    OutOfRange = 2,
    /// `Error::Closed`.
    Closed = 3,
    /// `Error::InvalidBatch`.
    InvalidBatch = 4,
    /// `Error::InvalidTask`.
    InvalidTask = 5,
    /// `Error::BatchFull`.
    BatchFull = 6,
    /// `Error::UnknownRegion`.
    UnknownRegion = 7,
    /// `Error::UnknownSegment`.
    UnknownSegment = 8,
    /// `Error::ForeignHandle`.
    ForeignHandle = 9,
    /// `Error::UnknownBuffer`.
    UnknownBuffer = 10,
    /// `Error::PermissionDenied`.
    PermissionDenied = 11,
    /// `Error::PeerLost`.
    PeerLost = 12,
    /// `Error::Connect`.
    Connect = 13,
    /// `Error::TransportUnavailable`.
    TransportUnavailable = 14,
    /// `Error::Protocol`.
    Protocol = 15,
    /// `Error::RemoteRejected`.
    RemoteRejected = 16,
    /// `Error::Io`.
    Io = 17,
    /// `Error::Canceled`.
    Canceled = 18,
    /// `Error::Timeout`.
    Timeout = 19,
    /// `Error::Metadata`.
    Metadata = 20,
    /// `Error::TransferFailed`.
    TransferFailed = 21,
    /// The binding could not do what the JS runtime should always allow (make an object,
    /// a Promise): no `Error` variant, the core never returns it.
    Internal = 22,
    /// `Error::NotifyTooLarge`.
    NotifyTooLarge = 23,
    /// `Error::NotifyFailed`.
    NotifyFailed = 24,
    /// `Error::SegmentClosed`.
    SegmentClosed = 25,
    /// `Error::NotifyRefused`.
    NotifyRefused = 26,
    /// `Error::ResourceLimit`.
    ResourceLimit = 27,
    /// `Error::Integrity`.
    Integrity = 28,
    /// `Error::Tampered`.
    Tampered = 29,
}

impl ErrorCode {
    /// The `ERR_FERRY_*` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidArgument => "ERR_FERRY_INVALID_ARGUMENT",
            Self::OutOfRange => "ERR_FERRY_OUT_OF_RANGE",
            Self::Closed => "ERR_FERRY_CLOSED",
            Self::InvalidBatch => "ERR_FERRY_INVALID_BATCH",
            Self::InvalidTask => "ERR_FERRY_INVALID_TASK",
            Self::BatchFull => "ERR_FERRY_BATCH_FULL",
            Self::UnknownRegion => "ERR_FERRY_UNKNOWN_REGION",
            Self::UnknownSegment => "ERR_FERRY_UNKNOWN_SEGMENT",
            Self::ForeignHandle => "ERR_FERRY_FOREIGN_HANDLE",
            Self::UnknownBuffer => "ERR_FERRY_UNKNOWN_BUFFER",
            Self::PermissionDenied => "ERR_FERRY_PERMISSION_DENIED",
            Self::PeerLost => "ERR_FERRY_PEER_LOST",
            Self::Connect => "ERR_FERRY_CONNECT",
            Self::TransportUnavailable => "ERR_FERRY_TRANSPORT_UNAVAILABLE",
            Self::Protocol => "ERR_FERRY_PROTOCOL",
            Self::RemoteRejected => "ERR_FERRY_REMOTE_REJECTED",
            Self::Io => "ERR_FERRY_IO",
            Self::Canceled => "ERR_FERRY_CANCELED",
            Self::Timeout => "ERR_FERRY_TIMEOUT",
            Self::Metadata => "ERR_FERRY_METADATA",
            Self::TransferFailed => "ERR_FERRY_TRANSFER_FAILED",
            Self::Internal => "ERR_FERRY_INTERNAL",
            Self::NotifyTooLarge => "ERR_FERRY_NOTIFY_TOO_LARGE",
            Self::NotifyFailed => "ERR_FERRY_NOTIFY_FAILED",
            Self::SegmentClosed => "ERR_FERRY_SEGMENT_CLOSED",
            Self::NotifyRefused => "ERR_FERRY_NOTIFY_REFUSED",
            Self::ResourceLimit => "ERR_FERRY_RESOURCE_LIMIT",
            Self::Integrity => "ERR_FERRY_INTEGRITY",
            Self::Tampered => "ERR_FERRY_TAMPERED",
        }
    }
}

impl Numbered for ErrorCode {
    const TABLE: &'static str = "error code";
    const ALL: &'static [Self] = &[
        Self::InvalidArgument,
        Self::OutOfRange,
        Self::Closed,
        Self::InvalidBatch,
        Self::InvalidTask,
        Self::BatchFull,
        Self::UnknownRegion,
        Self::UnknownSegment,
        Self::ForeignHandle,
        Self::UnknownBuffer,
        Self::PermissionDenied,
        Self::PeerLost,
        Self::Connect,
        Self::TransportUnavailable,
        Self::Protocol,
        Self::RemoteRejected,
        Self::Io,
        Self::Canceled,
        Self::Timeout,
        Self::Metadata,
        Self::TransferFailed,
        Self::Internal,
        Self::NotifyTooLarge,
        Self::NotifyFailed,
        Self::SegmentClosed,
        Self::NotifyRefused,
        Self::ResourceLimit,
        Self::Integrity,
        Self::Tampered,
    ];

    fn number(self) -> u32 {
        u32::from(self as u8)
    }

    fn name(self) -> &'static str {
        ErrorCode::name(self)
    }
}

/// Everything that can go wrong in Ferry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller passed a value that can never be valid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A range lies outside the buffer it names.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The engine is closing or closed.
    #[error("engine is closed")]
    Closed,
    /// A batch id that is stale, freed, or from another engine.
    #[error("invalid batch id {0}")]
    InvalidBatch(u64),
    /// A task index outside the batch's submitted tasks.
    #[error("invalid task {task} in batch {batch}")]
    InvalidTask {
        /// Batch id.
        batch: u64,
        /// Task index.
        task: u64,
    },
    /// A batch cannot take more tasks.
    #[error("batch {batch} is full: capacity {capacity}, {requested} more requested")]
    BatchFull {
        /// Batch id.
        batch: u64,
        /// Its capacity.
        capacity: usize,
        /// Tasks that did not fit.
        requested: usize,
    },
    /// A local region id that was never allocated or has been released.
    #[error("unknown or released local region {0}")]
    UnknownRegion(u64),
    /// A region or segment handle of another engine, or of another kind of object.
    #[error("foreign handle: {0}")]
    ForeignHandle(String),
    /// A segment handle that was never opened or has been closed.
    #[error("unknown or closed segment {0}")]
    UnknownSegment(String),
    /// A remote buffer id that the segment does not expose.
    #[error("segment {segment} has no buffer {buffer}")]
    UnknownBuffer {
        /// Segment name.
        segment: String,
        /// Buffer id.
        buffer: u64,
    },
    /// The operation is not allowed on this memory (e.g. writing a read-only buffer).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The peer stopped answering or went away; its in-flight work failed at once.
    #[error("peer {peer} lost: {reason}")]
    PeerLost {
        /// Segment name of the peer.
        peer: String,
        /// Why it was declared lost.
        reason: LossReason,
    },
    /// Could not connect to a peer.
    #[error("cannot connect to {peer}: {reason}")]
    Connect {
        /// Address.
        peer: String,
        /// OS or protocol reason.
        reason: String,
    },
    /// No transport can serve the request.
    #[error("no transport available: {0}")]
    TransportUnavailable(String),
    /// The peer violated the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The target refused a request (bad token, bounds, permission).
    #[error("target rejected the request: {0}")]
    RemoteRejected(String),
    /// An I/O error on a connection.
    #[error("i/o error: {0}")]
    Io(String),
    /// Canceled by the caller.
    #[error("operation canceled")]
    Canceled,
    /// An attempt ran past its deadline.
    #[error("operation timed out")]
    Timeout,
    /// The metadata service (etcd) is unreachable or answered something unusable.
    #[error("metadata service: {0}")]
    Metadata(String),
    /// A notification payload over the cap (`notifyMaxBytes`).
    #[error("a notification of {len} bytes is larger than notifyMaxBytes ({max})")]
    NotifyTooLarge {
        /// Payload length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The data landed but its notification could not be delivered.
    #[error("the data landed but its notification was not delivered: {0}")]
    NotifyFailed(String),
    /// This engine closed the segment (`closeSegment`) while the work was in flight: no
    /// loss of the peer, which may be opened again.
    #[error("segment {0} was closed")]
    SegmentClosed(String),
    /// The target did not take the notification: it is another incarnation than the one
    /// that received the data (the peer restarted), its queue was full for a notification
    /// riding on a transfer, or it refused the sequence number.
    #[error("notification refused: {0}")]
    NotifyRefused(String),
    /// A limit was reached, here or at the peer: open files (`RLIMIT_NOFILE`, the system's
    /// file table), memory, or a connection cap. The message names which, and its value.
    #[error("{0}")]
    ResourceLimit(String),
    /// A verified request's bytes arrived with another CRC32C than their source's: they
    /// were corrupted on the way (`verify`). Never retried: a failover would hide it.
    #[error("integrity check failed: {0}")]
    Integrity(String),
    /// A sealed (encrypted) frame failed its authentication tag, or a connection's frame
    /// counter would wrap: the bytes were changed on the way, or the stream cannot stay
    /// sealed. The connection is dropped and nothing of the frame was delivered.
    #[error("tampered frame: {0}")]
    Tampered(String),
    /// The final outcome of a transfer that did not complete.
    #[error("transfer {status}: {reason}")]
    TransferFailed {
        /// Terminal status.
        status: TransferStatus,
        /// What caused it.
        reason: String,
    },
}

impl Error {
    /// The stable code string for this kind of error (`error_code`'s name).
    pub fn code(&self) -> &'static str {
        self.error_code().name()
    }

    /// The stable code of this kind of error.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::OutOfRange(_) => ErrorCode::OutOfRange,
            Self::Closed => ErrorCode::Closed,
            Self::InvalidBatch(_) => ErrorCode::InvalidBatch,
            Self::InvalidTask { .. } => ErrorCode::InvalidTask,
            Self::BatchFull { .. } => ErrorCode::BatchFull,
            Self::UnknownRegion(_) => ErrorCode::UnknownRegion,
            Self::ForeignHandle(_) => ErrorCode::ForeignHandle,
            Self::UnknownSegment(_) => ErrorCode::UnknownSegment,
            Self::UnknownBuffer { .. } => ErrorCode::UnknownBuffer,
            Self::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Self::PeerLost { .. } => ErrorCode::PeerLost,
            Self::Connect { .. } => ErrorCode::Connect,
            Self::TransportUnavailable(_) => ErrorCode::TransportUnavailable,
            Self::Protocol(_) => ErrorCode::Protocol,
            Self::RemoteRejected(_) => ErrorCode::RemoteRejected,
            Self::Io(_) => ErrorCode::Io,
            Self::Canceled => ErrorCode::Canceled,
            Self::Timeout => ErrorCode::Timeout,
            Self::TransferFailed { .. } => ErrorCode::TransferFailed,
            Self::Metadata(_) => ErrorCode::Metadata,
            Self::NotifyTooLarge { .. } => ErrorCode::NotifyTooLarge,
            Self::NotifyFailed(_) => ErrorCode::NotifyFailed,
            Self::SegmentClosed(_) => ErrorCode::SegmentClosed,
            Self::NotifyRefused(_) => ErrorCode::NotifyRefused,
            Self::ResourceLimit(_) => ErrorCode::ResourceLimit,
            Self::Integrity(_) => ErrorCode::Integrity,
            Self::Tampered(_) => ErrorCode::Tampered,
        }
    }

    /// The terminal task status this error leaves a task in.
    pub fn status(&self) -> TransferStatus {
        match self {
            Self::InvalidArgument(_)
            | Self::OutOfRange(_)
            | Self::UnknownRegion(_)
            | Self::ForeignHandle(_)
            | Self::UnknownSegment(_)
            | Self::UnknownBuffer { .. }
            | Self::PermissionDenied(_)
            | Self::InvalidBatch(_)
            | Self::InvalidTask { .. }
            | Self::BatchFull { .. }
            | Self::NotifyTooLarge { .. } => TransferStatus::Invalid,
            Self::Closed | Self::Canceled | Self::SegmentClosed(_) => TransferStatus::Canceled,
            Self::Timeout => TransferStatus::Timeout,
            Self::TransferFailed { status, .. } => *status,
            Self::PeerLost { .. }
            | Self::Connect { .. }
            | Self::TransportUnavailable(_)
            | Self::Protocol(_)
            | Self::RemoteRejected(_)
            | Self::Metadata(_)
            | Self::NotifyFailed(_)
            | Self::NotifyRefused(_)
            | Self::ResourceLimit(_)
            | Self::Integrity(_)
            | Self::Tampered(_)
            | Self::Io(_) => TransferStatus::Failed,
        }
    }

    /// An I/O failure in `context`; one that means a limit was reached (out of
    /// descriptors or kernel memory) is a `ResourceLimit` naming it.
    pub(crate) fn io(context: &str, err: &std::io::Error) -> Self {
        if let Some(why) = TamperedIo::within(err) {
            return Self::Tampered(why);
        }
        match crate::resource::limit_of(err) {
            Some(limit) => Self::ResourceLimit(format!("{limit} in this process ({context})")),
            None => Self::Io(format!("{context}: {err}")),
        }
    }

    /// A mapping of `len` bytes refused with `err` in `context`: out of memory or address
    /// space, a `ResourceLimit` naming the size and the limit (`RLIMIT_AS` where set);
    /// otherwise as [`Error::io`].
    pub(crate) fn mapping(context: &str, len: u64, err: &std::io::Error) -> Self {
        let errno = err.raw_os_error().unwrap_or(0);
        let address_space = crate::resource::soft_limit(libc::RLIMIT_AS);
        match crate::resource::describe_mapping(len, errno, address_space) {
            Some(limit) => Self::ResourceLimit(format!("{limit} in this process ({context})")),
            None => Self::io(context, err),
        }
    }

    /// A thread for `what` that could not be started (`err` from spawning it): out of
    /// threads or memory, a `ResourceLimit` naming the limits; otherwise as [`Error::io`].
    pub(crate) fn thread(what: &str, err: &std::io::Error) -> Self {
        let errno = err.raw_os_error().unwrap_or(0);
        let nproc = crate::resource::soft_limit(libc::RLIMIT_NPROC);
        match crate::resource::describe_thread(what, errno, nproc) {
            Some(limit) => Self::ResourceLimit(format!("{limit} in this process")),
            None => Self::io(what, err),
        }
    }

    /// An injected failure (`is_injected` tells it apart): `what` happened by design.
    pub(crate) fn injected(what: impl std::fmt::Display) -> Self {
        Self::Io(format!("{INJECTED}{what}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_prefixed() {
        let samples = [
            Error::InvalidArgument("x".into()),
            Error::Closed,
            Error::PeerLost {
                peer: "p".into(),
                reason: LossReason::Closed,
            },
            Error::InvalidBatch(1),
            Error::Metadata("etcd down".into()),
        ];
        let codes: Vec<_> = samples.iter().map(Error::code).collect();
        assert_eq!(
            codes,
            [
                "ERR_FERRY_INVALID_ARGUMENT",
                "ERR_FERRY_CLOSED",
                "ERR_FERRY_PEER_LOST",
                "ERR_FERRY_INVALID_BATCH",
                "ERR_FERRY_METADATA"
            ]
        );
        assert_eq!(Error::Closed.status(), TransferStatus::Canceled);
        assert_eq!(Error::Io("reset".into()).status(), TransferStatus::Failed);
        assert!(ErrorCode::ALL
            .iter()
            .all(|c| c.name().starts_with("ERR_FERRY_")));
    }

    #[test]
    fn a_peer_loss_keeps_its_reason_typed_and_its_wording() {
        let e = Error::PeerLost {
            peer: "a lost: b".into(),
            reason: LossReason::Silent { timeout_ms: 250 },
        };
        assert_eq!(e.error_code(), ErrorCode::PeerLost);
        assert_eq!(
            e.to_string(),
            "peer a lost: b lost: no heartbeat answer for 250 ms"
        );
    }
}
