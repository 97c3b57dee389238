//! `Bytes` to `Buffer` / `ArrayBuffer` without a copy.
//!
//! [`to_arraybuffer`] makes one external `ArrayBuffer` over the part of a
//! pooled read buffer that holds a batch's payloads, and JavaScript cuts it
//! into `Buffer` views: the received-message path, one napi call and one
//! finalizer per read buffer and batch instead of per message.
//! [`to_buffer`] makes one external `Buffer` over one `Bytes` (audio
//! packets, correlation data). Either way the `Bytes` that owns the memory
//! is boxed and given to napi as the finalize hint; when V8 collects the
//! (Array)Buffer, [`finalize_bytes`] drops it, and once the last slice of a
//! read buffer is gone the buffer is back in its pool.
//!
//! Where external buffers are forbidden (Electron's V8 sandbox, answered
//! with `napi_no_external_buffers_allowed`) the memory is copied instead,
//! and so it is when the caller asks for copies (`useExternalBuffer: false`)
//! or the payload is empty (V8 wants distinct data pointers, and an empty
//! `Bytes` may point at a shared static).

use bytes::Bytes;
use napi::{check_status, sys, Env, JsArrayBuffer, JsBuffer, NapiValue, Result};
use std::ffi::c_void;
use std::ptr;

/// Finalizer for an external buffer made by [`to_buffer`] or
/// [`to_arraybuffer`].
///
/// # Safety
/// `hint` must be the pointer produced by `Box::into_raw(Box<Bytes>)` in
/// [`to_buffer`] or [`to_arraybuffer`], and napi calls each finalizer
/// exactly once.
unsafe extern "C" fn finalize_bytes(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Bytes>` leaked in `to_buffer` or
    // `to_arraybuffer` for this one buffer; napi calls the finalizer exactly once, after V8 has dropped
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

/// An `ArrayBuffer` over `span`'s memory (`external`), or a copy of it.
///
/// This is how a batch of messages reaches JavaScript without a copy and
/// without a napi call per payload: `span` is the part of one pooled read
/// buffer that holds the batch's payloads from that buffer, one external
/// `ArrayBuffer` is made over it, and JavaScript makes each payload a
/// `Buffer` view into it (`Buffer.from(ab, offset, length)`). The `Bytes`
/// (which keeps the whole read buffer alive) is boxed and given to napi as
/// the finalize hint; when V8 collects the `ArrayBuffer`, that is when the
/// last view of it is gone, [`finalize_bytes`] drops it.
///
/// Where external buffers are forbidden (`napi_no_external_buffers_allowed`)
/// the span is copied into an `ArrayBuffer` V8 allocates, and the same
/// views work over the copy. `span` must not be empty.
pub fn to_arraybuffer(env: &Env, span: Bytes) -> Result<JsArrayBuffer> {
    if span.is_empty() {
        return Err(napi::Error::new(
            napi::Status::InvalidArg,
            "to_arraybuffer: empty span".to_string(),
        ));
    }
    let len = span.len();
    let data = span.as_ptr().cast_mut().cast::<c_void>();
    let hint = Box::into_raw(Box::new(span));
    let mut value = ptr::null_mut();
    // SAFETY: `data..data+len` is the memory of the `Bytes` now owned by
    // `hint`; a `Bytes` never moves or frees its memory while it lives, and
    // it lives until `finalize_bytes` drops it, which napi calls only after
    // V8 collected the ArrayBuffer (so after its last view), so the pointer
    // stays valid for every access JavaScript can make. JavaScript may
    // write through it (a view's `.buffer` reaches the whole span): the
    // span runs from the first to the last payload of this batch in this
    // read buffer, so it holds those messages and whatever packets arrived
    // between them. All of it was decoded before the buffer's first message
    // was delivered (the client decodes a whole read at once, and copied
    // the partial tail out when it froze the buffer); the messages' topics
    // and properties are JavaScript values by now and their Rust values
    // are dropped when `batch_to_js` returns; control packets in between
    // (acks) are consumed by this binding without reading their bytes
    // again. Messages of the same read buffer in other batches lie outside
    // the span, before or after it. So no Rust code reads the span's bytes
    // while JavaScript holds it. `len > 0`,
    // and the span starts at the first payload of this batch in its read
    // buffer, so no other live external buffer starts at the same address
    // (other batches' spans start at other payloads, a correlation-data
    // Buffer lies before its payload). `env` is the live environment of the
    // current call.
    let status = unsafe {
        sys::napi_create_external_arraybuffer(
            env.raw(),
            data,
            len,
            Some(finalize_bytes),
            hint.cast::<c_void>(),
            &mut value,
        )
    };
    if status == sys::Status::napi_no_external_buffers_allowed {
        // SAFETY: napi refused the ArrayBuffer and did not take the hint,
        // so we still own the box and take it back exactly once.
        let span = unsafe { Box::from_raw(hint) };
        return copy_arraybuffer(env, &span);
    }
    if status != sys::Status::napi_ok {
        // SAFETY: on failure napi registered no finalizer for the hint, so
        // we own it.
        drop(unsafe { Box::from_raw(hint) });
        check_status!(status)?;
    }
    // SAFETY: napi returned `napi_ok`, so `value` is a valid ArrayBuffer
    // handle in `env`'s current handle scope.
    Ok(unsafe { JsArrayBuffer::from_raw_unchecked(env.raw(), value) })
}

/// An `ArrayBuffer` holding a copy of `data` (not empty) in memory V8
/// allocates: the fallback of [`to_arraybuffer`].
pub fn copy_arraybuffer(env: &Env, data: &[u8]) -> Result<JsArrayBuffer> {
    let mut value = ptr::null_mut();
    let mut dst = ptr::null_mut();
    // SAFETY: `env` is the live environment of the current call; napi
    // writes the new ArrayBuffer and its data pointer into the
    // out-parameters.
    check_status!(unsafe {
        sys::napi_create_arraybuffer(env.raw(), data.len(), &mut dst, &mut value)
    })?;
    if !data.is_empty() && !dst.is_null() {
        // SAFETY: napi allocated `data.len()` bytes at `dst` for the new
        // ArrayBuffer, which nothing else refers to yet and which cannot
        // overlap `data` (memory we own elsewhere); the ArrayBuffer stays
        // alive in the current handle scope during the copy.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.cast::<u8>(), data.len()) };
    }
    // SAFETY: napi returned `napi_ok`, so `value` is a valid ArrayBuffer
    // handle in `env`'s current handle scope.
    Ok(unsafe { JsArrayBuffer::from_raw_unchecked(env.raw(), value) })
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
