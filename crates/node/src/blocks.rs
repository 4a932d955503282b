//! The vectorized block API: block lists given as typed arrays (Float64Array or
//! BigUint64Array, read in place: no JS object per block) become a core `Blocks`; one
//! Promise settles with a status byte per block, or a batch takes them for polling.

use ferry_core::blocks::{BlockOutcome, Blocks, PerBlock};
use ferry_core::handle::{HandleKind, Handles};
use ferry_core::{Error, ErrorCode, Numbered, Opcode};
use napi::bindgen_prelude::{
    Buffer, FromNapiValue, Object, TypedArray, TypedArrayType, Uint32Array, Unknown,
};
use napi::{Env, ValueType};
use napi_derive::napi;

use crate::buffer::OutBytes;
use crate::convert::{hint, internal, js_error, FailureJs};
use crate::js::{exact_u64, numbered, to_u64};
use crate::notify::NotifyResult;
use crate::settle::Early;
use crate::NativeEngine;

/// Blocks of one request that did not complete.
#[napi(object)]
pub struct FailedBlocks {
    /// First block.
    pub first: u32,
    /// Number of blocks (all of the request's).
    pub count: u32,
    /// Their status number.
    pub status: u32,
    /// Why.
    pub error: FailureJs,
}

/// What happened to every block of a call.
#[napi(object)]
#[derive(Default)]
pub struct BlocksOutcome {
    /// One raw status per block (4 = completed).
    #[napi(ts_type = "Uint8Array")]
    pub status: Buffer,
    /// The blocks that did not complete, by request.
    pub failed: Vec<FailedBlocks>,
    /// Requests the blocks were merged into.
    pub requests: u32,
    /// Set when every block landed but the call's notification was not delivered.
    pub notify_error: Option<NotifyResult>,
}

impl From<BlockOutcome> for BlocksOutcome {
    fn from(o: BlockOutcome) -> Self {
        Self {
            status: Buffer::from(o.status),
            failed: o
                .failed
                .into_iter()
                .map(|f| FailedBlocks {
                    first: f.blocks.start as u32,
                    count: f.blocks.len() as u32,
                    status: f.status.number(),
                    error: f.error.as_ref().map_or_else(
                        || FailureJs::new(ErrorCode::TransferFailed, f.status.name()),
                        FailureJs::from,
                    ),
                })
                .collect(),
            requests: o.requests as u32,
            notify_error: None,
        }
    }
}

/// The block list as index.ts passes it (the typed arrays are read in place). Declared
/// for TypeScript only: the binding reads these fields itself, to take typed arrays.
#[napi(object, object_to_js = false)]
#[allow(dead_code)] // never built in Rust: it gives binding.d.ts the shape `blocks` reads
pub struct NativeBlockList {
    /// Region handle, or one per block.
    #[napi(ts_type = "number | Float64Array")]
    pub local: f64,
    /// Segment handle, or one per block.
    #[napi(ts_type = "number | Float64Array")]
    pub remote: f64,
    /// Remote buffer id, or one per block [0].
    #[napi(ts_type = "number | Float64Array | BigUint64Array")]
    pub remote_buffer: Option<f64>,
    /// Offset of each block in its local region.
    #[napi(ts_type = "Float64Array | BigUint64Array")]
    pub local_offsets: f64,
    /// Offset of each block in its remote buffer.
    #[napi(ts_type = "Float64Array | BigUint64Array")]
    pub remote_offsets: f64,
    /// Length of each block, or one for all.
    #[napi(ts_type = "number | Float64Array | BigUint64Array")]
    pub lengths: f64,
    /// Transport number to try first [0: none].
    pub transport: Option<f64>,
    /// Transport number of the only transport that may serve the blocks [0: none].
    pub require_transport: Option<f64>,
    /// Check every block's bytes end to end with a CRC32C [the engine's `verify`].
    pub verify: Option<bool>,
}

/// A block list submitted to a batch.
#[napi(object)]
pub struct BlockSubmissionJs {
    /// Index of the first task.
    pub first_task: u32,
    /// Task `firstTask + r` covers blocks `starts[r]..starts[r + 1]`.
    pub starts: Uint32Array,
}

/// The values of a Float64Array (each a non-negative integer below 2^53) or of a
/// BigUint64Array.
fn u64s(value: Unknown, what: &str) -> Result<Vec<u64>, Error> {
    let not_array =
        || Error::InvalidArgument(format!("{what} must be a Float64Array or a BigUint64Array"));
    if value.get_type().map_err(|_| not_array())? != ValueType::Object {
        return Err(not_array());
    }
    // The view's bytes are read in place before the call returns, while JS cannot run.
    let array = TypedArray::from_unknown(value).map_err(|_| not_array())?;
    let words = array.arraybuffer.chunks_exact(8);
    match array.typed_array_type {
        TypedArrayType::BigUint64 => Ok(words
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()))
            .collect()),
        TypedArrayType::Float64 => words
            .enumerate()
            .map(|(i, w)| {
                let v = f64::from_ne_bytes(w.try_into().unwrap_or_default());
                // The message (and its allocation) only for a bad value: this runs per block.
                exact_u64(v).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "{what}[{i}] must be a non-negative integer below 2^53, got {v}"
                    ))
                })
            })
            .collect(),
        _ => Err(not_array()),
    }
}

/// A field that is a number (one for all blocks) or a typed array (one per block).
fn per_block(value: Unknown, what: &str) -> Result<PerBlock<u64>, Error> {
    if matches!(value.get_type(), Ok(ValueType::Number)) {
        let v = f64::from_unknown(value)
            .map_err(|e| Error::InvalidArgument(format!("{what}: {}", e.reason)))?;
        return Ok(PerBlock::One(to_u64(v, what)?));
    }
    u64s(value, what).map(PerBlock::Each)
}

/// Handles (one or per block) decoded as this engine's ids of `kind`.
fn ids(
    value: Unknown,
    what: &str,
    kind: HandleKind,
    handles: &Handles,
) -> Result<PerBlock<u64>, Error> {
    Ok(match per_block(value, what)? {
        PerBlock::One(h) => PerBlock::One(handles.decode(kind, h)?),
        PerBlock::Each(hs) => PerBlock::Each(
            hs.into_iter()
                .map(|h| handles.decode(kind, h))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// A field of the block-list object (`undefined` reads as absent).
fn field<'a>(list: &Object<'a>, name: &str) -> Result<Option<Unknown<'a>>, Error> {
    let value = list
        .get::<Unknown>(name)
        .map_err(|e| Error::InvalidArgument(format!("{name}: {}", e.reason)))?;
    Ok(value.filter(|v| !matches!(v.get_type(), Ok(ValueType::Undefined))))
}

/// A field that must be present.
fn required<'a>(list: &Object<'a>, name: &str) -> Result<Unknown<'a>, Error> {
    field(list, name)?.ok_or_else(|| Error::InvalidArgument(format!("{name} is required")))
}

/// An optional transport number field (absent: 0, none).
fn transport_field(list: &Object, name: &str) -> Result<f64, Error> {
    field(list, name)?.map_or(Ok(0.0), |v| {
        f64::from_unknown(v)
            .map_err(|_| Error::InvalidArgument(format!("{name} must be a transport number")))
    })
}

/// The block list of a call (`NativeBlockList`), every field converted and checked for type.
fn blocks(handles: &Handles, opcode: f64, list: &Object) -> Result<Blocks, Error> {
    let hint = hint(
        transport_field(list, "transport")?,
        transport_field(list, "requireTransport")?,
    )?;
    let remote_buffer = match field(list, "remoteBuffer")? {
        Some(v) => per_block(v, "remoteBuffer")?,
        None => PerBlock::One(0),
    };
    Ok(Blocks {
        opcode: numbered::<Opcode>(opcode, "opcode")?,
        local: ids(
            required(list, "local")?,
            "local",
            HandleKind::Region,
            handles,
        )?,
        segment: ids(
            required(list, "remote")?,
            "remote",
            HandleKind::Segment,
            handles,
        )?,
        remote_buffer,
        local_offsets: u64s(required(list, "localOffsets")?, "localOffsets")?,
        remote_offsets: u64s(required(list, "remoteOffsets")?, "remoteOffsets")?,
        lengths: per_block(required(list, "lengths")?, "lengths")?,
        hint,
        verify: match field(list, "verify")? {
            Some(v) => bool::from_unknown(v)
                .map_err(|_| Error::InvalidArgument("verify must be a boolean".into()))?,
            None => false,
        },
    })
}

/// The caller's status array, written in place; refused when it shares memory with
/// `starts`, which is read meanwhile.
fn status_bytes<'a>(out: &'a mut OutBytes, starts: &[u32]) -> napi::Result<&'a mut [u8], String> {
    out.bytes_beside(starts).ok_or_else(|| {
        js_error(Error::InvalidArgument(
            "out must not share memory with starts".into(),
        ))
    })
}

/// A batch id and a task index from JS.
fn batch_and_task(batch: f64, task: f64) -> napi::Result<(u64, usize), String> {
    let batch = to_u64(batch, "batch").map_err(js_error)?;
    let task = to_u64(task, "firstTask").map_err(js_error)?;
    Ok((batch, usize::try_from(task).unwrap_or(usize::MAX)))
}

#[napi]
impl NativeEngine {
    /// Starts a block-list transfer; returns `{ op, requests, promise }` where the promise
    /// resolves with every block's outcome (one wake of the JS thread for all of them), or
    /// is that outcome itself when every block ended before the call returned (same-host
    /// copies done inline).
    /// With `notify`, the blocks' segment is notified once every block completed.
    #[napi(
        catch_unwind,
        ts_args_type = "opcode: number, list: NativeBlockList, notify?: Buffer | undefined | null",
        ts_return_type = "{ op: number, requests: number, promise: Promise<BlocksOutcome> | BlocksOutcome }"
    )]
    pub fn transfer_blocks<'env>(
        &self,
        env: &'env Env,
        opcode: f64,
        list: Object,
        notify: Option<Buffer>,
    ) -> napi::Result<Object<'env>, String> {
        let engine = self.core();
        let list = blocks(&engine.handles(), opcode, &list).map_err(js_error)?;
        let (early, settle) = Early::<BlocksOutcome>::new();
        let (op, requests) = match notify {
            None => engine.transfer_blocks(&list, move |outcome| {
                settle.resolve(BlocksOutcome::from(outcome))
            }),
            Some(data) => {
                engine.transfer_blocks_notify(&list, data.to_vec(), move |outcome, err| {
                    settle.resolve(BlocksOutcome {
                        notify_error: err.as_ref().map(NotifyResult::error),
                        ..BlocksOutcome::from(outcome)
                    })
                })
            }
        }
        .map_err(js_error)?;
        let mut out = Object::new(env).map_err(internal)?;
        out.set("op", op as f64).map_err(internal)?;
        out.set("requests", requests as f64).map_err(internal)?;
        out.set("promise", early.hand(env).map_err(internal)?)
            .map_err(internal)?;
        Ok(out)
    }

    /// Submits a block list as tasks of a batch.
    #[napi(
        catch_unwind,
        ts_args_type = "batch: number, opcode: number, list: NativeBlockList, notify?: Buffer | undefined | null"
    )]
    pub fn submit_blocks(
        &self,
        batch: f64,
        opcode: f64,
        list: Object,
        notify: Option<Buffer>,
    ) -> napi::Result<BlockSubmissionJs, String> {
        let engine = self.core();
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        let list = blocks(&engine.handles(), opcode, &list).map_err(js_error)?;
        let sub = match notify {
            None => engine.submit_blocks(batch, &list),
            Some(data) => engine.submit_blocks_notify(batch, &list, data.to_vec()),
        }
        .map_err(js_error)?;
        Ok(BlockSubmissionJs {
            first_task: sub.first_task as u32,
            starts: Uint32Array::new(sub.map.starts),
        })
    }

    /// Writes the raw status of tasks `firstTask..` into `out`; returns how many.
    #[napi(catch_unwind)]
    pub fn get_transfer_status_into(
        &self,
        batch: f64,
        first_task: f64,
        #[napi(ts_arg_type = "Uint8Array")] mut out: OutBytes,
    ) -> napi::Result<u32, String> {
        let (batch, first) = batch_and_task(batch, first_task)?;
        let n = self
            .core()
            .transfer_status_into(batch, first, status_bytes(&mut out, &[])?);
        n.map(|n| n as u32).map_err(js_error)
    }

    /// Writes each block's status of a `submitBlocks` list into `out`; returns the blocks
    /// not yet terminal.
    #[napi(catch_unwind)]
    pub fn get_block_status_into(
        &self,
        batch: f64,
        first_task: f64,
        starts: &[u32],
        #[napi(ts_arg_type = "Uint8Array")] mut out: OutBytes,
    ) -> napi::Result<u32, String> {
        let (batch, first) = batch_and_task(batch, first_task)?;
        let out = status_bytes(&mut out, starts)?;
        let open = self.core().block_status_into(batch, first, starts, out);
        open.map(|n| n as u32).map_err(js_error)
    }
}
