//! The target's side of notification tests: a handler that takes each notification as it
//! comes and checks, at that moment, that the bytes its payload names (`offset:length`)
//! are in the target's region.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::notify::InboxSignal;
use ferry_core::Notification;

use crate::{bytes_at, Pair};

/// How long one notification may take to come before the test fails.
const WAIT: Duration = Duration::from_secs(20);

/// What the target's handler saw: each notification, and whether the bytes it names
/// (`offset:length` in its payload, checked against `expected`) were in the region then.
pub type Seen = Arc<Mutex<Vec<(Notification, bool)>>>;

/// Installs a handler on the target that takes notifications as they come and checks the
/// region at that moment; returns what it saw and a channel that ticks per notification.
pub fn handler(r: &Pair, expected: Vec<u8>) -> (Seen, mpsc::Receiver<()>) {
    let seen: Seen = Arc::default();
    let (tick, ticks) = mpsc::channel();
    let target = r.target.clone();
    let remote = r.remote.clone();
    let s = seen.clone();
    r.target
        .set_notification_waker(Some(Arc::new(move |sig: InboxSignal| {
            if sig != InboxSignal::Ready {
                return;
            }
            for n in target.take_notifications(usize::MAX).unwrap_or_default() {
                let text = String::from_utf8_lossy(&n.data).to_string();
                let landed = match text.split_once(':') {
                    Some((o, l)) => {
                        let (o, l): (u64, u64) = (o.parse().unwrap_or(0), l.parse().unwrap_or(0));
                        bytes_at(&remote, o, l) == expected[o as usize..(o + l) as usize]
                    }
                    None => true,
                };
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((n, landed));
                let _ = tick.send(());
            }
        })));
    (seen, ticks)
}

pub fn wait_for(ticks: &mpsc::Receiver<()>, n: usize) {
    for i in 0..n {
        ticks
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("notification {i} of {n} never came"));
    }
}

/// The payloads seen so far, as text.
pub fn payloads(seen: &Seen) -> Vec<String> {
    seen.lock()
        .expect("seen")
        .iter()
        .map(|(n, _)| String::from_utf8_lossy(&n.data).to_string())
        .collect()
}
