//! `Bytes` to `Buffer` without a copy.
//!
//! [`to_buffer`] hands V8 a pointer into the message's memory (a slice of a
//! pooled read buffer) with `napi_create_external_buffer`. The `Bytes` that
//! owns the memory is boxed and given to napi as the finalize hint; when V8
//! collects the `Buffer`, [`finalize_bytes`] drops it, and once the last
//! slice of a read buffer is gone the buffer is back in its pool.
//!
//! Where external buffers are forbidden (Electron's V8 sandbox, answered
//! with `napi_no_external_buffers_allowed`) the payload is copied instead,
//! and so it is when the caller asks for copies (`useExternalBuffer: false`)
//! or the payload is empty (V8 wants distinct data pointers, and an empty
//! `Bytes` may point at a shared static).

use bytes::Bytes;
use napi::{check_status, sys, Env, JsBuffer, NapiValue, Result};
use std::ffi::c_void;
use std::ptr;

/// Finalizer for an external buffer made by [`to_buffer`].
///
/// # Safety
/// `hint` must be the pointer produced by `Box::into_raw(Box<Bytes>)` in
/// [`to_buffer`], and napi calls each finalizer exactly once.
unsafe extern "C" fn finalize_bytes(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Bytes>` leaked in `to_buffer` for this one
    // buffer; napi calls the finalizer exactly once, after V8 has dropped
    // the last reference to the buffer's memory, so nothing reads it later.
    drop(unsafe { Box::from_raw(hint.cast::<Bytes>()) });
}

/// A `Buffer` over `payload`'s memory (`external`), or a copy of it.
pub fn to_buffer(env: &Env, payload: Bytes, external: bool) -> Result<JsBuffer> {
    if !external || payload.is_empty() {
        return copy_buffer(env, &payload);
    }
    let len = payload.len();
    let data = payload.as_ptr().cast_mut().cast::<c_void>();
    let hint = Box::into_raw(Box::new(payload));
    let mut value = ptr::null_mut();
    // SAFETY: `data..data+len` is the memory of the `Bytes` now owned by
    // `hint`. A `Bytes` never moves or frees its memory while it lives, and
    // it lives until `finalize_bytes` drops it, which napi calls only after
    // V8 collected the buffer, so the pointer stays valid for every access
    // JavaScript can make. The memory is a heap region of its own (a slice
    // of a pooled read buffer that no other message covers), so a write
    // from JavaScript cannot reach another message's bytes, and no Rust
    // reference to it exists while JavaScript holds it. `len > 0` and the
    // region is distinct from every other live external buffer's, as V8
    // requires. `env` is the live environment of the current call.
    let status = unsafe {
        sys::napi_create_external_buffer(
            env.raw(),
            len,
            data,
            Some(finalize_bytes),
            hint.cast::<c_void>(),
            &mut value,
        )
    };
    if status == sys::Status::napi_no_external_buffers_allowed {
        // SAFETY: napi refused the buffer and did not take the hint, so we
        // still own the box and take it back exactly once.
        let payload = unsafe { Box::from_raw(hint) };
        return copy_buffer(env, &payload);
    }
    if status != sys::Status::napi_ok {
        // SAFETY: on failure napi registered no finalizer for the hint (it
        // is only attached to a buffer that was created), so we own it.
        drop(unsafe { Box::from_raw(hint) });
        check_status!(status)?;
    }
    // SAFETY: napi returned `napi_ok`, so `value` is a valid Buffer handle
    // in `env`'s current handle scope.
    Ok(unsafe { JsBuffer::from_raw_unchecked(env.raw(), value) })
}

/// A `Buffer` holding a copy of `data` in memory V8 allocates.
///
/// napi-rs's own `create_buffer_copy` builds a `Vec` over V8's memory
/// (and over a null pointer for an empty buffer), so it is not used.
pub fn copy_buffer(env: &Env, data: &[u8]) -> Result<JsBuffer> {
    let mut value = ptr::null_mut();
    let status = if data.is_empty() {
        // SAFETY: a zero-length buffer needs no data pointer; `env` is the
        // live environment of the current call.
        unsafe { sys::napi_create_buffer(env.raw(), 0, ptr::null_mut(), &mut value) }
    } else {
        let mut copied = ptr::null_mut();
        // SAFETY: `data` is a valid slice for the duration of the call and
        // napi copies exactly `data.len()` bytes out of it; `copied` is an
        // out-parameter we do not use afterwards.
        unsafe {
            sys::napi_create_buffer_copy(
                env.raw(),
                data.len(),
                data.as_ptr().cast::<c_void>(),
                &mut copied,
                &mut value,
            )
        }
    };
    check_status!(status)?;
    // SAFETY: napi returned `napi_ok`, so `value` is a valid Buffer handle
    // in `env`'s current handle scope.
    Ok(unsafe { JsBuffer::from_raw_unchecked(env.raw(), value) })
}

/// A new `Buffer` of `len` bytes and the slice of its memory to fill.
///
/// The slice is only valid until the Buffer can be collected or moved,
/// that is within the current napi call: callers fill it before they return
/// to JavaScript and keep the `JsBuffer` reachable meanwhile (it is in their
/// handle scope).
pub fn alloc_buffer(env: &Env, len: usize) -> Result<(JsBuffer, &'static mut [u8])> {
    let mut value = ptr::null_mut();
    let mut data = ptr::null_mut();
    // SAFETY: `env` is the live environment of the current call; napi
    // writes the new Buffer and its data pointer into the out-parameters.
    check_status!(unsafe { sys::napi_create_buffer(env.raw(), len, &mut data, &mut value) })?;
    let slice: &'static mut [u8] = if len == 0 || data.is_null() {
        &mut []
    } else {
        // SAFETY: napi allocated `len` bytes at `data` for the new Buffer
        // (off the V8 heap, so a collection does not move them), nothing
        // else refers to them yet, and the Buffer stays alive in the
        // caller's handle scope for as long as the caller uses the slice
        // (see the function docs; the 'static lifetime is not used past
        // the call).
        unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), len) }
    };
    // SAFETY: napi returned `napi_ok`, so `value` is a valid Buffer handle
    // in `env`'s current handle scope.
    Ok((
        unsafe { JsBuffer::from_raw_unchecked(env.raw(), value) },
        slice,
    ))
}

/// Micro-benchmark hook: `n` Buffers over slices of one shared `Bytes`
/// (external) or copies of them, in an array. Not part of the API.
#[napi_derive::napi(js_name = "_benchBuffers")]
pub fn bench_buffers(env: Env, n: u32, size: u32, external: bool) -> Result<napi::JsObject> {
    let all = Bytes::from(vec![7u8; (n as usize) * (size as usize).max(1)]);
    let mut arr = env.create_array_with_length(n as usize)?;
    for i in 0..n as usize {
        let s = i * size as usize;
        arr.set_element(
            i as u32,
            to_buffer(&env, all.slice(s..s + size as usize), external)?,
        )?;
    }
    Ok(arr)
}
