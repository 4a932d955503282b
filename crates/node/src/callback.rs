//! A JS function called from any thread, without keeping Node alive: how engine events
//! and notification signals reach JS.

use napi::bindgen_prelude::{Function, JsValuesTupleIntoVec};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;

use crate::convert::internal;

/// Wraps `callback` as a function any thread may call; calls never block and are dropped
/// once the environment is going away.
pub(crate) fn weak_handler<T>(
    callback: Function<'_, T, ()>,
) -> napi::Result<impl Fn(T) + Send + Sync + 'static, String>
where
    T: JsValuesTupleIntoVec + Send + 'static,
{
    let tsfn: ThreadsafeFunction<T, (), T, Status, false, true> = callback
        .build_threadsafe_function()
        .callee_handled::<false>()
        .weak::<true>()
        .build()
        .map_err(internal)?;
    Ok(move |value: T| {
        let _ = tsfn.call(value, ThreadsafeFunctionCallMode::NonBlocking);
    })
}
