//! The calling thread's event loop, when it has one (a JS thread: the binding installs
//! libuv's). A transport may then hand a socket to it: the loop watches the socket on this
//! thread and calls back here when it is ready, so that a reply wakes the thread that
//! waits for it, and no I/O thread sits in between (one sleep and wake-up fewer per
//! round trip, which is most of a small request's time on a busy machine).
//!
//! Only what runs on the loop's thread touches it: the table of watches is thread-local.
//!
//! The loop's interface and the installed loop are in `watch`, below the transports that
//! use them; this module is above those: `uninstall` breaks their connections.

pub(crate) mod watch;

pub use watch::{install, installed, EventLoop, Interest, Watch, Watcher};

pub use crate::transports::tcp::loop_conn::cap_writes_for_tests;

/// Forgets this thread's loop, first breaking every connection it watches (their requests
/// in flight fail): the binding calls it when the loop's environment is torn down.
pub fn uninstall() {
    // Forgotten first: what breaking settles may submit again, and must not find the loop.
    watch::forget();
    crate::transports::tcp::event_loop::break_this_thread();
}
