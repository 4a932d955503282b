//! The raw Node-API and libuv calls of the binding, each behind a safe wrapper whose doc
//! says the contract it upholds: the JS thread's threadsafe function, Promises and
//! callback scopes (`JsThread`, `WakeQueue`), libuv polls (`UvLoop`, `UvPoll`), pending
//! exceptions, and newtype conversions. The rest of the binding calls napi-rs's safe API
//! and these wrappers; buffer.rs holds the other `unsafe`, that of memory both sides touch.
//!
//! What the wrappers rely on: an `&Env` or a value of it is only had during a call from
//! Node on the environment's own thread (napi-rs's own assumption), and what they hand out
//! that must stay on that thread (`JsThread`, `Deferred`, `UvLoop`, `UvPoll`) is not
//! `Send`. Handles that outlive one call (the threadsafe function, the async resource, the
//! loop) are used only while the environment lives: a cleanup hook made with each marks it
//! gone, and from then on they make no napi or libuv call.

use std::alloc::Layout;
use std::cell::Cell;
use std::ffi::c_void;
use std::os::fd::RawFd;
use std::os::raw::c_int;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use ferry_core::event_loop::Interest;
use napi::bindgen_prelude::{FromNapiValue, Object, Unknown};
use napi::{sys, Env, JsValue};

fn check(status: sys::napi_status, what: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::from_reason(format!(
            "{what} failed ({status})"
        )))
    }
}

// ---------------------------------------------------------------------------------------
// Exceptions

/// Clears the exception pending in `env` and returns it; `None` when none was pending.
/// Upholds: `env` is the live env of the current call (the only way to have one).
pub(crate) fn clear_exception(env: &Env) -> Option<Unknown<'_>> {
    let raw = env.raw();
    let mut pending = false;
    // SAFETY: `raw` is the live env of this call; the out-pointer is a valid local.
    let status = unsafe { sys::napi_is_exception_pending(raw, &mut pending) };
    if status != sys::Status::napi_ok || !pending {
        return None;
    }
    let mut exception = ptr::null_mut();
    // SAFETY: as above; clearing a pending exception is what this call is for.
    let status = unsafe { sys::napi_get_and_clear_last_exception(raw, &mut exception) };
    if status != sys::Status::napi_ok || exception.is_null() {
        return None;
    }
    // SAFETY: `exception` was just returned for this env, in the current handle scope.
    Some(unsafe { Unknown::from_raw_unchecked(raw, exception) })
}

/// Implements `ToNapiValue` for a one-field tuple struct by its field's conversion (one.rs's
/// `OneOutcome`, whose field is an `Either`). Upholds: the env napi hands the conversion is
/// passed on unchanged, which is all a conversion requires of its caller.
macro_rules! to_napi_value_by_field {
    ($ty:ty) => {
        impl ::napi::bindgen_prelude::ToNapiValue for $ty {
            unsafe fn to_napi_value(
                env: ::napi::sys::napi_env,
                val: Self,
            ) -> ::napi::Result<::napi::sys::napi_value> {
                // SAFETY: the caller's env is passed on unchanged, as napi's conversions
                // require.
                unsafe { ::napi::bindgen_prelude::ToNapiValue::to_napi_value(env, val.0) }
            }
        }
    };
}
pub(crate) use to_napi_value_by_field;

// ---------------------------------------------------------------------------------------
// A JS thread woken from other threads: one threadsafe function, promises, callback scopes

/// What a `JsThread`'s wake-ups run on its thread, inside the handle scope Node opens.
pub(crate) trait OnWake {
    fn on_wake(env: &Env);
}

/// A raw threadsafe function.
struct Tsfn(sys::napi_threadsafe_function);

// SAFETY: Node-API lets any thread call a threadsafe function until it is released.
// `WakeQueue` keeps it under its lock and takes it out, under that lock, to release it, so
// no thread calls it after that.
unsafe impl Send for Tsfn {}

/// What other threads reach a JS thread by: a queue whose first item wakes that thread,
/// once for all that queue meanwhile.
pub(crate) struct WakeQueue<J> {
    thread: ThreadId,
    state: Mutex<WakeState<J>>,
}

struct WakeState<J> {
    items: Vec<J>,
    /// `None` once the environment is gone: items are dropped, nothing wakes.
    tsfn: Option<Tsfn>,
}

impl<J> WakeQueue<J> {
    fn lock(&self) -> MutexGuard<'_, WakeState<J>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The JS thread the queue wakes.
    pub(crate) fn js_thread(&self) -> ThreadId {
        self.thread
    }

    /// Queues `item` (from any thread) and wakes the JS thread if the queue was empty;
    /// drops it once the environment is gone. Upholds: the threadsafe function is called
    /// only under the lock, while it is still held (not released), without blocking.
    pub(crate) fn push(&self, item: J) {
        let mut state = self.lock();
        let WakeState { items, tsfn } = &mut *state;
        let Some(tsfn) = tsfn else {
            return;
        };
        let wake = items.is_empty();
        items.push(item);
        if wake {
            // SAFETY: the function is live: it leaves the lock only to be released. A
            // non-blocking call on an unbounded queue only fails when closing.
            unsafe {
                sys::napi_call_threadsafe_function(
                    tsfn.0,
                    ptr::null_mut(),
                    sys::ThreadsafeFunctionCallMode::nonblocking,
                );
            }
        }
    }

    /// Everything queued so far.
    pub(crate) fn take(&self) -> Vec<J> {
        std::mem::take(&mut self.lock().items)
    }

    /// The environment goes: the queue is emptied and the function released, once.
    fn close(&self) {
        let mut state = self.lock();
        state.items.clear();
        if let Some(tsfn) = state.tsfn.take() {
            // SAFETY: the function was made by `JsThread::new` and is released once, here:
            // it was taken out under the lock that every caller takes it under.
            unsafe {
                sys::napi_release_threadsafe_function(
                    tsfn.0,
                    sys::ThreadsafeFunctionReleaseMode::abort,
                );
            }
        }
    }
}

/// A Promise's deferred, settled once by `JsThread::resolve` or `reject`. Not `Send`: it
/// belongs to the JS thread that made it.
pub(crate) struct Deferred(sys::napi_deferred);

/// One JS thread's means to be woken from other threads and to settle Promises: a
/// threadsafe function with no JS function behind it (made once, not one per Promise as a
/// napi-rs deferred makes), the async resource of the callback scopes it opens, and this
/// thread's env. Not `Send`. Once the environment's cleanup hook ran, every method is a
/// no-op (or an error).
pub(crate) struct JsThread {
    env: Env,
    tsfn: sys::napi_threadsafe_function,
    resource: sys::napi_ref,
    async_context: sys::napi_async_context,
    alive: Rc<Cell<bool>>,
}

impl JsThread {
    /// Made on the JS thread of `env`: the thread's side, and the queue that other threads
    /// push to, each push waking it to run `H::on_wake`. The function does not keep Node
    /// alive until `keep_alive(true)`. In the environment's cleanup hook the queue is
    /// emptied and the function released, then `on_teardown` runs.
    pub(crate) fn new<J: Send + 'static, H: OnWake>(
        env: &Env,
        name: &str,
        on_teardown: impl FnOnce() + 'static,
    ) -> napi::Result<(Self, Arc<WakeQueue<J>>)> {
        let raw = env.raw();
        let name = env.create_string(name)?.raw();
        let resource = Object::new(env)?.raw();
        let mut tsfn = ptr::null_mut();
        let mut resource_ref = ptr::null_mut();
        let mut async_context = ptr::null_mut();
        // SAFETY: called on the JS thread with its live `env`; `name` and `resource` are
        // values of it made just above; every out-pointer is a local. `call_js::<H>` is
        // what Node calls, with no data.
        unsafe {
            check(
                sys::napi_create_threadsafe_function(
                    raw,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    name,
                    0,
                    1,
                    ptr::null_mut(),
                    None,
                    ptr::null_mut(),
                    Some(call_js::<H>),
                    &mut tsfn,
                ),
                "napi_create_threadsafe_function",
            )?;
            check(
                sys::napi_unref_threadsafe_function(raw, tsfn),
                "napi_unref_threadsafe_function",
            )?;
            check(
                sys::napi_create_reference(raw, resource, 1, &mut resource_ref),
                "napi_create_reference",
            )?;
            check(
                sys::napi_async_init(raw, resource, name, &mut async_context),
                "napi_async_init",
            )?;
        }
        let queue = Arc::new(WakeQueue {
            thread: std::thread::current().id(),
            state: Mutex::new(WakeState {
                items: Vec::new(),
                tsfn: Some(Tsfn(tsfn)),
            }),
        });
        let alive = Rc::new(Cell::new(true));
        env.add_env_cleanup_hook(
            (queue.clone(), alive.clone()),
            move |(queue, alive): (Arc<WakeQueue<J>>, Rc<Cell<bool>>)| {
                queue.close();
                alive.set(false);
                on_teardown();
            },
        )?;
        let thread = Self {
            env: *env,
            tsfn,
            resource: resource_ref,
            async_context,
            alive,
        };
        Ok((thread, queue))
    }

    /// This thread's env.
    pub(crate) fn env(&self) -> &Env {
        &self.env
    }

    /// Whether the threadsafe function keeps Node alive. Upholds: called on the JS thread
    /// (`JsThread` is not `Send`) while the function is not released (`alive`).
    pub(crate) fn keep_alive(&self, keep: bool) {
        if !self.alive.get() {
            return;
        }
        // SAFETY: as the doc says.
        unsafe {
            if keep {
                sys::napi_ref_threadsafe_function(self.env.raw(), self.tsfn);
            } else {
                sys::napi_unref_threadsafe_function(self.env.raw(), self.tsfn);
            }
        }
    }

    /// A Promise and its deferred.
    pub(crate) fn promise<'env>(&self, env: &'env Env) -> napi::Result<(Deferred, Object<'env>)> {
        let mut deferred = ptr::null_mut();
        let mut promise = ptr::null_mut();
        // SAFETY: on the JS thread with its live `env`; out-pointers are locals.
        let status = unsafe { sys::napi_create_promise(env.raw(), &mut deferred, &mut promise) };
        check(status, "napi_create_promise")?;
        // SAFETY: `promise` is a live object value of `env`, made just above.
        let object = unsafe { Object::from_napi_value(env.raw(), promise)? };
        Ok((Deferred(deferred), object))
    }

    /// Resolves `deferred` with `value`. Upholds: once (it takes the deferred), on the JS
    /// thread, while the environment lives; call it inside a handle scope (`OnWake`'s, or
    /// `in_callback_scope`'s).
    pub(crate) fn resolve(&self, deferred: Deferred, value: Unknown) {
        if !self.alive.get() {
            return;
        }
        // SAFETY: as the doc says; `value` is a live value of this env.
        unsafe { sys::napi_resolve_deferred(self.env.raw(), deferred.0, value.raw()) };
    }

    /// Rejects `deferred` with an Error of `message`; as `resolve` otherwise.
    pub(crate) fn reject(&self, deferred: Deferred, message: &str) {
        if !self.alive.get() {
            return;
        }
        let env = self.env.raw();
        let mut msg = ptr::null_mut();
        let mut error = ptr::null_mut();
        // SAFETY: as `resolve`; `msg` and `error` are made here, in the same scope.
        unsafe {
            sys::napi_create_string_utf8(
                env,
                message.as_ptr().cast(),
                message.len() as isize,
                &mut msg,
            );
            sys::napi_create_error(env, ptr::null_mut(), msg, &mut error);
            sys::napi_reject_deferred(env, deferred.0, error);
        }
    }

    /// Runs `f(arg)` inside a handle scope and a callback scope, whose end runs the
    /// microtasks (Promise reactions) it queued; hands `arg` back when the scope cannot be
    /// opened (the environment is closing). Upholds: called from a libuv callback on the JS
    /// thread (no JS on the stack), the scopes closed in reverse order whatever `f` does.
    pub(crate) fn in_callback_scope<T>(&self, arg: T, f: impl FnOnce(T)) -> Result<(), T> {
        if !self.alive.get() {
            return Err(arg);
        }
        let env = self.env.raw();
        let mut handles = ptr::null_mut();
        let mut scope = ptr::null_mut();
        let mut resource = ptr::null_mut();
        // SAFETY: as the doc says; `resource` is this thread's live reference.
        unsafe {
            sys::napi_open_handle_scope(env, &mut handles);
            sys::napi_get_reference_value(env, self.resource, &mut resource);
            if sys::napi_open_callback_scope(env, resource, self.async_context, &mut scope)
                != sys::Status::napi_ok
            {
                sys::napi_close_handle_scope(env, handles);
                return Err(arg);
            }
        }
        let ran = catch_unwind(AssertUnwindSafe(|| f(arg)));
        // SAFETY: the scopes opened above, closed once, in reverse order.
        unsafe {
            sys::napi_close_callback_scope(env, scope);
            sys::napi_close_handle_scope(env, handles);
        }
        if let Err(panic) = ran {
            resume_unwind(panic);
        }
        Ok(())
    }
}

/// The threadsafe function's call: runs `H::on_wake`.
unsafe extern "C" fn call_js<H: OnWake>(
    env: sys::napi_env,
    _f: sys::napi_value,
    _ctx: *mut c_void,
    _data: *mut c_void,
) {
    if env.is_null() {
        return; // the environment is being torn down
    }
    let env = Env::from_raw(env);
    // Called from Node: no panic may unwind out of it.
    let _ = catch_unwind(AssertUnwindSafe(|| H::on_wake(&env)));
}

// ---------------------------------------------------------------------------------------
// libuv: the thread's loop and the polls on it

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

/// The first field of every libuv handle (`uv_handle_t::data`).
#[repr(C)]
struct HandleHead {
    data: *mut c_void,
}

/// The JS thread's libuv loop (`napi_get_uv_event_loop`). Not `Send`. It is used only
/// until the environment's cleanup hook: after that hook's `on_teardown`, its polls make
/// no libuv call (what they hold is left to the process's end).
pub(crate) struct UvLoop {
    raw: *mut c_void,
    alive: Rc<Cell<bool>>,
}

impl UvLoop {
    /// The loop of `env`'s thread, or `None` if napi gives none or the cleanup hook cannot
    /// be added. `on_teardown` runs in that hook, while the loop still runs: it should drop
    /// every `UvPoll`, so that libuv closes them before Node closes the loop.
    pub(crate) fn of(env: &Env, on_teardown: impl FnOnce() + 'static) -> Option<Self> {
        let raw = env.get_uv_event_loop().ok()?;
        let alive = Rc::new(Cell::new(true));
        let hooked = env.add_env_cleanup_hook(alive.clone(), move |alive| {
            on_teardown();
            alive.set(false);
        });
        hooked.ok()?;
        Some(Self {
            raw: raw.cast(),
            alive,
        })
    }

    /// Starts watching `fd` for readability, calling `handler` when it is ready; the poll
    /// does not keep Node alive (`uv_unref`). `fd` must stay open while it is watched, or
    /// libuv watches whatever reuses its number. Upholds: the handle is libuv's size for a
    /// poll, initialized on this thread's loop (`UvLoop` is not `Send`) before any other
    /// call, and freed only by libuv's close callback (or here, when init failed).
    pub(crate) fn poll<H: PollHandler>(&self, fd: RawFd, handler: H) -> std::io::Result<UvPoll<H>> {
        if !self.alive.get() {
            return Err(std::io::Error::other("the event loop is closing"));
        }
        // SAFETY: a libuv query without side effects.
        let size = unsafe { uv_handle_size(UV_POLL) };
        let layout = Layout::from_size_align(size.max(1), 16)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let handle = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<c_void>();
        if handle.is_null() {
            return Err(std::io::ErrorKind::OutOfMemory.into());
        }
        // SAFETY: `handle` is fresh memory of libuv's size for a poll handle; the loop is
        // this thread's, and this runs on its thread.
        let rc = unsafe { uv_poll_init(self.raw, handle, fd) };
        if rc != 0 {
            // SAFETY: libuv did not keep the handle (init failed); it is ours to free.
            unsafe { std::alloc::dealloc(handle.cast(), layout) };
            return Err(std::io::Error::other(format!("uv_poll_init failed ({rc})")));
        }
        let poll = Rc::new(PollState {
            handle,
            layout,
            handler,
            events: Cell::new(UV_READABLE | UV_DISCONNECT),
            closing: Cell::new(false),
            alive: self.alive.clone(),
        });
        // SAFETY: the handle is initialized; its `data` field now holds one count of the
        // `Rc`, released in `on_close`. `uv_unref` lets Node exit while it is watched.
        let rc = unsafe {
            (*handle.cast::<HandleHead>()).data = Rc::into_raw(poll.clone()) as *mut c_void;
            uv_unref(handle);
            uv_poll_start(handle, UV_READABLE | UV_DISCONNECT, on_poll::<H>)
        };
        if rc != 0 {
            poll.close();
            return Err(std::io::Error::other(format!(
                "uv_poll_start failed ({rc})"
            )));
        }
        Ok(UvPoll(poll))
    }
}

/// What a poll calls on the loop's thread when its fd is ready (or closed, or in error):
/// the interest it has next. A panic out of it stops the watch.
pub(crate) trait PollHandler: 'static {
    fn on_ready(&self) -> Interest;
}

/// One `uv_poll_t` watching an fd. Dropping it stops the watch; libuv's close callback
/// frees the handle.
pub(crate) struct UvPoll<H: PollHandler>(Rc<PollState<H>>);

impl<H: PollHandler> UvPoll<H> {
    /// Changes what the fd is watched for; `Stop` closes the poll.
    pub(crate) fn set(&self, interest: Interest) {
        self.0.set(interest);
    }
}

impl<H: PollHandler> Drop for UvPoll<H> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A poll's handle and what it calls back; the handle's `data` holds an `Rc` of it from
/// `UvLoop::poll` until libuv's close callback.
struct PollState<H> {
    handle: *mut c_void,
    layout: Layout,
    handler: H,
    events: Cell<c_int>,
    closing: Cell<bool>,
    alive: Rc<Cell<bool>>,
}

fn events_of(interest: Interest) -> c_int {
    match interest {
        Interest::Read | Interest::Stop => UV_READABLE | UV_DISCONNECT,
        Interest::ReadWrite => UV_READABLE | UV_WRITABLE | UV_DISCONNECT,
    }
}

impl<H: PollHandler> PollState<H> {
    fn set(&self, interest: Interest) {
        if self.closing.get() || !self.alive.get() {
            return;
        }
        if interest == Interest::Stop {
            self.close();
            return;
        }
        let events = events_of(interest);
        if events != self.events.get() {
            self.events.set(events);
            // SAFETY: the handle was initialized by `uv_poll_init` and is not closing
            // (checked above), on a live loop; this runs on the loop's thread (`Rc`).
            unsafe { uv_poll_start(self.handle, events, on_poll::<H>) };
        }
    }

    fn close(&self) {
        if self.closing.replace(true) || !self.alive.get() {
            return;
        }
        // SAFETY: the handle is initialized and not yet closing (the flag above makes this
        // run once), on a live loop; `on_close` frees it after libuv is done with it.
        unsafe {
            uv_poll_stop(self.handle);
            uv_close(self.handle, on_close::<H>);
        }
    }
}

/// libuv's callback: the fd is ready (or closed, or in error).
unsafe extern "C" fn on_poll<H: PollHandler>(handle: *mut c_void, _status: c_int, _events: c_int) {
    // SAFETY: `data` is the `Rc<PollState<H>>` that `UvLoop::poll` put there, alive until
    // `on_close`, which libuv calls only after the last `on_poll`.
    let poll = unsafe { &*((*handle.cast::<HandleHead>()).data as *const PollState<H>) };
    // No panic may unwind into libuv: one stops the watch.
    let interest =
        catch_unwind(AssertUnwindSafe(|| poll.handler.on_ready())).unwrap_or(Interest::Stop);
    poll.set(interest);
}

/// libuv's close callback: frees the handle and the `Rc<PollState>` it held.
unsafe extern "C" fn on_close<H>(handle: *mut c_void) {
    // SAFETY: `data` holds the `Rc<PollState<H>>` leaked by `UvLoop::poll`; libuv calls
    // this once, after which it never touches the handle again, so both may be freed.
    unsafe {
        let poll = Rc::from_raw((*handle.cast::<HandleHead>()).data as *const PollState<H>);
        let layout = poll.layout;
        drop(poll);
        std::alloc::dealloc(handle.cast(), layout);
    }
}
