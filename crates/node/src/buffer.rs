//! The binding's buffer handling: JS Buffers over engine-owned regions, and user Buffers
//! kept alive while registered. The only unsafe code of the binding lives here.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use ferry_core::Region;
use napi::bindgen_prelude::{Buffer, ToNapiValue, TypeName, ValueType};
use napi::sys;

/// A JS Buffer viewing an engine-owned region. The Buffer holds an `Arc<Region>`, so the
/// memory stays mapped until both the region is released and the Buffer is collected.
/// A region exposed to JS as a Buffer.
pub struct RegionBuffer(pub(crate) Arc<Region>);

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
        let len = val.0.len();
        let data = val.0.as_ptr();
        let hint = Box::into_raw(Box::new(val.0));
        let mut out = std::ptr::null_mut();
        // SAFETY: `data` points at `len` bytes that stay mapped while the leaked `Arc` in
        // `hint` lives; `finalize_region` frees that `Arc` when V8 collects the Buffer.
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
            // SAFETY: creation failed, so V8 never took ownership of `hint`.
            drop(unsafe { Box::from_raw(hint) });
            return Err(napi::Error::new(
                napi::Status::GenericFailure,
                "cannot create an external Buffer over the region (this runtime forbids external buffers)",
            ));
        }
        Ok(out)
    }
}

/// Keeps a registered user Buffer alive. napi's `Buffer` is `Send` and releases its
/// reference on the JS thread whichever thread drops it; the mutex makes it `Sync`.
pub(crate) struct HeldBuffer(#[allow(dead_code)] Mutex<Buffer>);

/// Pointer and length of a user Buffer, plus what keeps it alive.
pub(crate) fn hold(mut buffer: Buffer) -> (*mut u8, usize, HeldBuffer) {
    let slice: &mut [u8] = &mut buffer;
    let (ptr, len) = (slice.as_mut_ptr(), slice.len());
    (ptr, len, HeldBuffer(Mutex::new(buffer)))
}
