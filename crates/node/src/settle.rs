//! A Promise settled exactly once. A JS deferred that is dropped without settling keeps
//! Node's event loop alive forever, so the guard resolves it with a default value when the
//! operation it belonged to was never started (that Promise is never handed to JS).

use napi::bindgen_prelude::{Either, ToNapiValue};
use napi::{Env, JsDeferred};

type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T>>;

pub(crate) struct Settle<T: ToNapiValue + Default + Send + 'static> {
    deferred: Option<JsDeferred<T, Resolver<T>>>,
}

impl<T: ToNapiValue + Default + Send + 'static> Settle<T> {
    /// A deferred and its Promise.
    pub(crate) fn new(env: &Env) -> napi::Result<(Self, napi::bindgen_prelude::Object<'_>)> {
        let (deferred, promise) = env.create_deferred::<T, Resolver<T>>()?;
        Ok((
            Self {
                deferred: Some(deferred),
            },
            promise,
        ))
    }

    /// Resolves the Promise with `value` (from any thread).
    pub(crate) fn resolve(mut self, value: T) {
        if let Some(d) = self.deferred.take() {
            d.resolve(Box::new(move |_| Ok(value)));
        }
    }
}

impl<T: ToNapiValue + Default + Send + 'static> Drop for Settle<T> {
    fn drop(&mut self) {
        if let Some(d) = self.deferred.take() {
            d.resolve(Box::new(|_| Ok(T::default())));
        }
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
