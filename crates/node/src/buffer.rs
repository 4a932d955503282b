//! Memory that both JS and Rust touch, and the contracts that make it sound — with ffi.rs,
//! the only `unsafe` of the binding:
//!
//! - `RegionBuffer`: a JS Buffer over a window of an engine-owned region (an external
//!   Buffer); it holds the region, so the memory stays mapped until the Buffer is collected.
//! - `register_shared`: JS memory registered with the engine — only a view over a
//!   SharedArrayBuffer, which JS cannot detach or resize, held referenced while registered.
//! - `OutBytes`: a Uint8Array argument the call writes in place, the only Rust view of its
//!   bytes during that call.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_core::{Access, Engine, Error, Region};
use napi::bindgen_prelude::{
    Buffer, FromNapiValue, Function, JsObjectValue, Object, ToNapiValue, TypeName, Uint8ArraySlice,
    Unknown, ValidateNapiValue, ValueType,
};
use napi::{sys, Env, JsValue};

use crate::ffi;
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
    let _ = take_exception(env);
    let limit = read.unwrap_or(FALLBACK_MAX_VIEW_BYTES);
    MAX_VIEW_BYTES.store(limit, Ordering::Relaxed);
    limit
}

/// `value` as an object, if it is one.
fn as_object(value: Unknown<'_>) -> Option<Object<'_>> {
    if value.get_type().ok()? != ValueType::Object {
        return None;
    }
    Object::from_unknown(value).ok()
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
    let get: Function<&str, Unknown> = Function::from_unknown(get).ok()?;
    let module = as_object(get.apply(process, "node:buffer").ok()?)?;
    let constants = as_object(module.get::<Unknown>("constants").ok()??)?;
    let max = constants.get::<Unknown>("MAX_LENGTH").ok()??;
    if max.get_type().ok()? != ValueType::Number {
        return None;
    }
    let max = f64::from_unknown(max).ok()?;
    exact_u64(max).filter(|&m| m > 0)
}

/// Clears the exception pending in `env`, if any, and returns its message (where it has
/// a string one).
fn take_exception(env: &Env) -> Option<String> {
    let exception = ffi::clear_exception(env)?;
    let message = as_object(exception)
        .and_then(|e| e.get::<Unknown>("message").ok().flatten())
        .filter(|m| m.get_type().ok() == Some(ValueType::String))
        .and_then(|m| String::from_unknown(m).ok());
    // Reading `message` may itself have thrown (a getter); that one is dropped too.
    let _ = ffi::clear_exception(env);
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
        let why = take_exception(env)
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
struct HeldMemory(#[allow(dead_code)] Mutex<Buffer>);

/// Registers user memory with `engine`: a view over memory JS cannot take back.
///
/// Only memory whose backing store JS cannot detach is accepted: a TypedArray, DataView or
/// Buffer over a `SharedArrayBuffer` (a shared `WebAssembly.Memory`'s buffer included).
/// A plain ArrayBuffer can be detached (`structuredClone(ab, { transfer: [ab] })`,
/// `ab.transfer()`) and its memory freed or handed to another owner while a reference to
/// it is held, so a transfer into it would write memory the engine no longer owns.
pub(crate) fn register_shared(
    engine: &Engine,
    value: Unknown,
    access: Access,
) -> Result<Arc<Region>, Error> {
    let refuse = |why: &str| {
        Error::InvalidArgument(format!(
            "registerMemory takes a TypedArray, DataView or Buffer over a SharedArrayBuffer: {why}; use engine.allocate(n), or Buffer.from(new SharedArrayBuffer(n))"
        ))
    };
    let view = view_memory(&value).map_err(refuse)?;
    if !view.shared {
        return Err(refuse(
            "its buffer is a plain ArrayBuffer, which JS can detach while the engine uses it",
        ));
    }
    if view.byte_len == 0 || view.data.is_null() {
        return Err(Error::InvalidArgument(
            "cannot register an empty buffer".into(),
        ));
    }
    // napi's Buffer takes any view (Node's Buffer::HasInstance is IsArrayBufferView) and
    // holds a reference to it.
    let held = Buffer::from_unknown(value)
        .map_err(|e| refuse(&format!("cannot hold it ({})", e.reason)))?;
    let held = HeldMemory(Mutex::new(held));
    // SAFETY: `data`/`byte_len` describe the view's shared backing store, which `held`
    // keeps referenced for as long as the region exists; a SharedArrayBuffer can be
    // neither detached nor resized, so the memory stays where it is.
    unsafe { engine.register_memory(view.data, view.byte_len, access, Box::new(held)) }
}

/// The bytes an ArrayBufferView (a TypedArray, a DataView, a Buffer) shows, as Node-API
/// reports them. The pointer is only an address: using it past this call takes keeping the
/// view's memory alive and in place (`register_shared`).
struct ViewMemory {
    data: *mut u8,
    byte_len: usize,
    /// Its buffer is a SharedArrayBuffer, which JS can neither detach nor resize (not a
    /// plain ArrayBuffer, which it can).
    shared: bool,
}

/// What `value` shows, if it is an ArrayBuffer view; otherwise why not. Upholds: every
/// query is made on `value`'s own live env, each checked to apply before it is made.
fn view_memory(value: &Unknown) -> Result<ViewMemory, &'static str> {
    let env = value.value().env;
    let raw = value.raw();
    let mut is_typed = false;
    let mut is_view = false;
    // SAFETY: `raw` is a live value of `env`, the env of this call; the out-pointers are
    // valid locals.
    unsafe {
        sys::napi_is_typedarray(env, raw, &mut is_typed);
        sys::napi_is_dataview(env, raw, &mut is_view);
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
                env,
                raw,
                &mut kind,
                &mut elements,
                &mut data,
                &mut arraybuffer,
                &mut byte_offset,
            )
        };
        if status != sys::Status::napi_ok {
            return Err("its typed array info is unavailable");
        }
        byte_len = elements.saturating_mul(element_size(kind));
    } else if is_view {
        let mut byte_offset = 0usize;
        // SAFETY: `raw` is a DataView (checked above); out-pointers are valid locals.
        let status = unsafe {
            sys::napi_get_dataview_info(
                env,
                raw,
                &mut byte_len,
                &mut data,
                &mut arraybuffer,
                &mut byte_offset,
            )
        };
        if status != sys::Status::napi_ok {
            return Err("its DataView info is unavailable");
        }
    } else {
        return Err("got no ArrayBuffer view");
    }
    // A view's buffer is an ArrayBuffer or a SharedArrayBuffer; `napi_is_arraybuffer` is
    // true only for the former (V8's IsArrayBuffer excludes shared ones).
    let mut detachable = true;
    // SAFETY: `arraybuffer` was returned by the info call above for this env.
    let status = unsafe { sys::napi_is_arraybuffer(env, arraybuffer, &mut detachable) };
    Ok(ViewMemory {
        data: data.cast(),
        byte_len,
        shared: status == sys::Status::napi_ok && !detachable,
    })
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

/// A Uint8Array argument that the call writes in place (a status array). Unlike napi's
/// `Uint8ArraySlice` it is not `Copy`, so the call holds one view of those bytes; declare
/// it to TypeScript as `Uint8Array` (`ts_arg_type`).
pub struct OutBytes<'env>(Uint8ArraySlice<'env>);

impl OutBytes<'_> {
    /// The bytes, to write for as long as `self` is borrowed, or `None` when they share
    /// memory with `read` (the call's other typed-array argument, if any, read meanwhile).
    /// Upholds: no other Rust reference to these bytes lives meanwhile — the call's
    /// arguments are the only ones made from JS memory, this one is not copied, and the
    /// one it could overlap is checked — and no JS runs during the synchronous call.
    pub(crate) fn bytes_beside(&mut self, read: &[u32]) -> Option<&mut [u8]> {
        let out = self.0.as_ptr() as usize..self.0.as_ptr() as usize + self.0.len();
        let other = read.as_ptr() as usize..read.as_ptr() as usize + std::mem::size_of_val(read);
        if overlap(&out, &other) {
            return None;
        }
        // SAFETY: as the doc says: the slice views the caller's Uint8Array for this
        // synchronous call on the JS thread, and no other reference to its bytes exists.
        Some(unsafe { self.0.as_mut() })
    }
}

/// Whether two address ranges share a byte.
fn overlap(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}

impl FromNapiValue for OutBytes<'_> {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> napi::Result<Self> {
        // SAFETY: the caller's contract (a live env and value) is passed on unchanged.
        unsafe { Uint8ArraySlice::from_napi_value(env, value) }.map(Self)
    }
}

impl TypeName for OutBytes<'_> {
    fn type_name() -> &'static str {
        Uint8ArraySlice::type_name()
    }
    fn value_type() -> ValueType {
        Uint8ArraySlice::value_type()
    }
}

impl ValidateNapiValue for OutBytes<'_> {
    unsafe fn validate(
        env: sys::napi_env,
        value: sys::napi_value,
    ) -> napi::Result<sys::napi_value> {
        // SAFETY: the caller's contract (a live env and value) is passed on unchanged.
        unsafe { Uint8ArraySlice::validate(env, value) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_bytes_overlap_is_any_shared_byte() {
        assert!(overlap(&(0..8), &(7..9)));
        assert!(overlap(&(4..6), &(0..16)));
        assert!(!overlap(&(0..8), &(8..16)));
        assert!(!overlap(&(8..16), &(0..8)));
        // An empty view shares nothing, wherever it points.
        assert!(!overlap(&(4..4), &(0..16)));
        assert!(!overlap(&(0..16), &(4..4)));
    }

    #[test]
    fn element_sizes_follow_the_typed_array_kind() {
        assert_eq!(element_size(sys::TypedarrayType::uint8_array), 1);
        assert_eq!(element_size(sys::TypedarrayType::int16_array), 2);
        assert_eq!(element_size(sys::TypedarrayType::float32_array), 4);
        assert_eq!(element_size(sys::TypedarrayType::biguint64_array), 8);
        assert_eq!(element_size(99), 0);
    }
}
