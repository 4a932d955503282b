//! A Promise settled exactly once. A JS deferred that is dropped without settling keeps
//! Node's event loop alive forever, so the guard resolves it with a default value when the
//! operation it belonged to was never started (that Promise is never handed to JS).

use napi::bindgen_prelude::ToNapiValue;
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
