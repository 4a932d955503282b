//! The vocabulary every other module shares: which transport, which direction, and what a
//! request asks of the transport choice. Imports only `numbered` (the numbers and names
//! that transports and opcodes cross into JavaScript with).

use std::fmt;

use crate::numbered::Numbered;

/// Which transport served (or is serving) a task. Its number (the discriminant) is stable:
/// the binding carries it, a task stores it, and tcp frames name a transport by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum TransportKind {
    /// TCP sockets.
    Tcp = 1,
    /// Shared memory on the same host.
    Shm = 2,
    /// RDMA verbs.
    Rdma = 3,
}

/// The one transport order: same-host shared memory, then RDMA, then TCP. It is the
/// default of `EngineConfig::transports`, the order of a segment's registered transports
/// and the ranking of candidates before health applies.
pub const DEFAULT_ORDER: [TransportKind; 3] =
    [TransportKind::Shm, TransportKind::Rdma, TransportKind::Tcp];

/// The transports by [`TransportKind::index`] (raw value - 1), for tables kept per
/// transport.
pub(crate) const BY_INDEX: [TransportKind; 3] =
    [TransportKind::Tcp, TransportKind::Shm, TransportKind::Rdma];
const _: () = assert!(
    TransportKind::Tcp as usize == 1
        && TransportKind::Shm as usize == 2
        && TransportKind::Rdma as usize == 3
);

impl TransportKind {
    /// Its slot in a per-transport table: its place in [`BY_INDEX`].
    pub const fn index(self) -> usize {
        self as usize - 1
    }

    /// Parses a lowercase name.
    pub fn parse(name: &str) -> Option<Self> {
        DEFAULT_ORDER.into_iter().find(|k| k.name() == name)
    }

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Shm => "shm",
            Self::Rdma => "rdma",
        }
    }

    /// Reads the raw value stored in a task (0 = none yet).
    pub fn from_raw(raw: u8) -> Option<Self> {
        DEFAULT_ORDER.into_iter().find(|k| *k as u8 == raw)
    }

    /// The names, for messages ("tcp, shm or rdma").
    pub fn names() -> String {
        let mut names: Vec<&str> = DEFAULT_ORDER.iter().map(|k| k.name()).collect();
        names.sort_unstable_by_key(|n| std::cmp::Reverse(*n == "tcp"));
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

impl Numbered for TransportKind {
    const TABLE: &'static str = "transport";
    const ALL: &'static [Self] = &BY_INDEX;

    fn number(self) -> u32 {
        u32::from(self as u8)
    }

    fn name(self) -> &'static str {
        TransportKind::name(self)
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A list of distinct transports, best first, held inline: a task's candidates are made
/// for every request, and there are only three transports. Reads as a slice.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Kinds {
    kinds: [TransportKind; DEFAULT_ORDER.len()],
    len: u8,
}

impl Kinds {
    /// No transport.
    pub const fn new() -> Self {
        Self {
            kinds: DEFAULT_ORDER,
            len: 0,
        }
    }

    /// Appends `k` unless it is already listed (a list never repeats a transport, so it
    /// never outgrows the three there are).
    pub fn push(&mut self, k: TransportKind) {
        if !self.contains(&k) {
            if let Some(slot) = self.kinds.get_mut(usize::from(self.len)) {
                *slot = k;
                self.len += 1;
            }
        }
    }
}

impl Default for Kinds {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for Kinds {
    type Target = [TransportKind];
    fn deref(&self) -> &[TransportKind] {
        &self.kinds[..usize::from(self.len)]
    }
}

impl std::ops::DerefMut for Kinds {
    fn deref_mut(&mut self) -> &mut [TransportKind] {
        &mut self.kinds[..usize::from(self.len)]
    }
}

impl FromIterator<TransportKind> for Kinds {
    fn from_iter<I: IntoIterator<Item = TransportKind>>(iter: I) -> Self {
        let mut kinds = Self::new();
        for k in iter {
            kinds.push(k);
        }
        kinds
    }
}

impl From<&[TransportKind]> for Kinds {
    fn from(kinds: &[TransportKind]) -> Self {
        kinds.iter().copied().collect()
    }
}

impl fmt::Debug for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Direction of a transfer, seen from the initiator. Its number (the discriminant) is
/// stable: the binding carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Copy remote bytes into local memory.
    Read = 0,
    /// Copy local bytes into remote memory.
    Write = 1,
}

impl Opcode {
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }

    /// The opcode named "read" / "write" (either case); `Opcode::parse` (in `request.rs`)
    /// is the same with the API's error.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "read" | "READ" => Some(Self::Read),
            "write" | "WRITE" => Some(Self::Write),
            _ => None,
        }
    }
}

impl Numbered for Opcode {
    const TABLE: &'static str = "opcode";
    const ALL: &'static [Self] = &[Self::Read, Self::Write];

    fn number(self) -> u32 {
        u32::from(self as u8)
    }

    fn name(self) -> &'static str {
        Opcode::name(self)
    }
}

/// What a request asks of the transport choice. One value from the API to the planner
/// (`plan.rs`), which alone decides what it means for the candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportHint {
    /// The engine picks (default order, health applied) and fails over freely.
    #[default]
    Auto,
    /// Try this transport first; fall back to the others.
    Prefer(TransportKind),
    /// Only this transport may serve the request: no fallback.
    Require(TransportKind),
}

impl TransportHint {
    /// The hinted transport, if any.
    pub fn kind(self) -> Option<TransportKind> {
        match self {
            Self::Auto => None,
            Self::Prefer(k) | Self::Require(k) => Some(k),
        }
    }

    /// Whether fallback is forbidden.
    pub fn is_required(self) -> bool {
        matches!(self, Self::Require(_))
    }

    /// The hint of the API's two fields (`transport`, `requireTransport`): naming both is
    /// fine when they agree; `Err` says why they do not.
    pub fn from_fields(
        prefer: Option<TransportKind>,
        require: Option<TransportKind>,
    ) -> Result<Self, String> {
        match (prefer, require) {
            (Some(p), Some(r)) if p != r => Err(format!(
                "transport and requireTransport name different transports ({p} and {r})"
            )),
            (_, Some(r)) => Ok(Self::Require(r)),
            (Some(p), None) => Ok(Self::Prefer(p)),
            (None, None) => Ok(Self::Auto),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_order_and_never_repeat() {
        use TransportKind::*;
        let mut k: Kinds = [Tcp, Shm].into_iter().collect();
        assert_eq!(&*k, &[Tcp, Shm]);
        k.push(Tcp);
        k.push(Rdma);
        k.push(Shm);
        assert_eq!(&*k, &[Tcp, Shm, Rdma]);
        k.rotate_right(1);
        assert_eq!(&*k, &[Rdma, Tcp, Shm]);
        assert!(Kinds::new().is_empty());
        assert_eq!(format!("{k:?}"), "[Rdma, Tcp, Shm]");
    }

    #[test]
    fn names_round_trip() {
        for k in DEFAULT_ORDER {
            assert_eq!(TransportKind::parse(k.name()), Some(k));
            assert_eq!(TransportKind::from_raw(k as u8), Some(k));
        }
        assert_eq!(TransportKind::parse("TCP"), None);
        assert_eq!(TransportKind::from_raw(0), None);
        assert_eq!(TransportKind::names(), "tcp, shm or rdma");
        assert_eq!(Opcode::from_name("WRITE"), Some(Opcode::Write));
        assert_eq!(Opcode::from_name("copy"), None);
    }

    #[test]
    fn hint_from_the_api_fields() {
        use TransportKind::*;
        assert_eq!(
            TransportHint::from_fields(None, None),
            Ok(TransportHint::Auto)
        );
        assert_eq!(
            TransportHint::from_fields(Some(Tcp), None),
            Ok(TransportHint::Prefer(Tcp))
        );
        assert_eq!(
            TransportHint::from_fields(None, Some(Shm)),
            Ok(TransportHint::Require(Shm))
        );
        assert_eq!(
            TransportHint::from_fields(Some(Shm), Some(Shm)),
            Ok(TransportHint::Require(Shm))
        );
        assert!(TransportHint::from_fields(Some(Tcp), Some(Shm))
            .expect_err("disagree")
            .contains("different"));
    }
}
