//! libuv's event loop as the engine's `EventLoop` on a JS thread (`ferry_core::event_loop`):
//! the engine hands it a connection's socket, and a `uv_poll_t` watches it, so that a
//! reply wakes this thread directly. The libuv calls themselves are `ffi::UvLoop`'s.
//!
//! A watch does not keep Node alive (`uv_unref`): the Promise of each request in flight
//! does. The environment's cleanup hook breaks this thread's connections and forgets the
//! loop before Node closes it.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;

use ferry_core::event_loop::{EventLoop, Interest, Watch, Watcher};
use napi::Env;

use crate::ffi::{PollHandler, UvLoop, UvPoll};

thread_local! {
    static INSTALLED: Cell<bool> = const { Cell::new(false) };
}

/// Installs this thread's libuv loop for the engine, once per thread.
pub(crate) fn ensure_installed(env: &Env) {
    if INSTALLED.with(Cell::get) {
        return;
    }
    let teardown = || {
        ferry_core::event_loop::uninstall();
        INSTALLED.with(|i| i.set(false));
    };
    // Without the loop, or without the hook (the loop could be closed under a watch), the
    // engine stays on its I/O threads.
    let Some(event_loop) = UvLoop::of(env, teardown) else {
        return;
    };
    ferry_core::event_loop::install(Rc::new(UvEventLoop(event_loop)));
    INSTALLED.with(|i| i.set(true));
}

struct UvEventLoop(UvLoop);

/// What a poll calls: the engine's watcher, as the event loop's call into the engine.
struct Ready(Arc<dyn Watcher>);

impl PollHandler for Ready {
    fn on_ready(&self) -> Interest {
        // A panic that escapes the engine stops the watch. What the callback completes
        // settles as it ends (`settle::in_loop_callback`).
        crate::settle::in_loop_callback(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.0.on_ready()))
                .unwrap_or(Interest::Stop)
        })
    }
}

/// What the engine holds of a watch; dropping it stops the watch.
impl Watch for UvPoll<Ready> {
    fn set_interest(&self, interest: Interest) {
        self.set(interest);
    }
}

impl EventLoop for UvEventLoop {
    fn watch(&self, fd: RawFd, watcher: Arc<dyn Watcher>) -> std::io::Result<Box<dyn Watch>> {
        Ok(Box::new(self.0.poll(fd, Ready(watcher))?))
    }
}
