//! Transfer status values, their severity, and batch aggregation.
//!
//! The numbering is Mooncake TENT's so that users can compare raw values directly.
//! Severity is a plain exhaustive `match`: nothing is built lazily or destroyed at exit,
//! so a reader racing with shutdown can never observe a torn table (the TENT teardown
//! crash this project started from).

use serde::{Deserialize, Serialize};

use crate::numbered::Numbered;

/// The state of one transfer task, or the aggregate of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum TransferStatus {
    /// Not started yet.
    Waiting = 0,
    /// In progress (possibly being retried on another transport).
    Pending = 1,
    /// Bad parameters.
    Invalid = 2,
    /// Canceled by the user or by engine close.
    Canceled = 3,
    /// Done: every byte moved.
    Completed = 4,
    /// The deadline passed.
    Timeout = 5,
    /// Failed: transport error, peer lost, or the failover budget ran out.
    Failed = 6,
}

impl TransferStatus {
    /// Every status, in numeric order.
    pub const ALL: [TransferStatus; 7] = [
        Self::Waiting,
        Self::Pending,
        Self::Invalid,
        Self::Canceled,
        Self::Completed,
        Self::Timeout,
        Self::Failed,
    ];

    /// The status for a raw value; values outside the table read as `Failed`.
    pub fn from_raw(raw: i64) -> Self {
        match raw {
            0 => Self::Waiting,
            1 => Self::Pending,
            2 => Self::Invalid,
            3 => Self::Canceled,
            4 => Self::Completed,
            5 => Self::Timeout,
            _ => Self::Failed,
        }
    }

    /// The raw numeric value (TENT's numbering).
    pub fn raw(self) -> u8 {
        self as u8
    }

    /// Severity for aggregation: FAILED 4 > TIMEOUT 3 > CANCELED 2 > INVALID 1 >
    /// WAITING = PENDING = COMPLETED 0.
    pub fn severity(self) -> u8 {
        match self {
            Self::Failed => 4,
            Self::Timeout => 3,
            Self::Canceled => 2,
            Self::Invalid => 1,
            Self::Waiting | Self::Pending | Self::Completed => 0,
        }
    }

    /// Whether the status can no longer change.
    pub fn is_terminal(self) -> bool {
        match self {
            Self::Waiting | Self::Pending => false,
            Self::Invalid | Self::Canceled | Self::Completed | Self::Timeout | Self::Failed => true,
        }
    }

    /// TENT's upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Waiting => "WAITING",
            Self::Pending => "PENDING",
            Self::Invalid => "INVALID",
            Self::Canceled => "CANCELED",
            Self::Completed => "COMPLETED",
            Self::Timeout => "TIMEOUT",
            Self::Failed => "FAILED",
        }
    }
}

impl Numbered for TransferStatus {
    const TABLE: &'static str = "status";
    const ALL: &'static [Self] = &Self::ALL;

    fn number(self) -> u32 {
        u32::from(self.raw())
    }

    fn name(self) -> &'static str {
        TransferStatus::name(self)
    }
}

impl std::fmt::Display for TransferStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Severity of a raw value: anything outside the table ranks as FAILED.
pub fn raw_severity(raw: i64) -> u8 {
    TransferStatus::from_raw(raw).severity()
}

/// Aggregates task statuses into a batch status.
///
/// - empty, or every task COMPLETED: COMPLETED;
/// - any task not terminal: PENDING (a pending task keeps a batch from reporting early);
/// - otherwise (all terminal, not all completed): the worst status by severity.
pub fn aggregate<I>(statuses: I) -> TransferStatus
where
    I: IntoIterator<Item = TransferStatus>,
{
    let mut worst: Option<TransferStatus> = None;
    let mut pending = false;
    for status in statuses {
        if !status.is_terminal() {
            pending = true;
            continue;
        }
        if status != TransferStatus::Completed
            && worst.is_none_or(|w| status.severity() > w.severity())
        {
            worst = Some(status);
        }
    }
    if pending {
        return TransferStatus::Pending;
    }
    worst.unwrap_or(TransferStatus::Completed)
}

/// Aggregates raw values; a value outside the table counts as FAILED.
pub fn aggregate_raw<I>(raws: I) -> TransferStatus
where
    I: IntoIterator<Item = i64>,
{
    aggregate(raws.into_iter().map(TransferStatus::from_raw))
}

#[cfg(test)]
mod tests {
    use super::TransferStatus::*;
    use super::*;

    #[test]
    fn numbering_matches_tent() {
        let raws: Vec<u8> = TransferStatus::ALL.iter().map(|s| s.raw()).collect();
        assert_eq!(raws, vec![0, 1, 2, 3, 4, 5, 6]);
        for s in TransferStatus::ALL {
            assert_eq!(TransferStatus::from_raw(i64::from(s.raw())), s);
        }
    }

    #[test]
    fn severity_table() {
        assert_eq!(Failed.severity(), 4);
        assert_eq!(Timeout.severity(), 3);
        assert_eq!(Canceled.severity(), 2);
        assert_eq!(Invalid.severity(), 1);
        assert_eq!(Waiting.severity(), 0);
        assert_eq!(Pending.severity(), 0);
        assert_eq!(Completed.severity(), 0);
    }

    #[test]
    fn out_of_range_values_rank_as_failed() {
        for raw in [-1, 7, 8, 255, i64::MAX, i64::MIN] {
            assert_eq!(raw_severity(raw), 4, "raw {raw}");
            assert_eq!(TransferStatus::from_raw(raw), Failed);
        }
        assert_eq!(aggregate_raw([4, 99]), Failed);
        assert_eq!(aggregate_raw([4, 5, -3]), Failed);
    }

    #[test]
    fn aggregation_table() {
        let cases: &[(&[TransferStatus], TransferStatus)] = &[
            (&[], Completed),
            (&[Completed], Completed),
            (&[Completed, Completed], Completed),
            (&[Pending], Pending),
            (&[Waiting], Pending),
            (&[Completed, Pending], Pending),
            // a pending task keeps the batch from reporting FAILED early
            (&[Failed, Pending], Pending),
            (&[Failed, Waiting, Completed], Pending),
            (&[Completed, Failed], Failed),
            (&[Completed, Invalid], Invalid),
            (&[Invalid, Canceled], Canceled),
            (&[Canceled, Timeout], Timeout),
            (&[Timeout, Failed, Invalid], Failed),
            (&[Timeout, Completed], Timeout),
            (&[Canceled, Canceled], Canceled),
        ];
        for (input, expected) in cases {
            assert_eq!(aggregate(input.iter().copied()), *expected, "{input:?}");
        }
    }

    #[test]
    fn terminal_states() {
        let terminal: Vec<_> = TransferStatus::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [&Invalid, &Canceled, &Completed, &Timeout, &Failed]
        );
    }
}
