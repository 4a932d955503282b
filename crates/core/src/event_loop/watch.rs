//! What a thread's event loop offers a transport — watching a socket on that thread
//! (`EventLoop`, `Watch`, `Watcher`, `Interest`) — and the loop this thread installed. The
//! transports that hand sockets to the loop import this; `event_loop` above them adds
//! `uninstall`, which breaks their connections first.

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

/// Forgets this thread's loop (`uninstall` does, before it breaks the loop's connections).
pub(super) fn forget() {
    CURRENT.with(|c| c.borrow_mut().take());
}

/// This thread's loop, if any.
pub(crate) fn current() -> Option<Rc<dyn EventLoop>> {
    CURRENT.with(|c| c.borrow().clone())
}
