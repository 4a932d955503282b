//! Handles given to JS: every region, segment and batch handle names its engine and its
//! kind, so a handle of another engine, or of another kind, is refused instead of naming
//! whatever object of this engine happens to share a small id.
//!
//! Layout (52 bits, so `handle + 0.5` is never an integer in a JS number and is refused
//! as a fraction): `tag (12) | kind (2) | payload (38)`. The payload of a region or
//! segment handle is its id in the engine; a batch's is its generation and slot.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Bits of the payload.
pub const PAYLOAD_BITS: u32 = 38;
const KIND_BITS: u32 = 2;
const TAG_BITS: u32 = 12;
/// Largest payload.
pub const PAYLOAD_MASK: u64 = (1 << PAYLOAD_BITS) - 1;
const KIND_MASK: u64 = (1 << KIND_BITS) - 1;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Every handle is below this (2^52).
pub const HANDLE_LIMIT: u64 = 1 << (TAG_BITS + KIND_BITS + PAYLOAD_BITS);

/// The next tag: a process-wide counter, started at a random point on first use.
static NEXT_TAG: std::sync::OnceLock<AtomicU64> = std::sync::OnceLock::new();

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleKind {
    /// A local region (allocated or registered memory).
    Region = 1,
    /// An opened remote segment.
    Segment = 2,
    /// A batch.
    Batch = 3,
}

impl HandleKind {
    /// The word used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Region => "region",
            Self::Segment => "segment",
            Self::Batch => "batch",
        }
    }

    fn from_bits(bits: u64) -> Option<Self> {
        match bits {
            1 => Some(Self::Region),
            2 => Some(Self::Segment),
            3 => Some(Self::Batch),
            _ => None,
        }
    }
}

/// One engine's handle space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handles {
    tag: u64,
}

impl Default for Handles {
    /// A process-wide counter started at a random point: engines in one process never
    /// share a tag (until 4096 engines were made), engines in different processes rarely do.
    fn default() -> Self {
        let next = NEXT_TAG.get_or_init(|| {
            let mut seed = [0u8; 8];
            let _ = getrandom::fill(&mut seed);
            AtomicU64::new(u64::from_le_bytes(seed))
        });
        Self::with_tag(next.fetch_add(1, Ordering::Relaxed))
    }
}

impl Handles {
    /// A handle space with this tag (its low 12 bits).
    pub fn with_tag(tag: u64) -> Self {
        Self {
            tag: tag & TAG_MASK,
        }
    }

    /// The handle of object `payload` of `kind`. The payload must fit in 38 bits (ids are
    /// counters that never get there; the caller checks before handing one out).
    pub fn encode(&self, kind: HandleKind, payload: u64) -> u64 {
        debug_assert!(payload <= PAYLOAD_MASK);
        (self.tag << (KIND_BITS + PAYLOAD_BITS))
            | ((kind as u64) << PAYLOAD_BITS)
            | (payload & PAYLOAD_MASK)
    }

    /// The payload of `handle`, checked to be a handle of `kind` from this engine.
    pub fn decode(&self, kind: HandleKind, handle: u64) -> Result<u64> {
        let refuse = |why: &str| {
            let what = kind.name();
            Err(match kind {
                HandleKind::Batch => Error::InvalidBatch(handle),
                _ => Error::ForeignHandle(format!("{what} handle {handle} {why}")),
            })
        };
        if handle >= HANDLE_LIMIT {
            return refuse("is not a handle");
        }
        let found = HandleKind::from_bits((handle >> PAYLOAD_BITS) & KIND_MASK);
        if found != Some(kind) {
            return match found {
                Some(other) => refuse(&format!("is a {} handle", other.name())),
                None => refuse("is not a handle"),
            };
        }
        if handle >> (KIND_BITS + PAYLOAD_BITS) != self.tag {
            return refuse("belongs to another engine");
        }
        Ok(handle & PAYLOAD_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_fits_below_2_pow_52() {
        let h = Handles::with_tag(TAG_MASK);
        for kind in [HandleKind::Region, HandleKind::Segment, HandleKind::Batch] {
            for payload in [0, 1, 12345, PAYLOAD_MASK] {
                let handle = h.encode(kind, payload);
                assert!(handle < HANDLE_LIMIT && HANDLE_LIMIT == 1 << 52);
                assert_eq!(h.decode(kind, handle), Ok(payload));
                // `handle + 0.5` is never an integer in a double below 2^52.
                let plus_half = handle as f64 + 0.5;
                assert_ne!(plus_half.fract(), 0.0);
            }
        }
    }

    #[test]
    fn foreign_and_wrong_kind_handles_are_refused() {
        let a = Handles::with_tag(1);
        let b = Handles::with_tag(2);
        let region_a = a.encode(HandleKind::Region, 0);
        let err = b.decode(HandleKind::Region, region_a).unwrap_err();
        assert_eq!(err.code(), "ERR_FERRY_FOREIGN_HANDLE");
        assert!(err.to_string().contains("another engine"), "{err}");
        let err = a.decode(HandleKind::Segment, region_a).unwrap_err();
        assert!(err.to_string().contains("is a region handle"), "{err}");
        assert_eq!(
            b.decode(HandleKind::Batch, a.encode(HandleKind::Batch, 3)),
            Err(Error::InvalidBatch(a.encode(HandleKind::Batch, 3)))
        );
        for bad in [0, 5, HANDLE_LIMIT, u64::MAX] {
            assert!(a.decode(HandleKind::Region, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn engines_in_one_process_get_distinct_tags() {
        let tags: std::collections::HashSet<u64> =
            (0..100).map(|_| Handles::default().tag).collect();
        assert_eq!(tags.len(), 100);
    }
}
