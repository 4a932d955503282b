//! Promises settled exactly once, from any thread.
//!
//! Each JS thread has one port: a threadsafe function made once (not one per Promise, as a
//! napi-rs deferred makes), the table of its Promises still waiting, and a queue. An
//! outcome from another thread joins the queue and wakes the loop once for all that queued
//! meanwhile. An outcome produced on the JS thread itself while its event loop calls the
//! engine back (a reply the loop read, `uv_loop`) settles when that callback ends, inside a
//! callback scope of its own: no queue, no wake-up, and the Promise's reactions run before
//! the loop polls again. The threadsafe function keeps Node alive only while Promises wait
//! or an engine of the thread holds the loop (`hold`: one that is open and ref'd, as a
//! listening `net.Server`). So holding costs nothing per call: the handle's state changes
//! only when the first Promise starts waiting or the last one settles with no engine held,
//! and when an engine is ref'd, unref'd or closed. The napi calls behind all this are
//! `ffi::JsThread`'s.
//!
//! A Promise that is dropped without settling keeps Node's event loop alive forever, so the
//! guard resolves it with a default value when the operation it belonged to was never
//! started (that Promise is never handed to JS).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use napi::bindgen_prelude::{Either, ToNapiValue, Unknown};
use napi::Env;

use crate::ffi::{Deferred, JsThread, OnWake, WakeQueue};

/// Makes a settled value on the JS thread.
type Job = Box<dyn for<'env> FnOnce(&'env Env) -> napi::Result<Unknown<'env>> + Send>;

/// What other threads reach a port through.
type Queue = WakeQueue<(u64, Job)>;

/// One JS thread's port.
struct Port {
    thread: JsThread,
    queue: Arc<Queue>,
    waiting: RefCell<HashMap<u64, Deferred>>,
    next_id: Cell<u64>,
    /// Outcomes produced during a loop callback, settled when it ends.
    ready: RefCell<Vec<(u64, Job)>>,
    /// Engines of this thread that hold the event loop (`hold`).
    holds: Cell<usize>,
    /// Whether the threadsafe function is ref'd now.
    kept: Cell<bool>,
}

thread_local! {
    static PORT: RefCell<Option<Rc<Port>>> = const { RefCell::new(None) };
    /// Set while the event loop calls the engine back (`in_loop_callback`).
    static IN_LOOP_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// This thread's port, made on first use.
fn port(env: &Env) -> napi::Result<Rc<Port>> {
    if let Some(p) = PORT.with(|p| p.borrow().clone()) {
        return Ok(p);
    }
    // When the environment goes, the port is forgotten (its Promises can no longer be
    // settled), after the queue is closed.
    let (thread, queue) = JsThread::new::<_, Wake>(env, "ferry", || {
        PORT.with(|p| p.borrow_mut().take());
    })?;
    let port = Rc::new(Port {
        thread,
        queue,
        waiting: RefCell::default(),
        next_id: Cell::new(0),
        ready: RefCell::default(),
        holds: Cell::new(0),
        kept: Cell::new(false),
    });
    PORT.with(|p| *p.borrow_mut() = Some(port.clone()));
    Ok(port)
}

impl Port {
    /// Settles waiting Promise `id` with what `job` makes (on the JS thread, in a scope).
    fn settle(&self, id: u64, job: Job) {
        let Some(deferred) = self.waiting.borrow_mut().remove(&id) else {
            return;
        };
        match job(self.thread.env()) {
            Ok(value) => self.thread.resolve(deferred, value),
            Err(e) => self.thread.reject(deferred, &e.reason),
        }
        self.refresh();
    }

    /// Refs the threadsafe function while Promises wait or an engine holds the loop, and
    /// unrefs it otherwise; touches it only when that changes.
    fn refresh(&self) {
        let keep = self.holds.get() > 0 || !self.waiting.borrow().is_empty();
        if keep != self.kept.replace(keep) {
            self.thread.keep_alive(keep);
        }
    }

    /// Settles what a loop callback produced, in a callback scope whose end runs the
    /// Promises' reactions. If that scope cannot be opened (the environment is closing),
    /// the outcomes go through the queue instead.
    fn flush(&self) {
        let ready = std::mem::take(&mut *self.ready.borrow_mut());
        if ready.is_empty() {
            return;
        }
        let unsettled = self.thread.in_callback_scope(ready, |ready| {
            for (id, job) in ready {
                self.settle(id, job);
            }
        });
        if let Err(ready) = unsettled {
            for item in ready {
                self.queue.push(item);
            }
        }
    }
}

/// The threadsafe function's call: settles everything queued.
struct Wake;

impl OnWake for Wake {
    fn on_wake(_env: &Env) {
        let Some(port) = PORT.with(|p| p.borrow().clone()) else {
            return;
        };
        for (id, job) in port.queue.take() {
            port.settle(id, job);
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

/// One more (`held`) or one fewer engine of this thread holds the event loop: while any
/// does, Node stays alive (as with a listening `net.Server`). The caller keeps count of its
/// own hold, taking and giving it back once each.
pub(crate) fn hold(env: &Env, held: bool) -> napi::Result<()> {
    let port = port(env)?;
    let holds = port.holds.get();
    port.holds.set(if held {
        holds + 1
    } else {
        holds.saturating_sub(1)
    });
    port.refresh();
    Ok(())
}

pub(crate) struct Settle<T: ToNapiValue + Default + Send + 'static> {
    queue: Option<Arc<Queue>>,
    id: u64,
    _value: PhantomData<fn(T)>,
}

impl<T: ToNapiValue + Default + Send + 'static> Settle<T> {
    /// A Promise, and what settles it.
    pub(crate) fn new(env: &Env) -> napi::Result<(Self, napi::bindgen_prelude::Object<'_>)> {
        let port = port(env)?;
        let (deferred, promise) = port.thread.promise(env)?;
        let id = port.next_id.get().wrapping_add(1);
        port.next_id.set(id);
        port.waiting.borrow_mut().insert(id, deferred);
        port.refresh();
        Ok((
            Self {
                queue: Some(port.queue.clone()),
                id,
                _value: PhantomData,
            },
            promise,
        ))
    }

    /// Resolves the Promise with `value` (from any thread).
    pub(crate) fn resolve(mut self, value: T) {
        self.deliver(value);
    }

    fn deliver(&mut self, value: T) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        let job: Job = Box::new(move |env| value.into_unknown(env));
        let here =
            std::thread::current().id() == queue.js_thread() && IN_LOOP_CALLBACK.with(Cell::get);
        if here {
            if let Some(port) = PORT.with(|p| p.borrow().clone()) {
                port.ready.borrow_mut().push((self.id, job));
                return;
            }
        }
        queue.push((self.id, job));
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
