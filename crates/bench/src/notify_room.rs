//! Backpressure for notifying workers (tebench's `--notifi`). Before each submission a
//! worker reads how many notifications its engine has in flight
//! ([`Engine::notifications_in_flight`]: sent, neither acknowledged nor failed yet) and,
//! while they are [`NOTIFY_WINDOW`] or more, waits for the target's acknowledgements
//! (backing off, yielding the CPU) instead of submitting. That wait counts in the worker's
//! measured wall time (so BW and Avg Lat of a notifying case include what delivering its
//! notifications costs) but not in the operation's Tx time, which starts at submission. It
//! ends once there is room, when stop is raised, or with a TIMEOUT failure naming the
//! notification backlog when no notification was delivered or failed for the worker's
//! stall timeout.

use std::time::{Duration, Instant};

use ferry_core::Engine;

use crate::gate::StopSignal;

/// Notifications an engine's notifying workers let be in flight before they wait for room
/// (see the module doc). Without a bound, workers submit far faster than the one
/// connection per target that carries notifications (the link) delivers and acknowledges
/// (200 000 or more against about 100 000 a second on an idle 2-core machine, much less
/// when it is loaded): a case ends with hundreds of thousands queued, whose tail outlives
/// both the per-notification deadline (peer timeout + connect timeout, counted from when it
/// was queued) and the initiator's bounded drain before it closes, and fails instead of
/// arriving. 4096 keeps
/// the connection's pipeline full (a burst of acks leaves in one write) while the backlog
/// left at a case's end drains in milliseconds, or well under a second on a loaded machine.
pub const NOTIFY_WINDOW: u64 = 4096;

/// Whether a notifying worker may submit now, with `in_flight` notifications of its engine
/// on their way and a window of `window`.
pub fn room_for_notification(in_flight: u64, window: u64) -> bool {
    in_flight < window
}

/// How a wait for notification room ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// Fewer than [`NOTIFY_WINDOW`] in flight: submit.
    Ready,
    /// The run's stop was raised first.
    Stopped,
    /// The engine closed meanwhile.
    Closed,
    /// No notification was delivered or failed for the stall timeout.
    Stalled {
        /// Notifications in flight when the wait gave up.
        in_flight: u64,
    },
}

/// Waits until `engine` has fewer than [`NOTIFY_WINDOW`] notifications in flight (three
/// atomic loads when it has already), calling `pause` with the time waited between reads.
/// Gives up with [`Room::Stalled`] when none is delivered or failed for `stall_timeout`.
pub(crate) fn wait_for_room(
    engine: &Engine,
    stop: &StopSignal,
    stall_timeout: Duration,
    mut pause: impl FnMut(Duration),
) -> Room {
    let mut in_flight = engine.notifications_in_flight();
    if room_for_notification(in_flight, NOTIFY_WINDOW) {
        return Room::Ready;
    }
    let started = Instant::now();
    let mut progress = (engine.notifications_ended(), started);
    loop {
        if stop.is_raised() {
            return Room::Stopped;
        }
        if engine.is_closed() {
            return Room::Closed;
        }
        let now = Instant::now();
        let ended = engine.notifications_ended();
        if ended != progress.0 {
            progress = (ended, now);
        } else if now.duration_since(progress.1) >= stall_timeout {
            return Room::Stalled { in_flight };
        }
        pause(now.duration_since(started));
        in_flight = engine.notifications_in_flight();
        if room_for_notification(in_flight, NOTIFY_WINDOW) {
            return Room::Ready;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notifying_worker_submits_only_below_the_window() {
        assert!(room_for_notification(0, NOTIFY_WINDOW));
        assert!(room_for_notification(NOTIFY_WINDOW - 1, NOTIFY_WINDOW));
        assert!(!room_for_notification(NOTIFY_WINDOW, NOTIFY_WINDOW));
        assert!(!room_for_notification(u64::MAX, NOTIFY_WINDOW));
        assert!(!room_for_notification(0, 0), "a window of 0 never has room");
    }
}
