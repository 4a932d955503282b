//! The binding's buffer handling: JS Buffers over windows of engine-owned regions, and
//! user memory kept alive while registered. The only unsafe code of the binding that
//! touches memory lives here.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use ferry_core::{Error, Region};
use napi::bindgen_prelude::{Buffer, FromNapiValue, ToNapiValue, TypeName, Unknown, ValueType};
use napi::{sys, Env, JsValue};

/// Largest Buffer handed to JS: Node 20 caps one Buffer at 4 GiB (`buffer.constants
/// .MAX_LENGTH`), and asking napi for more fails. Larger regions are seen through windows.
pub(crate) const MAX_VIEW_BYTES: u64 = 1 << 32;

/// A JS Buffer viewing `[offset, offset + len)` of an engine-owned region. The Buffer holds
/// an `Arc<Region>`, so the memory stays mapped until both the region is released and the
/// Buffer is collected.
pub struct RegionBuffer {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

impl RegionBuffer {
    /// A window of `region`, checked to lie inside it and to fit one Buffer.
    pub(crate) fn new(region: Arc<Region>, offset: u64, len: u64) -> Result<Self, Error> {
        ferry_core::memory::check_range(offset, len, region.len() as u64)?;
        if len > MAX_VIEW_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a Buffer holds at most {MAX_VIEW_BYTES} bytes, {len} asked: view the region in windows (region.view(offset, length))"
            )));
        }
        // Both fit in usize: they lie inside a mapped region.
        Ok(Self {
            region,
            offset: offset as usize,
            len: len as usize,
        })
    }
}

unsafe extern "C" fn finalize_region(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Arc<Region>>` leaked in `to_napi_value` below; V8 calls
    // this finalizer exactly once, so the box is reclaimed exactly once.
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
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        // In bounds: `RegionBuffer::new` checked the window against the region.
        let data = val.region.as_ptr().wrapping_add(val.offset);
        let len = val.len;
        let hint = Box::into_raw(Box::new(val.region));
        let mut out = std::ptr::null_mut();
        // SAFETY: `data` points at `len` bytes inside the region, which stay mapped while
        // the leaked `Arc` in `hint` lives; `finalize_region` frees that `Arc` when V8
        // collects the Buffer.
        let status = unsafe {
            sys::napi_create_external_buffer(
                env,
                len,
                data.cast(),
                Some(finalize_region),
                hint.cast(),
                &mut out,
            )
        };
        if status != sys::Status::napi_ok {
            // Not freed here: Node runs the finalizer itself on some failures (a length
            // over its limit), so freeing `hint` too would free it twice. One `Arc` leaked
            // on a failure that `MAX_VIEW_BYTES` already makes unreachable is the safe side.
            return Err(napi::Error::new(
                napi::Status::GenericFailure,
                "cannot create an external Buffer over the region (this runtime forbids external buffers)",
            ));
        }
        Ok(out)
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
