//! Two engines in one process: a target with a region, an initiator with a region and
//! the target's segment opened.

use std::sync::{Arc, Mutex};

use ferry_core::{Engine, EngineEvent, Opcode, Region, Request};

/// A target and an initiator, each with a region of the same length, the target's segment
/// opened from the initiator, and the initiator's events recorded. Both engines close when
/// it drops (closing is idempotent, so a test may close either one earlier).
pub struct Pair {
    /// The engine whose segment is opened.
    pub target: Engine,
    /// The engine that opened it.
    pub initiator: Engine,
    /// The target's region.
    pub remote: Arc<Region>,
    /// The initiator's region.
    pub local: Arc<Region>,
    /// The initiator's handle of the target's segment.
    pub seg: u64,
    /// The segment's name as the initiator opened it.
    pub peer: String,
    events: Arc<Mutex<Vec<EngineEvent>>>,
}

impl Pair {
    /// Allocates `len` bytes on each engine, opens the target's segment from the initiator
    /// and records the initiator's events from then on.
    pub fn new(target: Engine, initiator: Engine, len: u64) -> Self {
        let remote = target.allocate(len).expect("remote");
        let local = initiator.allocate(len).expect("local");
        let info = initiator
            .open_segment_blocking(target.segment_name())
            .expect("open");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        initiator.set_event_sink(Some(Arc::new(move |e| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        })));
        Self {
            target,
            initiator,
            remote,
            local,
            seg: info.handle,
            peer: info.name,
            events,
        }
    }

    /// A request between the two regions at the same offset on both sides, on any
    /// transport.
    pub fn request(&self, opcode: Opcode, offset: u64, length: u64) -> Request {
        request(opcode, &self.local, self.seg, &self.remote, offset, length)
    }

    /// The initiator's events so far.
    pub fn events(&self) -> Vec<EngineEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.initiator.close();
        self.target.close();
    }
}

/// A request from `local` to buffer `remote` of segment `segment`, at `offset` on both
/// sides, on any transport.
pub fn request(
    opcode: Opcode,
    local: &Region,
    segment: u64,
    remote: &Region,
    offset: u64,
    length: u64,
) -> Request {
    Request {
        opcode,
        local: local.id(),
        local_offset: offset,
        segment,
        remote_buffer: remote.id(),
        remote_offset: offset,
        length,
        hint: ferry_core::TransportHint::Auto,
        verify: false,
    }
}
