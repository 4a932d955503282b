//! A lane's in-flight window: how much of a pool connection's work may be written but not
//! yet answered. Pure: the connection counts, this decides.
//!
//! Why a window: a frame counts as started (its attempt's deadline runs) once it is
//! written (`request::Slice::going_out`), and `stall` breaks a connection whose frames
//! go unanswered for the deadline. Without a bound, a long list is written as fast as the
//! socket takes it, and the kernel's buffers on both sides (megabytes per connection)
//! plus the target's own queue hold tens of thousands of small frames per lane: with
//! more lanes than cores, a frame written there waited longer than the deadline for its
//! turn, a wait no clock of the engine saw as queueing. With the window, work beyond it
//! stays in the connection's queue (not started, not timed), and a written frame waits
//! only behind the window's worth of work on its lane.
//!
//! The window is sized from the bandwidth-delay product, so that it never starves the
//! link: twice what a lane moves in one round trip, and at least a few slices, so a
//! striped large request keeps its next slice on the wire while the target reads one.
//! Below [`FRAME_FLOOR`] a frame's cost is its per-frame work, not its bytes, so a small
//! frame is charged as that floor: the window holds about as many small frames as a
//! round trip's worth of such work, not thousands per megabyte.

use std::time::Duration;

/// The least a frame is charged against the window (bytes): per-frame work (a header to
/// parse, a reply to write, a wake-up) costs about what copying this much does.
pub(super) const FRAME_FLOOR: u64 = 4 << 10;

/// What a lane is assumed to carry when nothing better is known: 100 Gb/s and a
/// datacenter round trip. On loopback or a slower link the window is then larger than
/// needed, never smaller; it stays far below the kernel's own buffers' worth of small
/// frames, which is what it bounds.
pub(super) const ASSUMED_LINK: Link = Link {
    bytes_per_sec: 12_500_000_000,
    rtt: Duration::from_micros(100),
};

/// Slices of the transport's slice size a window holds at least.
const MIN_SLICES: u64 = 4;

/// The most a window holds, however fast and far the link (bytes).
const MAX_BYTES: u64 = 64 << 20;

/// A link's rate and round trip, for the bandwidth-delay product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Link {
    pub(super) bytes_per_sec: u64,
    pub(super) rtt: Duration,
}

/// A lane's window: charged bytes written and unanswered, at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    limit: u64,
    /// Charged bytes in flight.
    charged: u64,
    /// Frames in flight.
    frames: u64,
    /// The writer stopped at a full window and waits to be told there is room again.
    blocked: bool,
}

/// The window's size (charged bytes) for `link` and slices of `slice_size` bytes: twice
/// the bandwidth-delay product, at least [`MIN_SLICES`] slices, at most [`MAX_BYTES`].
pub(super) fn size(link: Link, slice_size: u64) -> u64 {
    let bdp = (link.bytes_per_sec as u128 * link.rtt.as_nanos() / 1_000_000_000) as u64;
    let least = slice_size.max(FRAME_FLOOR).saturating_mul(MIN_SLICES);
    bdp.saturating_mul(2).clamp(least.min(MAX_BYTES), MAX_BYTES)
}

/// What a frame whose reply moves `len` bytes is charged: a WRITE's payload goes out with
/// its request, a READ's comes back with its reply; either way the lane moves it before
/// the answer arrives.
pub(super) fn charge(len: u64) -> u64 {
    len.max(FRAME_FLOOR)
}

impl Window {
    /// An empty window of `limit` charged bytes.
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            charged: 0,
            frames: 0,
            blocked: false,
        }
    }

    /// Whether a frame moving `len` bytes may be written now. An empty window takes any
    /// frame, so one larger than the window still goes. A refusal marks the writer as
    /// waiting for room ([`Window::answered`] says when to wake it).
    pub(super) fn admit(&mut self, len: u64) -> bool {
        let fits = self.frames == 0 || self.charged + charge(len) <= self.limit;
        self.blocked = !fits;
        fits
    }

    /// A frame moving `len` bytes was written.
    pub(super) fn wrote(&mut self, len: u64) {
        self.charged += charge(len);
        self.frames += 1;
    }

    /// The frame moving `len` bytes was answered. True when the writer waits and should be
    /// woken: once the window has drained to half, so that it writes in batches of half a
    /// window rather than a frame per reply, with the other half still on the wire.
    pub(super) fn answered(&mut self, len: u64) -> bool {
        self.charged = self.charged.saturating_sub(charge(len));
        self.frames = self.frames.saturating_sub(1);
        let wake = self.blocked && (self.frames == 0 || self.charged <= self.limit / 2);
        if wake {
            self.blocked = false;
        }
        wake
    }

    /// The connection ended: nothing of it is in flight any more.
    pub(super) fn clear(&mut self) {
        *self = Self::new(self.limit);
    }

    /// Frames written and unanswered.
    #[cfg(test)]
    fn frames(&self) -> u64 {
        self.frames
    }

    /// Whether it is full: a writer waits for room.
    #[cfg(test)]
    fn is_blocked(&self) -> bool {
        self.blocked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLICE: u64 = 512 << 10;

    #[test]
    fn a_window_is_twice_the_bandwidth_delay_product_within_bounds() {
        // 100 Gb/s and 100 us: 1.25 MB in flight per round trip, 2.5 MB windows.
        assert_eq!(size(ASSUMED_LINK, SLICE), 2_500_000);
        // 400 Gb/s over 1 ms: 50 MB per round trip, capped.
        let far = Link {
            bytes_per_sec: 50_000_000_000,
            rtt: Duration::from_millis(1),
        };
        assert_eq!(size(far, SLICE), MAX_BYTES);
        // Loopback's tiny round trip: still four slices, so a striped request keeps one on
        // the wire while the target reads another.
        let near = Link {
            bytes_per_sec: 10_000_000_000,
            rtt: Duration::from_micros(5),
        };
        assert_eq!(size(near, SLICE), 4 * SLICE);
        // Small slices: the product itself (100 KB), above four of them.
        assert_eq!(size(near, 4096), 100_000);
        // Slices as large as the window's cap: the cap holds.
        assert_eq!(size(near, 64 << 20), MAX_BYTES);
    }

    #[test]
    fn small_frames_are_charged_their_per_frame_work() {
        assert_eq!(charge(0), FRAME_FLOOR);
        assert_eq!(charge(512), FRAME_FLOOR);
        assert_eq!(charge(1 << 20), 1 << 20);
        // The assumed link's window holds hundreds of small frames, not the tens of
        // thousands of 512-byte frames the kernel's buffers take.
        let frames = size(ASSUMED_LINK, SLICE) / charge(512);
        assert!((400..1000).contains(&frames), "{frames}");
    }

    #[test]
    fn a_full_window_holds_the_writer_until_half_of_it_is_answered() {
        let mut w = Window::new(8 * FRAME_FLOOR);
        for _ in 0..8 {
            assert!(w.admit(100));
            w.wrote(100);
        }
        assert!(!w.admit(100), "full");
        assert!(w.is_blocked());
        assert_eq!(w.frames(), 8);
        // Answers under half the window wake nothing; the fourth brings it to half.
        assert!(!w.answered(100));
        assert!(!w.answered(100));
        assert!(!w.answered(100));
        assert!(w.answered(100));
        assert!(!w.is_blocked());
        assert!(w.admit(100));
        // Nobody waiting: nothing to wake.
        assert!(!w.answered(100));
    }

    #[test]
    fn an_empty_window_takes_a_frame_larger_than_itself() {
        let mut w = Window::new(SLICE);
        assert!(w.admit(4 * SLICE));
        w.wrote(4 * SLICE);
        assert!(!w.admit(1));
        // Its answer empties the window and wakes the writer.
        assert!(w.answered(4 * SLICE));
        assert_eq!(w.frames(), 0);
    }

    #[test]
    fn a_window_cleared_with_its_connection_is_empty_and_keeps_its_size() {
        let mut w = Window::new(2 * FRAME_FLOOR);
        w.wrote(10);
        w.wrote(10);
        assert!(!w.admit(10));
        w.clear();
        assert_eq!(w, Window::new(2 * FRAME_FLOOR));
        assert!(w.admit(10));
        // Answers of a connection already cleared never underflow.
        assert!(!w.answered(10));
        assert_eq!(w.frames(), 0);
    }
}
