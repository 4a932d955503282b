//! `verify` over shm: the copier is the reader of both memories, so it checks. Each span's
//! source is checksummed (CRC32C) before the copy and its destination after it; a mismatch
//! fails the attempt with `ERR_FERRY_INTEGRITY`. A verified copy is made whole on the
//! submitting thread (never split with the copy threads): the checks read the span right
//! after it was written, while it is still in cache.
//!
//! The bytes are copied straight into the destination, so a mismatch is found after they
//! landed: unlike tcp, where the target checks before anything lands, a corrupted shm copy
//! leaves what arrived in the destination. What it catches: a copy that did not produce the
//! source's bytes (faulty memory, a mapping that no longer shows the peer's buffer), and a
//! source changed while it was copied (which the transfer contract forbids).

use super::copy::copy_spans;
use super::peer::ShmPeer;
use crate::error::{Error, Result};
use crate::kind::Opcode;
use crate::linux::RemoteMapping;
use crate::memory::Region;
use crate::request::Span;

/// Copies `spans` as `copy_spans` does, checking each span's destination against its
/// source's CRC32C: the bytes copied, or why the copy does not count.
pub(super) fn copy_verified(
    peer: &ShmPeer,
    mapping: &RemoteMapping,
    region: &Region,
    opcode: Opcode,
    spans: &[Span],
) -> Result<u64> {
    let mut bytes = 0;
    for span in spans {
        let one = std::slice::from_ref(span);
        let source = crate::integrity::checksum(side(mapping, region, opcode, span, true)?);
        bytes += copy_spans(peer, mapping, region, opcode, one)?;
        let landed = side(mapping, region, opcode, span, false)?;
        crate::integrity::check("shm copy", source, landed)?;
    }
    Ok(bytes)
}

/// The bytes of `span` on its source side (`source`) or its destination side.
fn side<'a>(
    mapping: &'a RemoteMapping,
    region: &'a Region,
    opcode: Opcode,
    span: &Span,
    source: bool,
) -> Result<&'a [u8]> {
    let remote_side = source == (opcode == Opcode::Read);
    let ptr = if remote_side {
        mapping.range_ptr(span.remote_offset, span.length)
    } else {
        region.range_ptr(span.local_offset, span.length).ok()
    };
    let ptr = ptr.ok_or_else(|| {
        Error::OutOfRange(format!(
            "shm copy [{}+{}) outside the mapping",
            span.remote_offset, span.length
        ))
    })?;
    // SAFETY: the range was bounds-checked just above (`range_ptr`) against a mapping that
    // stays mapped while it is borrowed (`mapping`, `region`, both borrowed for 'a).
    // Concurrent writes by the peers are the transfer contract's, as for the copy itself:
    // a byte changed meanwhile is what the check reports.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast_const(), span.length as usize) })
}
