//! The generator of `lib/tables.ts`: the names, by number, of everything that crosses the
//! binding as a number — opcodes, transports, task statuses, error codes and why a peer
//! was lost — written from the core's tables (`ferry_core::Numbered`), so that the
//! TypeScript layer takes its names from the tables Rust owns and from nowhere else.
//!
//! It runs as a test (the file is checked in): `tables_ts_is_current` fails while
//! `lib/tables.ts` differs from what it writes, and
//! `FERRY_WRITE_TABLES=1 cargo test -p ferry-node tables` writes it anew.

use std::fmt::Write as _;
use std::path::PathBuf;

use ferry_core::{ErrorCode, LossKind, Numbered, Opcode, TransferStatus, TransportKind};

/// The command that rewrites the file.
const REWRITE: &str = "FERRY_WRITE_TABLES=1 cargo test -p ferry-node tables";

/// Codes JS gives errors that never cross the binding (so they have no number): an
/// aborted call's `AbortError` has Node's own code.
const JS_ONLY_CODES: &[&str] = &["ABORT_ERR"];

/// One table as TypeScript declares it.
struct Table {
    /// What it lists, for comments ("Transports").
    what: &'static str,
    /// The literal type of its names.
    type_name: &'static str,
    /// The doc comment of that type (public types keep theirs).
    type_doc: &'static str,
    /// The prefix of its two constants (`<PREFIX>_NAMES`, `<PREFIX>_NUMBERS`).
    prefix: &'static str,
    /// The Rust type it is read from, for the comments.
    source: &'static str,
    /// What number 0 means when no entry has it (`None`: it is an entry's, or nothing).
    zero: Option<&'static str>,
    /// (number, name), in number order.
    rows: Vec<(u32, &'static str)>,
    /// Names the type has beyond the table's.
    extra_names: &'static [&'static str],
}

fn rows<T: Numbered>() -> Vec<(u32, &'static str)> {
    T::ALL.iter().map(|e| (e.number(), e.name())).collect()
}

fn tables() -> Vec<Table> {
    vec![
        Table {
            what: "Opcodes",
            type_name: "OpcodeName",
            type_doc: "Directions of a transfer.",
            prefix: "OPCODE",
            source: "ferry_core::Opcode",
            zero: None,
            rows: rows::<Opcode>(),
            extra_names: &[],
        },
        Table {
            what: "Transports",
            type_name: "TransportName",
            type_doc: "Transports Ferry knows.",
            prefix: "TRANSPORT",
            source: "ferry_core::TransportKind",
            zero: Some("none"),
            rows: rows::<TransportKind>(),
            extra_names: &[],
        },
        Table {
            what: "Transfer statuses",
            type_name: "StatusName",
            type_doc: "Names of the transfer statuses (`TransferStatus`).",
            prefix: "STATUS",
            source: "ferry_core::TransferStatus",
            zero: None,
            rows: rows::<TransferStatus>(),
            extra_names: &[],
        },
        Table {
            what: "Error codes",
            type_name: "FerryErrorCode",
            type_doc: "Stable error codes.",
            prefix: "ERROR_CODE",
            source: "ferry_core::ErrorCode",
            zero: Some("none"),
            rows: rows::<ErrorCode>(),
            extra_names: JS_ONLY_CODES,
        },
        Table {
            what: "Reasons a peer was lost",
            type_name: "LossReasonName",
            type_doc: "Why a peer was declared lost.",
            prefix: "LOSS_REASON",
            source: "ferry_core::LossKind",
            zero: None,
            rows: rows::<LossKind>(),
            extra_names: &[],
        },
    ]
}

/// `'a' | 'b'` on one line when it fits, else one member a line.
fn union(t: &Table) -> String {
    let names: Vec<String> = t
        .rows
        .iter()
        .map(|r| r.1)
        .chain(t.extra_names.iter().copied())
        .map(|n| format!("'{n}'"))
        .collect();
    let line = format!("export type {} = {}", t.type_name, names.join(" | "));
    if line.len() <= 100 {
        return line;
    }
    let mut out = format!("export type {} =", t.type_name);
    for n in names {
        let _ = write!(out, "\n  | {n}");
    }
    out
}

fn table_ts(out: &mut String, t: &Table) {
    let zero = t.zero.map_or(String::new(), |z| format!("; 0 is {z}"));
    let _ = writeln!(out, "/** {} */\n{}\n", t.type_doc, union(t));
    let _ = writeln!(out, "/** {} by number (`{}`){zero}. */", t.what, t.source);
    let _ = writeln!(
        out,
        "export const {}_NAMES: Readonly<Partial<Record<number, {}>>> = {{",
        t.prefix, t.type_name
    );
    for (number, name) in &t.rows {
        let _ = writeln!(out, "  {number}: '{name}',");
    }
    let what = t.what.to_lowercase();
    let _ = writeln!(out, "}}\n\n/** The number of each of the {what}. */");
    let _ = writeln!(out, "export const {}_NUMBERS = {{", t.prefix);
    for (number, name) in &t.rows {
        let _ = writeln!(out, "  {name}: {number},");
    }
    let _ = writeln!(out, "}} as const");
}

/// The text of `lib/tables.ts`.
fn tables_ts() -> String {
    let mut out = format!(
        "// Generated by crates/node/src/tables.rs from the core's tables: do not edit.\n\
         // Rewrite it with `{REWRITE}`;\n\
         // `cargo test -p ferry-node` fails while it differs.\n\
         /**\n \
         * The names of what crosses the binding as numbers (opcodes, transports, task\n \
         * statuses, error codes, why a peer was lost), by number, from the tables the core\n \
         * owns (`ferry_core::Numbered`).\n \
         */\n"
    );
    for t in tables() {
        out.push('\n');
        table_ts(&mut out, &t);
    }
    out
}

fn tables_ts_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../lib/tables.ts")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_ts_is_current() {
        let path = tables_ts_path();
        let want = tables_ts();
        if std::env::var("FERRY_WRITE_TABLES").as_deref() == Ok("1") {
            std::fs::write(&path, &want).expect("write lib/tables.ts");
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let first = have
                .lines()
                .zip(want.lines())
                .position(|(h, w)| h != w)
                .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!(
                "lib/tables.ts is not what the core's tables make (first difference at line \
                 {}: {:?}, expected {:?}).\nRewrite it with `{REWRITE}` and commit it.",
                first + 1,
                have.lines().nth(first).unwrap_or(""),
                want.lines().nth(first).unwrap_or(""),
            );
        }
    }

    #[test]
    fn tables_name_every_entry_by_its_number() {
        let ts = tables_ts();
        assert!(ts.contains("export type TransportName = 'tcp' | 'shm' | 'rdma'\n"));
        assert!(ts.contains("  12: 'ERR_FERRY_PEER_LOST',\n"));
        assert!(ts.contains("  ERR_FERRY_PEER_LOST: 12,\n"));
        assert!(ts.contains(
            "\n  | 'ERR_FERRY_SEGMENT_CLOSED'\n  | 'ERR_FERRY_NOTIFY_REFUSED'\n  | 'ERR_FERRY_RESOURCE_LIMIT'\n  | 'ERR_FERRY_INTEGRITY'\n  | 'ERR_FERRY_TAMPERED'\n  | 'ABORT_ERR'\n"
        ));
        assert!(
            !ts.contains(": 'ABORT_ERR'"),
            "a JS-only code has no number"
        );
        for t in tables() {
            assert_eq!(ts.matches(&format!(" {}_NAMES: ", t.prefix)).count(), 1);
            assert_eq!(
                ts.matches(&format!(" {}_NUMBERS = {{", t.prefix)).count(),
                1
            );
        }
    }
}
