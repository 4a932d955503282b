//! The calling thread's event loop, when it has one (a JS thread: the binding installs
//! libuv's). A transport may then hand a socket to it: the loop watches the socket on this
//! thread and calls back here when it is ready, so that a reply wakes the thread that
//! waits for it, and no I/O thread sits in between (one sleep and wake-up fewer per
//! round trip, which is most of a small request's time on a busy machine).
//!
//! Only what runs on the loop's thread touches it: the table of watches is thread-local.

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;

/// What a watched socket wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Call back when it is readable.
    Read,
    /// Call back when it is readable or writable.
    ReadWrite,
    /// Stop watching it, for good.
    Stop,
}

/// The side of a watched socket that the loop calls back.
pub trait Watcher: Send + Sync {
    /// Called on the loop's thread when the socket is ready (or closed, or in error).
    /// Returns what to watch for next; after [`Interest::Stop`] it is not called again,
    /// and the loop lets go of the socket before it drops the watcher.
    fn on_ready(&self) -> Interest;
}

/// One socket being watched, as the loop's thread holds it.
pub trait Watch {
    /// Changes what the socket is watched for (on the loop's thread only).
    fn set_interest(&self, interest: Interest);
}

/// A thread's event loop.
pub trait EventLoop {
    /// Starts watching `fd` for readability on this thread, calling `watcher` back. The
    /// watch does not keep the loop alive by itself. `fd` must stay open until the loop
    /// drops the watcher (the watcher owns it).
    fn watch(&self, fd: RawFd, watcher: Arc<dyn Watcher>) -> std::io::Result<Box<dyn Watch>>;
}

pub use crate::transports::tcp::loop_conn::cap_writes_for_tests;

thread_local! {
    static CURRENT: RefCell<Option<Rc<dyn EventLoop>>> = const { RefCell::new(None) };
}

/// Makes `event_loop` this thread's loop (the binding, once per JS thread).
pub fn install(event_loop: Rc<dyn EventLoop>) {
    CURRENT.with(|c| *c.borrow_mut() = Some(event_loop));
}

/// Whether this thread has a loop installed.
pub fn installed() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

/// Forgets this thread's loop, first breaking every connection it watches (their requests
/// in flight fail): the binding calls it when the loop's environment is torn down.
pub fn uninstall() {
    // Forgotten first: what breaking settles may submit again, and must not find the loop.
    CURRENT.with(|c| c.borrow_mut().take());
    crate::transports::tcp::event_loop::break_this_thread();
}

/// This thread's loop, if any.
pub(crate) fn current() -> Option<Rc<dyn EventLoop>> {
    CURRENT.with(|c| c.borrow().clone())
}
