//! Promises settled exactly once, from any thread.
//!
//! Each JS thread has one port: a threadsafe function made once (not one per Promise, as a
//! napi-rs deferred makes), the table of its Promises still waiting, and a queue. An
//! outcome from another thread joins the queue and wakes the loop once for all that queued
//! meanwhile. An outcome produced on the JS thread itself while its event loop calls the
//! engine back (a reply the loop read, `uv_loop`) settles when that callback ends, inside a
//! callback scope of its own: no queue, no wake-up, and the Promise's reactions run before
//! the loop polls again. The threadsafe function keeps Node alive only while Promises wait.
//!
//! A Promise that is dropped without settling keeps Node's event loop alive forever, so the
//! guard resolves it with a default value when the operation it belonged to was never
//! started (that Promise is never handed to JS).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use napi::bindgen_prelude::{Either, FromNapiValue, ToNapiValue};
use napi::{sys, Env};

/// Makes a settled value on the JS thread.
type Job = Box<dyn FnOnce(sys::napi_env) -> napi::Result<sys::napi_value> + Send>;

/// What other threads reach a port through.
struct Shared {
    thread: ThreadId,
    queue: Mutex<Queue>,
}

struct Queue {
    jobs: Vec<(u64, Job)>,
    /// The environment is gone: outcomes are dropped, the function is never called again.
    closed: bool,
    /// The port's threadsafe function (a raw napi handle).
    tsfn: usize,
}

/// One JS thread's port.
struct Port {
    env: sys::napi_env,
    tsfn: sys::napi_threadsafe_function,
    shared: Arc<Shared>,
    waiting: RefCell<HashMap<u64, sys::napi_deferred>>,
    next_id: Cell<u64>,
    /// Outcomes produced during a loop callback, settled when it ends.
    ready: RefCell<Vec<(u64, Job)>>,
    /// The resource and async context of the callback scopes `flush` opens.
    resource: sys::napi_ref,
    async_context: sys::napi_async_context,
}

thread_local! {
    static PORT: RefCell<Option<Rc<Port>>> = const { RefCell::new(None) };
    /// Set while the event loop calls the engine back (`in_loop_callback`).
    static IN_LOOP_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

fn check(status: sys::napi_status, what: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::from_reason(format!(
            "{what} failed ({status})"
        )))
    }
}

/// This thread's port, made on first use.
fn port(env: &Env) -> napi::Result<Rc<Port>> {
    if let Some(p) = PORT.with(|p| p.borrow().clone()) {
        return Ok(p);
    }
    let raw = env.raw();
    let mut name = ptr::null_mut();
    let mut tsfn = ptr::null_mut();
    let mut resource = ptr::null_mut();
    let mut resource_ref = ptr::null_mut();
    let mut async_context = ptr::null_mut();
    let label = "ferry";
    // SAFETY: called on the JS thread with its live `env`; every out-pointer is a local.
    unsafe {
        check(
            sys::napi_create_string_utf8(
                raw,
                label.as_ptr().cast(),
                label.len() as isize,
                &mut name,
            ),
            "napi_create_string_utf8",
        )?;
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
                Some(call_js),
                &mut tsfn,
            ),
            "napi_create_threadsafe_function",
        )?;
        check(
            sys::napi_unref_threadsafe_function(raw, tsfn),
            "napi_unref_threadsafe_function",
        )?;
        check(
            sys::napi_create_object(raw, &mut resource),
            "napi_create_object",
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
    let shared = Arc::new(Shared {
        thread: std::thread::current().id(),
        queue: Mutex::new(Queue {
            jobs: Vec::new(),
            closed: false,
            tsfn: tsfn as usize,
        }),
    });
    let port = Rc::new(Port {
        env: raw,
        tsfn,
        shared: shared.clone(),
        waiting: RefCell::default(),
        next_id: Cell::new(0),
        ready: RefCell::default(),
        resource: resource_ref,
        async_context,
    });
    env.add_env_cleanup_hook(shared, |shared| {
        // The environment goes: no call of the function after this, and the port is
        // forgotten (its Promises can no longer be settled).
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.closed = true;
        q.jobs.clear();
        // SAFETY: the function was made by `port` and is released once, here, under the
        // queue's lock that every caller of it takes and checks `closed` under.
        unsafe {
            sys::napi_release_threadsafe_function(
                q.tsfn as sys::napi_threadsafe_function,
                sys::ThreadsafeFunctionReleaseMode::abort,
            );
        }
        drop(q);
        PORT.with(|p| p.borrow_mut().take());
    })?;
    PORT.with(|p| *p.borrow_mut() = Some(port.clone()));
    Ok(port)
}

impl Port {
    /// Settles waiting Promise `id` with what `job` makes (on the JS thread, in a scope).
    fn settle(&self, id: u64, job: Job) {
        let Some(deferred) = self.waiting.borrow_mut().remove(&id) else {
            return;
        };
        let env = self.env;
        // SAFETY: on the JS thread, inside a handle scope (the threadsafe function's call or
        // `flush`'s), with this port's live `env`; `deferred` is settled once (removed above).
        unsafe {
            match job(env) {
                Ok(value) => {
                    sys::napi_resolve_deferred(env, deferred, value);
                }
                Err(e) => {
                    let mut msg = ptr::null_mut();
                    let mut error = ptr::null_mut();
                    let text = e.reason;
                    sys::napi_create_string_utf8(
                        env,
                        text.as_ptr().cast(),
                        text.len() as isize,
                        &mut msg,
                    );
                    sys::napi_create_error(env, ptr::null_mut(), msg, &mut error);
                    sys::napi_reject_deferred(env, deferred, error);
                }
            }
        }
        if self.waiting.borrow().is_empty() {
            // SAFETY: on the JS thread; the function lives as long as the port.
            unsafe { sys::napi_unref_threadsafe_function(env, self.tsfn) };
        }
    }

    /// Settles what a loop callback produced, in a callback scope whose end runs the
    /// Promises' reactions.
    fn flush(&self) {
        let ready = std::mem::take(&mut *self.ready.borrow_mut());
        if ready.is_empty() {
            return;
        }
        let env = self.env;
        let mut handles = ptr::null_mut();
        let mut scope = ptr::null_mut();
        let mut resource = ptr::null_mut();
        // SAFETY: on the JS thread, from a libuv callback (no JS on the stack); the scopes
        // are closed below in reverse order. If the callback scope cannot be opened (the
        // environment is closing), the outcomes go through the queue instead.
        unsafe {
            sys::napi_open_handle_scope(env, &mut handles);
            sys::napi_get_reference_value(env, self.resource, &mut resource);
            if sys::napi_open_callback_scope(env, resource, self.async_context, &mut scope)
                != sys::Status::napi_ok
            {
                sys::napi_close_handle_scope(env, handles);
                for (id, job) in ready {
                    queue(&self.shared, id, job);
                }
                return;
            }
            for (id, job) in ready {
                self.settle(id, job);
            }
            sys::napi_close_callback_scope(env, scope);
            sys::napi_close_handle_scope(env, handles);
        }
    }
}

/// The threadsafe function's call: settles everything queued.
unsafe extern "C" fn call_js(
    env: sys::napi_env,
    _f: sys::napi_value,
    _ctx: *mut c_void,
    _data: *mut c_void,
) {
    if env.is_null() {
        return; // the environment is being torn down
    }
    let Some(port) = PORT.with(|p| p.borrow().clone()) else {
        return;
    };
    let jobs = std::mem::take(
        &mut port
            .shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs,
    );
    // Called from Node: no panic may unwind out of it.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (id, job) in jobs {
            port.settle(id, job);
        }
    }));
}

/// Queues an outcome for the JS thread and wakes it if the queue was empty.
fn queue(shared: &Shared, id: u64, job: Job) {
    let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
    if q.closed {
        return;
    }
    let wake = q.jobs.is_empty();
    q.jobs.push((id, job));
    if wake {
        // SAFETY: the function is live: it is released only with `closed` set, under this
        // lock. A non-blocking call on an unbounded queue only fails when closing.
        unsafe {
            sys::napi_call_threadsafe_function(
                q.tsfn as sys::napi_threadsafe_function,
                ptr::null_mut(),
                sys::ThreadsafeFunctionCallMode::nonblocking,
            );
        }
    }
}

/// Runs `f` as the event loop's call into the engine: outcomes it produces on this thread
/// settle when it returns, before the loop polls again.
pub(crate) fn in_loop_callback<R>(f: impl FnOnce() -> R) -> R {
    let outer = IN_LOOP_CALLBACK.with(|c| c.replace(true));
    let r = f();
    IN_LOOP_CALLBACK.with(|c| c.set(outer));
    if !outer {
        if let Some(port) = PORT.with(|p| p.borrow().clone()) {
            // Called from libuv: no panic may unwind out of it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| port.flush()));
        }
    }
    r
}

pub(crate) struct Settle<T: ToNapiValue + Default + Send + 'static> {
    shared: Option<Arc<Shared>>,
    id: u64,
    _value: PhantomData<fn(T)>,
}

impl<T: ToNapiValue + Default + Send + 'static> Settle<T> {
    /// A Promise, and what settles it.
    pub(crate) fn new(env: &Env) -> napi::Result<(Self, napi::bindgen_prelude::Object<'_>)> {
        let port = port(env)?;
        let mut deferred = ptr::null_mut();
        let mut promise = ptr::null_mut();
        // SAFETY: on the JS thread with its live `env`; out-pointers are locals.
        unsafe {
            check(
                sys::napi_create_promise(port.env, &mut deferred, &mut promise),
                "napi_create_promise",
            )?;
        }
        let id = port.next_id.get().wrapping_add(1);
        port.next_id.set(id);
        let first = {
            let mut waiting = port.waiting.borrow_mut();
            waiting.insert(id, deferred);
            waiting.len() == 1
        };
        if first {
            // SAFETY: on the JS thread; the function lives as long as the port.
            unsafe { sys::napi_ref_threadsafe_function(port.env, port.tsfn) };
        }
        // SAFETY: `promise` is a live value of this `env`, made just above.
        let object = unsafe { napi::bindgen_prelude::Object::from_napi_value(port.env, promise)? };
        Ok((
            Self {
                shared: Some(port.shared.clone()),
                id,
                _value: PhantomData,
            },
            object,
        ))
    }

    /// Resolves the Promise with `value` (from any thread).
    pub(crate) fn resolve(mut self, value: T) {
        self.deliver(value);
    }

    fn deliver(&mut self, value: T) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        let job: Job = Box::new(move |env| {
            // SAFETY: jobs run in `Port::settle`, on the JS thread, inside a handle scope,
            // with its live `env`: what `to_napi_value` requires.
            unsafe { T::to_napi_value(env, value) }
        });
        let here = std::thread::current().id() == shared.thread && IN_LOOP_CALLBACK.with(Cell::get);
        if here {
            if let Some(port) = PORT.with(|p| p.borrow().clone()) {
                port.ready.borrow_mut().push((self.id, job));
                return;
            }
        }
        queue(&shared, self.id, job);
    }
}

impl<T: ToNapiValue + Default + Send + 'static> Drop for Settle<T> {
    fn drop(&mut self) {
        self.deliver(T::default());
    }
}

/// Where an outcome that may arrive before its call returns is kept.
enum Slot<T: ToNapiValue + Default + Send + 'static> {
    /// Nothing yet, and the call has not returned.
    Waiting,
    /// It arrived while the call still ran.
    Arrived(T),
    /// The call returned first: a Promise waits for it.
    Promised(Settle<T>),
    /// Handed on.
    Done,
}

/// An outcome that may arrive while the call that started it still runs — a same-host
/// copy done inline, on the JS thread. Then the call hands JS the value itself: no
/// deferred, no threadsafe function, no wake of the event loop (each costs microseconds,
/// more than a 4 KiB copy). Otherwise the call returns a Promise that the outcome settles
/// from whichever thread it arrives on.
pub(crate) struct Early<T: ToNapiValue + Default + Send + 'static> {
    slot: std::sync::Arc<std::sync::Mutex<Slot<T>>>,
}

/// The side that delivers the outcome (moved into the engine's callback).
pub(crate) struct Arrival<T: ToNapiValue + Default + Send + 'static> {
    slot: Option<std::sync::Arc<std::sync::Mutex<Slot<T>>>>,
}

/// What the call hands JS: the outcome (`A`), or a Promise of it (`B`); `await` takes
/// either.
pub(crate) type Handed<'env, T> = Either<T, napi::bindgen_prelude::Object<'env>>;

impl<T: ToNapiValue + Default + Send + 'static> Early<T> {
    pub(crate) fn new() -> (Self, Arrival<T>) {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Slot::Waiting));
        (Self { slot: slot.clone() }, Arrival { slot: Some(slot) })
    }

    /// Called on the JS thread once the call started the work: the outcome if it arrived,
    /// else a Promise that it will settle.
    pub(crate) fn hand(self, env: &Env) -> napi::Result<Handed<'_, T>> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *slot, Slot::Done) {
            Slot::Arrived(v) => Ok(Either::A(v)),
            Slot::Waiting => {
                let (settle, promise) = Settle::new(env)?;
                *slot = Slot::Promised(settle);
                Ok(Either::B(promise))
            }
            // Only `hand` promises, once; kept total all the same.
            Slot::Promised(_) | Slot::Done => Ok(Either::A(T::default())),
        }
    }
}

impl<T: ToNapiValue + Default + Send + 'static> Arrival<T> {
    /// Delivers the outcome (from any thread).
    pub(crate) fn resolve(mut self, value: T) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, value);
        }
    }
}

/// Keeps the outcome for `hand`, or settles the Promise `hand` made (outside the lock).
fn deliver<T: ToNapiValue + Default + Send + 'static>(slot: &std::sync::Mutex<Slot<T>>, value: T) {
    let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
    match std::mem::replace(&mut *s, Slot::Done) {
        Slot::Waiting => *s = Slot::Arrived(value),
        Slot::Promised(settle) => {
            drop(s);
            settle.resolve(value);
        }
        Slot::Arrived(_) | Slot::Done => {}
    }
}

impl<T: ToNapiValue + Default + Send + 'static> Drop for Arrival<T> {
    /// An outcome that never came (the work was dropped unstarted) settles as the default,
    /// so no Promise is left pending forever.
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, T::default());
        }
    }
}
