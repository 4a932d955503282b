//! The binding's buffer handling: JS Buffers over windows of engine-owned regions, and
//! user memory kept alive while registered. The only unsafe code of the binding that
//! touches memory lives here.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_core::{Error, Region};
use napi::bindgen_prelude::{
    Buffer, FromNapiValue, Function, JsObjectValue, Object, ToNapiValue, TypeName, Unknown,
    ValueType,
};
use napi::{sys, Env, JsValue};

use crate::js::exact_u64;

/// The Buffer limit assumed where the runtime's own cannot be read: Node 20's 4 GiB, the
/// lowest of the Node lines Ferry supports.
const FALLBACK_MAX_VIEW_BYTES: u64 = 1 << 32;

/// This process's Buffer limit once read; 0 until then.
static MAX_VIEW_BYTES: AtomicU64 = AtomicU64::new(0);

/// Largest Buffer this runtime makes: `require('node:buffer').constants.MAX_LENGTH` (4 GiB
/// on Node 20, 2^53 - 1 from Node 22 on), read once per process through
/// `process.getBuiltinModule`, the value `MAX_VIEW_BYTES` of index.ts holds too. Where it
/// cannot be read (no `getBuiltinModule`, or a script replaced it with something else)
/// it is Node 20's 4 GiB. The value only decides which error a too-long view gets:
/// whatever it is, a Buffer the runtime refuses comes back as an error, never an abort
/// (see `RegionBuffer::new`).
pub(crate) fn max_view_bytes(env: &Env) -> u64 {
    let known = MAX_VIEW_BYTES.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    // Read outside any lock: the read runs JS, which may call back into the binding.
    let read = read_max_length(env);
    // A getter or function that threw leaves its exception pending; it is not this
    // call's error, and a pending exception would fail every napi call after it.
    let _ = take_exception(env.raw());
    let limit = read.unwrap_or(FALLBACK_MAX_VIEW_BYTES);
    MAX_VIEW_BYTES.store(limit, Ordering::Relaxed);
    limit
}

/// `value` as an object, if it is one.
fn as_object(value: Unknown<'_>) -> Option<Object<'_>> {
    if value.get_type().ok()? != ValueType::Object {
        return None;
    }
    // SAFETY: `value` was just checked to be an object value of its live env.
    unsafe { value.cast() }.ok()
}

/// `process.getBuiltinModule('node:buffer').constants.MAX_LENGTH`, if every step is there
/// and it is a positive integer.
fn read_max_length(env: &Env) -> Option<u64> {
    let global = env.get_global().ok()?;
    let process = as_object(global.get_named_property::<Unknown>("process").ok()?)?;
    let get = process.get::<Unknown>("getBuiltinModule").ok()??;
    if get.get_type().ok()? != ValueType::Function {
        return None;
    }
    // SAFETY: `get` was just checked to be a function value of the live env.
    let get: Function<&str, Unknown> = unsafe { get.cast() }.ok()?;
    let module = as_object(get.apply(process, "node:buffer").ok()?)?;
    let constants = as_object(module.get::<Unknown>("constants").ok()??)?;
    let max = constants.get::<Unknown>("MAX_LENGTH").ok()??;
    if max.get_type().ok()? != ValueType::Number {
        return None;
    }
    // SAFETY: `max` was just checked to be a number value of the live env.
    let max: f64 = unsafe { max.cast() }.ok()?;
    exact_u64(max).filter(|&m| m > 0)
}

/// Clears the exception pending in `env`, if any, and returns its message (where it has
/// a string one).
fn take_exception(env: sys::napi_env) -> Option<String> {
    let mut pending = false;
    // SAFETY: `env` is the live env of the current call; the out-pointer is a valid local.
    let status = unsafe { sys::napi_is_exception_pending(env, &mut pending) };
    if status != sys::Status::napi_ok || !pending {
        return None;
    }
    let mut exception = std::ptr::null_mut();
    // SAFETY: as above; clearing a pending exception is what this call is for.
    let status = unsafe { sys::napi_get_and_clear_last_exception(env, &mut exception) };
    if status != sys::Status::napi_ok || exception.is_null() {
        return None;
    }
    // SAFETY: `exception` was just returned for this env.
    let exception = unsafe { Unknown::from_napi_value(env, exception) }.ok()?;
    let message = as_object(exception)
        .and_then(|e| e.get::<Unknown>("message").ok().flatten())
        .filter(|m| m.get_type().ok() == Some(ValueType::String))
        // SAFETY: `m` was just checked to be a string value of the live env.
        .and_then(|m| unsafe { m.cast::<String>() }.ok());
    // Reading `message` may itself have thrown (a getter); that one is dropped too.
    let mut again = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe {
        sys::napi_is_exception_pending(env, &mut pending);
        if pending {
            sys::napi_get_and_clear_last_exception(env, &mut again);
        }
    }
    message
}

/// A JS Buffer viewing `[offset, offset + len)` of an engine-owned region. The Buffer holds
/// an `Arc<Region>`, so the memory stays mapped until both the region is released and the
/// Buffer is collected.
pub struct RegionBuffer(sys::napi_value);

impl RegionBuffer {
    /// A Buffer over a window of `region`, checked to lie inside it and to fit one Buffer
    /// of this runtime. Every refusal is an error, `ERR_FERRY_INVALID_ARGUMENT`: one over
    /// `max_view_bytes` before napi is asked, and one napi refuses all the same (with the
    /// exception Node left pending cleared, so it is not thrown instead).
    pub(crate) fn new(
        env: &Env,
        region: Arc<Region>,
        offset: u64,
        len: u64,
    ) -> Result<Self, Error> {
        ferry_core::memory::check_range(offset, len, region.len() as u64)?;
        let max = max_view_bytes(env);
        if len > max {
            return Err(Error::InvalidArgument(format!(
                "a Buffer holds at most {max} bytes on this runtime (buffer.constants.MAX_LENGTH), {len} asked: view the region in windows (region.view(offset, length))"
            )));
        }
        // Both fit in usize and the window is in bounds: `check_range` put it inside a
        // mapped region.
        let data = region.as_ptr().wrapping_add(offset as usize);
        let hint = Box::into_raw(Box::new(region));
        let mut out = std::ptr::null_mut();
        // SAFETY: `data` points at `len` bytes inside the region, which stay mapped while
        // the leaked `Arc` in `hint` lives; `finalize_region` frees that `Arc` when V8
        // collects the Buffer. `env` is the live env of this call.
        let status = unsafe {
            sys::napi_create_external_buffer(
                env.raw(),
                len as usize,
                data.cast(),
                Some(finalize_region),
                hint.cast(),
                &mut out,
            )
        };
        if status == sys::Status::napi_ok && !out.is_null() {
            return Ok(Self(out));
        }
        // `hint` is not freed here: Node runs the finalizer itself on a refusal it made
        // (a length over its limit), so freeing it too would free it twice. One `Arc`
        // leaked on a failure before that point is the safe side.
        let why = take_exception(env.raw())
            .unwrap_or_else(|| format!("napi status {status}: external buffers unavailable"));
        Err(Error::InvalidArgument(format!(
            "this runtime refused a Buffer of {len} bytes over the region ({why}): view the region in windows (region.view(offset, length))"
        )))
    }
}

unsafe extern "C" fn finalize_region(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Arc<Region>>` leaked in `RegionBuffer::new`; Node calls
    // this finalizer exactly once (when V8 collects the Buffer, or when it refuses to
    // make it), so the box is reclaimed exactly once.
    drop(unsafe { Box::from_raw(hint.cast::<Arc<Region>>()) });
}

impl TypeName for RegionBuffer {
    fn type_name() -> &'static str {
        "Buffer"
    }
    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ToNapiValue for RegionBuffer {
    unsafe fn to_napi_value(_env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        // Made by `RegionBuffer::new` in the same call, so still in its handle scope.
        Ok(val.0)
    }
}

/// Keeps registered user memory alive. napi's `Buffer` (which takes any ArrayBufferView)
/// is `Send` and releases its reference on the JS thread whichever thread drops it; the
/// mutex makes it `Sync`.
pub(crate) struct HeldMemory(#[allow(dead_code)] Mutex<Buffer>);

/// Pointer and length of user memory that may be registered, plus what keeps it alive.
///
/// Only memory whose backing store JS cannot detach is accepted: a TypedArray, DataView or
/// Buffer over a `SharedArrayBuffer` (a shared `WebAssembly.Memory`'s buffer included).
/// A plain ArrayBuffer can be detached (`structuredClone(ab, { transfer: [ab] })`,
/// `ab.transfer()`) and its memory freed or handed to another owner while a reference to
/// it is held, so a transfer into it would write memory the engine no longer owns.
pub(crate) fn hold_shared(
    env: &Env,
    value: Unknown,
) -> Result<(*mut u8, usize, HeldMemory), Error> {
    let refuse = |why: &str| {
        Error::InvalidArgument(format!(
            "registerMemory takes a TypedArray, DataView or Buffer over a SharedArrayBuffer: {why}; use engine.allocate(n), or Buffer.from(new SharedArrayBuffer(n))"
        ))
    };
    let raw_env = env.raw();
    let raw = value.raw();
    let mut is_typed = false;
    let mut is_view = false;
    // SAFETY: `raw` is a live value of `raw_env`, the env of this call; the out-pointers
    // are valid locals.
    unsafe {
        sys::napi_is_typedarray(raw_env, raw, &mut is_typed);
        sys::napi_is_dataview(raw_env, raw, &mut is_view);
    }
    let mut arraybuffer = std::ptr::null_mut();
    let mut data = std::ptr::null_mut();
    let mut byte_len = 0usize;
    if is_typed {
        let mut kind = 0;
        let mut elements = 0usize;
        let mut byte_offset = 0usize;
        // SAFETY: `raw` is a typed array (checked above); out-pointers are valid locals.
        let status = unsafe {
            sys::napi_get_typedarray_info(
                raw_env,
                raw,
                &mut kind,
                &mut elements,
                &mut data,
                &mut arraybuffer,
                &mut byte_offset,
            )
        };
        if status != sys::Status::napi_ok {
            return Err(refuse("its typed array info is unavailable"));
        }
        byte_len = elements.saturating_mul(element_size(kind));
    } else if is_view {
        let mut byte_offset = 0usize;
        // SAFETY: `raw` is a DataView (checked above); out-pointers are valid locals.
        let status = unsafe {
            sys::napi_get_dataview_info(
                raw_env,
                raw,
                &mut byte_len,
                &mut data,
                &mut arraybuffer,
                &mut byte_offset,
            )
        };
        if status != sys::Status::napi_ok {
            return Err(refuse("its DataView info is unavailable"));
        }
    } else {
        return Err(refuse("got no ArrayBuffer view"));
    }
    // A view's buffer is an ArrayBuffer or a SharedArrayBuffer; `napi_is_arraybuffer` is
    // true only for the former (V8's IsArrayBuffer excludes shared ones).
    let mut detachable = true;
    // SAFETY: `arraybuffer` was returned by the info call above for this env.
    let status = unsafe { sys::napi_is_arraybuffer(raw_env, arraybuffer, &mut detachable) };
    if status != sys::Status::napi_ok || detachable {
        return Err(refuse(
            "its buffer is a plain ArrayBuffer, which JS can detach while the engine uses it",
        ));
    }
    if byte_len == 0 || data.is_null() {
        return Err(Error::InvalidArgument(
            "cannot register an empty buffer".into(),
        ));
    }
    // SAFETY: `raw` is an ArrayBufferView of this env; napi's Buffer takes any view
    // (Node's Buffer::HasInstance is IsArrayBufferView) and holds a reference to it.
    let held = unsafe { Buffer::from_napi_value(raw_env, raw) }
        .map_err(|e| refuse(&format!("cannot hold it ({})", e.reason)))?;
    Ok((data.cast(), byte_len, HeldMemory(Mutex::new(held))))
}

/// Bytes per element of a napi typed array kind.
fn element_size(kind: sys::napi_typedarray_type) -> usize {
    match kind {
        sys::TypedarrayType::int8_array
        | sys::TypedarrayType::uint8_array
        | sys::TypedarrayType::uint8_clamped_array => 1,
        sys::TypedarrayType::int16_array | sys::TypedarrayType::uint16_array => 2,
        sys::TypedarrayType::int32_array
        | sys::TypedarrayType::uint32_array
        | sys::TypedarrayType::float32_array => 4,
        sys::TypedarrayType::float64_array
        | sys::TypedarrayType::bigint64_array
        | sys::TypedarrayType::biguint64_array => 8,
        // A kind this binding does not know (a newer Node's Float16Array): bytes per
        // element unknown, so nothing is registered.
        _ => 0,
    }
}
