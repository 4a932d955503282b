//! The tables whose entries cross into JavaScript as numbers: opcodes (`kind::Opcode`),
//! transports (`kind::TransportKind`), task statuses (`status::TransferStatus`), error codes
//! (`error::ErrorCode`) and why a peer was lost (`liveness::LossKind`). Each entry has a
//! stable number (its explicit discriminant) and a stable name; the binding carries the
//! numbers and generates `lib/tables.ts`, the names by number, from these tables. A number
//! never changes meaning: a new entry takes a new one. A leaf: imports nothing.

use std::fmt;

/// A number that names no entry of its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownNumber {
    /// Which table (`Numbered::TABLE`).
    pub table: &'static str,
    /// The number given.
    pub number: u32,
}

impl fmt::Display for UnknownNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} number {}", self.table, self.number)
    }
}

impl std::error::Error for UnknownNumber {}

/// An enum whose variants have stable numbers and names.
pub trait Numbered: Copy + Eq + fmt::Debug + 'static {
    /// What the table lists, for messages and the generated names ("transport").
    const TABLE: &'static str;
    /// Every entry, in number order.
    const ALL: &'static [Self];

    /// Its stable number.
    fn number(self) -> u32;

    /// Its stable name.
    fn name(self) -> &'static str;

    /// The entry numbered `number`; `UnknownNumber` for a number no entry has.
    fn from_number(number: u32) -> Result<Self, UnknownNumber> {
        Self::ALL
            .iter()
            .copied()
            .find(|e| e.number() == number)
            .ok_or(UnknownNumber {
                table: Self::TABLE,
                number,
            })
    }

    /// The entries for a message: `1 (tcp), 2 (shm) or 3 (rdma)`.
    fn choices() -> String {
        let each: Vec<String> = Self::ALL
            .iter()
            .map(|e| format!("{} ({})", e.number(), e.name()))
            .collect();
        match each.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => each.join(""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::kind::{Opcode, TransportKind};
    use crate::liveness::LossKind;
    use crate::status::TransferStatus;

    /// Numbers and names unique, `ALL` in number order, every entry found by its number,
    /// and the table as a list of (number, name).
    fn table<T: Numbered>() -> Vec<(u32, &'static str)> {
        let rows: Vec<(u32, &'static str)> =
            T::ALL.iter().map(|e| (e.number(), e.name())).collect();
        assert!(
            rows.windows(2).all(|w| w[0].0 < w[1].0),
            "{}: numbers unique and ascending: {rows:?}",
            T::TABLE
        );
        let mut names: Vec<&str> = rows.iter().map(|r| r.1).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), rows.len(), "{}: names unique", T::TABLE);
        for e in T::ALL {
            assert_eq!(T::from_number(e.number()), Ok(*e));
            let by_name: Vec<_> = T::ALL.iter().filter(|o| o.name() == e.name()).collect();
            assert_eq!(by_name, [e], "{}: {} names one entry", T::TABLE, e.name());
        }
        let past = rows.last().map_or(0, |r| r.0) + 1;
        for bad in [past, past + 1, u32::MAX] {
            assert_eq!(
                T::from_number(bad),
                Err(UnknownNumber {
                    table: T::TABLE,
                    number: bad
                })
            );
        }
        rows
    }

    // The numbers cross the binding and are written into lib/tables.ts (and transports'
    // into the wire protocol's frames): these pins change only by adding an entry.

    #[test]
    fn opcode_numbers_are_pinned() {
        assert_eq!(table::<Opcode>(), [(0, "read"), (1, "write")]);
    }

    #[test]
    fn transport_numbers_are_pinned() {
        assert_eq!(
            table::<TransportKind>(),
            [(1, "tcp"), (2, "shm"), (3, "rdma")]
        );
        assert_eq!(TransportKind::from_number(0).map_err(|e| e.number), Err(0));
    }

    #[test]
    fn status_numbers_are_pinned() {
        assert_eq!(
            table::<TransferStatus>(),
            [
                (0, "WAITING"),
                (1, "PENDING"),
                (2, "INVALID"),
                (3, "CANCELED"),
                (4, "COMPLETED"),
                (5, "TIMEOUT"),
                (6, "FAILED"),
            ]
        );
    }

    #[test]
    fn error_code_numbers_are_pinned() {
        assert_eq!(
            table::<ErrorCode>(),
            [
                (1, "ERR_FERRY_INVALID_ARGUMENT"),
                (2, "ERR_FERRY_OUT_OF_RANGE"),
                (3, "ERR_FERRY_CLOSED"),
                (4, "ERR_FERRY_INVALID_BATCH"),
                (5, "ERR_FERRY_INVALID_TASK"),
                (6, "ERR_FERRY_BATCH_FULL"),
                (7, "ERR_FERRY_UNKNOWN_REGION"),
                (8, "ERR_FERRY_UNKNOWN_SEGMENT"),
                (9, "ERR_FERRY_FOREIGN_HANDLE"),
                (10, "ERR_FERRY_UNKNOWN_BUFFER"),
                (11, "ERR_FERRY_PERMISSION_DENIED"),
                (12, "ERR_FERRY_PEER_LOST"),
                (13, "ERR_FERRY_CONNECT"),
                (14, "ERR_FERRY_TRANSPORT_UNAVAILABLE"),
                (15, "ERR_FERRY_PROTOCOL"),
                (16, "ERR_FERRY_REMOTE_REJECTED"),
                (17, "ERR_FERRY_IO"),
                (18, "ERR_FERRY_CANCELED"),
                (19, "ERR_FERRY_TIMEOUT"),
                (20, "ERR_FERRY_METADATA"),
                (21, "ERR_FERRY_TRANSFER_FAILED"),
                (22, "ERR_FERRY_INTERNAL"),
                (23, "ERR_FERRY_NOTIFY_TOO_LARGE"),
                (24, "ERR_FERRY_NOTIFY_FAILED"),
                (25, "ERR_FERRY_SEGMENT_CLOSED"),
                (26, "ERR_FERRY_NOTIFY_REFUSED"),
                (27, "ERR_FERRY_RESOURCE_LIMIT"),
                (28, "ERR_FERRY_INTEGRITY"),
                (29, "ERR_FERRY_TAMPERED"),
            ]
        );
    }

    #[test]
    fn loss_reason_numbers_are_pinned() {
        assert_eq!(
            table::<LossKind>(),
            [
                (1, "timeout"),
                (3, "crashed"),
                (7, "closed"),
                (8, "restarted"),
            ]
        );
    }

    #[test]
    fn choices_and_unknown_numbers_read_well() {
        assert_eq!(TransportKind::choices(), "1 (tcp), 2 (shm) or 3 (rdma)");
        assert_eq!(Opcode::choices(), "0 (read) or 1 (write)");
        assert_eq!(
            Opcode::from_number(7).expect_err("no opcode 7").to_string(),
            "unknown opcode number 7"
        );
    }
}
