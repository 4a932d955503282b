//! libuv's event loop as the engine's `EventLoop` on a JS thread (`ferry_core::event_loop`):
//! the engine hands it a connection's socket, and a `uv_poll_t` watches it, so that a
//! reply wakes this thread directly. The only libuv calls of the binding live here.
//!
//! A watch does not keep Node alive (`uv_unref`): the Promise of each request in flight
//! does. The environment's cleanup hook breaks this thread's connections and forgets the
//! loop before Node closes it.

use std::alloc::Layout;
use std::cell::Cell;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::rc::Rc;
use std::sync::Arc;

use ferry_core::event_loop::{EventLoop, Interest, Watch, Watcher};
use napi::Env;

// libuv, as Node exports it to addons (resolved when the addon is loaded, like napi_*).
extern "C" {
    fn uv_handle_size(kind: c_int) -> usize;
    fn uv_poll_init(event_loop: *mut c_void, handle: *mut c_void, fd: c_int) -> c_int;
    fn uv_poll_start(
        handle: *mut c_void,
        events: c_int,
        cb: unsafe extern "C" fn(*mut c_void, c_int, c_int),
    ) -> c_int;
    fn uv_poll_stop(handle: *mut c_void) -> c_int;
    fn uv_close(handle: *mut c_void, cb: unsafe extern "C" fn(*mut c_void));
    fn uv_unref(handle: *mut c_void);
}

/// `UV_POLL` of `uv_handle_type`.
const UV_POLL: c_int = 8;
const UV_READABLE: c_int = 1;
const UV_WRITABLE: c_int = 2;
const UV_DISCONNECT: c_int = 4;

thread_local! {
    static INSTALLED: Cell<bool> = const { Cell::new(false) };
}

/// Installs this thread's libuv loop for the engine, once per thread.
pub(crate) fn ensure_installed(env: &Env) {
    if INSTALLED.with(Cell::get) {
        return;
    }
    let Ok(event_loop) = env.get_uv_event_loop() else {
        return;
    };
    let hook = env.add_env_cleanup_hook((), |()| {
        ferry_core::event_loop::uninstall();
        INSTALLED.with(|i| i.set(false));
    });
    if hook.is_err() {
        // Without the hook the loop could be closed under a watch: stay on the I/O threads.
        return;
    }
    ferry_core::event_loop::install(Rc::new(UvLoop {
        event_loop: event_loop.cast(),
    }));
    INSTALLED.with(|i| i.set(true));
}

struct UvLoop {
    event_loop: *mut c_void,
}

/// One `uv_poll_t` and what it calls back; the handle's `data` holds an `Rc` of it from
/// `watch` until libuv's close callback.
struct Poll {
    handle: *mut c_void,
    layout: Layout,
    watcher: Arc<dyn Watcher>,
    events: Cell<c_int>,
    closing: Cell<bool>,
}

/// The first field of every libuv handle (`uv_handle_t::data`).
#[repr(C)]
struct HandleHead {
    data: *mut c_void,
}

fn events_of(interest: Interest) -> c_int {
    match interest {
        Interest::Read | Interest::Stop => UV_READABLE | UV_DISCONNECT,
        Interest::ReadWrite => UV_READABLE | UV_WRITABLE | UV_DISCONNECT,
    }
}

impl Poll {
    fn set(&self, interest: Interest) {
        if self.closing.get() {
            return;
        }
        if interest == Interest::Stop {
            self.close();
            return;
        }
        let events = events_of(interest);
        if events != self.events.get() {
            self.events.set(events);
            // SAFETY: the handle was initialized by `uv_poll_init` and is not closing (checked
            // above); this runs on the loop's thread (every caller is on it).
            unsafe { uv_poll_start(self.handle, events, on_poll) };
        }
    }

    fn close(&self) {
        if self.closing.replace(true) {
            return;
        }
        // SAFETY: the handle is initialized and not yet closing (the flag above makes this
        // run once); `on_close` frees it after libuv is done with it.
        unsafe {
            uv_poll_stop(self.handle);
            uv_close(self.handle, on_close);
        }
    }
}

/// libuv's callback: the socket is ready (or closed, or in error).
unsafe extern "C" fn on_poll(handle: *mut c_void, _status: c_int, _events: c_int) {
    // SAFETY: `data` is the `Rc<Poll>` that `watch` put there, alive until `on_close`, which
    // libuv calls only after the last `on_poll`.
    let poll = unsafe { &*((*handle.cast::<HandleHead>()).data as *const Poll) };
    // No panic may unwind into libuv: one that escapes the engine stops the watch. What
    // the callback completes settles as it ends (`settle::in_loop_callback`).
    let interest = crate::settle::in_loop_callback(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poll.watcher.on_ready()))
            .unwrap_or(Interest::Stop)
    });
    poll.set(interest);
}

/// libuv's close callback: frees the handle and the `Rc<Poll>` it held.
unsafe extern "C" fn on_close(handle: *mut c_void) {
    // SAFETY: `data` holds the `Rc<Poll>` leaked by `watch`; libuv calls this once, after
    // which it never touches the handle again, so both may be freed.
    unsafe {
        let poll = Rc::from_raw((*handle.cast::<HandleHead>()).data as *const Poll);
        let layout = poll.layout;
        drop(poll);
        std::alloc::dealloc(handle.cast(), layout);
    }
}

/// What the engine holds of a watch; dropping it stops the watch.
struct UvWatch(Rc<Poll>);

impl Watch for UvWatch {
    fn set_interest(&self, interest: Interest) {
        self.0.set(interest);
    }
}

impl Drop for UvWatch {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl EventLoop for UvLoop {
    fn watch(&self, fd: RawFd, watcher: Arc<dyn Watcher>) -> std::io::Result<Box<dyn Watch>> {
        // SAFETY: a libuv query without side effects.
        let size = unsafe { uv_handle_size(UV_POLL) };
        let layout = Layout::from_size_align(size.max(1), 16)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let handle = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<c_void>();
        if handle.is_null() {
            return Err(std::io::ErrorKind::OutOfMemory.into());
        }
        // SAFETY: `handle` is fresh memory of libuv's size for a poll handle; `event_loop`
        // is this thread's loop (napi_get_uv_event_loop), and this runs on its thread.
        let rc = unsafe { uv_poll_init(self.event_loop, handle, fd) };
        if rc != 0 {
            // SAFETY: libuv did not keep the handle (init failed); it is ours to free.
            unsafe { std::alloc::dealloc(handle.cast(), layout) };
            return Err(std::io::Error::other(format!("uv_poll_init failed ({rc})")));
        }
        let poll = Rc::new(Poll {
            handle,
            layout,
            watcher,
            events: Cell::new(UV_READABLE | UV_DISCONNECT),
            closing: Cell::new(false),
        });
        // SAFETY: the handle is initialized; its `data` field now holds one count of the
        // `Rc`, released in `on_close`. `uv_unref` lets Node exit while it is watched.
        unsafe {
            (*handle.cast::<HandleHead>()).data = Rc::into_raw(poll.clone()) as *mut c_void;
            uv_unref(handle);
            let rc = uv_poll_start(handle, UV_READABLE | UV_DISCONNECT, on_poll);
            if rc != 0 {
                poll.close();
                return Err(std::io::Error::other(format!(
                    "uv_poll_start failed ({rc})"
                )));
            }
        }
        Ok(Box::new(UvWatch(poll)))
    }
}
