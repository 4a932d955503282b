//! Node.js binding of Ferry. Thin: converts JS values, calls the core, converts back.
//! Misuse throws a JS error with a stable `code`; transfer outcomes are values that the
//! TypeScript layer turns into resolutions or rejections.

#![deny(clippy::all)]

mod abort;
mod bench;
mod blocks;
mod buffer;
mod callback;
mod convert;
mod ffi;
mod js;
mod logging;
mod notify;
mod one;
mod settle;
mod uv_loop;

#[cfg(test)]
mod tables;

// The exported free functions of the submodules (napi registers them; the re-export keeps
// them reachable in builds without that registration, such as `cargo test`).
pub use bench::{bench_mooncake_header, bench_mooncake_line};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use ferry_core::handle::HandleKind;
use ferry_core::{Access, Engine, EngineConfig, ErrorCode, Numbered};
use napi::bindgen_prelude::{AsyncTask, Either, Function, Object, Unknown};
use napi::{Env, Task};
use napi_derive::napi;

use crate::buffer::{register_shared, RegionBuffer};
use crate::convert::{
    internal, js_error, requests, BatchStatusJs, EngineEventJs, EngineMetrics, EngineOptions,
    EngineSpreadJs, FailureJs, OpenResult, RegionInfo, SegmentDesc, TaskStatusJs, TransferRequest,
};
use crate::js::to_u64;
use crate::settle::{Early, Settle};

/// The native engine. Use the `Engine` class of the package, which wraps this one.
#[napi]
pub struct NativeEngine {
    engine: Engine,
    /// Whether this engine holds its thread's event loop (`set_held`).
    held: AtomicBool,
    /// Its calls that an AbortSignal may end (`abort_call`).
    aborts: std::sync::Arc<abort::Aborts>,
}

impl NativeEngine {
    /// The core engine (for the benchmark workers).
    pub(crate) fn core(&self) -> &Engine {
        &self.engine
    }

    /// Wraps a started engine and closes it if the Node environment goes away first.
    fn adopt(env: &Env, engine: Engine) -> napi::Result<Self, String> {
        let weak = engine.downgrade();
        let hooked = env.add_env_cleanup_hook(weak, |w| {
            if let Some(e) = w.upgrade() {
                e.close();
            }
        });
        if let Err(e) = hooked {
            engine.close();
            return Err(internal(e));
        }
        Ok(Self {
            engine,
            held: AtomicBool::new(false),
            aborts: std::sync::Arc::default(),
        })
    }
}

/// Starting an engine off the JS thread: binding, starting threads, and registering in
/// etcd (which may wait for the connect timeout) must not block the event loop.
pub struct StartEngine {
    config: Option<EngineConfig>,
}

impl Task for StartEngine {
    type Output = Result<Engine, ferry_core::Error>;
    /// The engine, or why it did not start: a task's rejection carries no error code, so a
    /// refusal resolves to a `FailureJs` that the TS layer makes the `FerryError`.
    type JsValue = Either<NativeEngine, FailureJs>;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let config = self
            .config
            .take()
            .ok_or_else(|| napi::Error::from_reason("engine already started"))?;
        // A panic here must not cross into Node: it becomes an error.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Engine::new(config)))
            .map_err(|_| napi::Error::from_reason("engine start panicked"))
    }

    fn resolve(&mut self, env: Env, started: Self::Output) -> napi::Result<Self::JsValue> {
        Ok(match started {
            Ok(engine) => match NativeEngine::adopt(&env, engine) {
                Ok(native) => Either::A(native),
                Err(e) => Either::B(FailureJs::new(ErrorCode::Internal, e.reason)),
            },
            Err(e) => Either::B(FailureJs::from(&e)),
        })
    }
}

/// Starts an engine on a worker thread; resolves to the native engine.
#[napi(
    catch_unwind,
    ts_args_type = "options?: EngineOptions",
    ts_return_type = "Promise<NativeEngine | FailureJs>"
)]
pub fn start_engine(
    env: Env,
    options: Option<Unknown>,
) -> napi::Result<AsyncTask<StartEngine>, String> {
    logging::init();
    let options: EngineOptions = js::options(&env, options, "options").map_err(js_error)?;
    let config = EngineConfig::try_from(options).map_err(js_error)?;
    Ok(AsyncTask::new(StartEngine {
        config: Some(config),
    }))
}

#[napi]
impl NativeEngine {
    /// This engine's segment name (`host:port`).
    #[napi(getter)]
    pub fn segment_name(&self) -> String {
        self.engine.segment_name().to_string()
    }

    /// The warning this engine started with when it serves beyond loopback without a
    /// secret (`allowUnauthenticated`), else null.
    #[napi(getter)]
    pub fn exposure_warning(&self) -> Option<String> {
        self.engine.exposure_warning()
    }

    /// The id of region `handle` in this engine, checked to be this engine's.
    fn region_id(&self, handle: f64) -> Result<u64, ferry_core::Error> {
        let handle = to_u64(handle, "region")?;
        self.engine.handles().decode(HandleKind::Region, handle)
    }

    /// The id of segment `handle` in this engine, checked to be this engine's.
    fn segment_handle(&self, handle: f64) -> Result<u64, ferry_core::Error> {
        let handle = to_u64(handle, "segment")?;
        self.engine.handles().decode(HandleKind::Segment, handle)
    }

    /// The JS description of a region.
    fn region_info(&self, region: &ferry_core::Region) -> RegionInfo {
        RegionInfo {
            handle: self
                .engine
                .handles()
                .encode(HandleKind::Region, region.id()) as f64,
            id: region.id() as f64,
            length: region.len() as f64,
        }
    }

    /// Allocates an engine-owned region of `bytes` (any size the machine can back: a
    /// memfd, touched lazily).
    #[napi(catch_unwind)]
    pub fn allocate(&self, bytes: f64) -> napi::Result<RegionInfo, String> {
        let len = to_u64(bytes, "bytes").map_err(js_error)?;
        let region = self.engine.allocate(len).map_err(js_error)?;
        Ok(self.region_info(&region))
    }

    /// A Buffer over `[offset, offset + length)` of an engine-owned region (at most
    /// one Buffer's limit, Node's `buffer.constants.MAX_LENGTH`: 4 GiB on Node 20).
    #[napi(catch_unwind, ts_return_type = "Buffer")]
    pub fn region_view(
        &self,
        env: Env,
        handle: f64,
        offset: f64,
        length: f64,
    ) -> napi::Result<RegionBuffer, String> {
        let id = self.region_id(handle).map_err(js_error)?;
        let offset = to_u64(offset, "offset").map_err(js_error)?;
        let length = to_u64(length, "length").map_err(js_error)?;
        let region = self.engine.region(id).map_err(js_error)?;
        if region.mapping().is_none() {
            return Err(js_error(ferry_core::Error::InvalidArgument(format!(
                "region {id} is registered user memory; view that memory instead"
            ))));
        }
        RegionBuffer::new(&env, region, offset, length).map_err(js_error)
    }

    /// Registers user memory (a view over a SharedArrayBuffer); the engine holds it
    /// until `release`.
    #[napi(
        catch_unwind,
        ts_args_type = "memory: ArrayBufferView, readOnly?: boolean | undefined | null"
    )]
    pub fn register_memory(
        &self,
        memory: Unknown,
        read_only: Option<bool>,
    ) -> napi::Result<RegionInfo, String> {
        let access = if read_only.unwrap_or(false) {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        };
        let region = register_shared(&self.engine, memory, access).map_err(js_error)?;
        Ok(self.region_info(&region))
    }

    /// Releases a region.
    #[napi(catch_unwind)]
    pub fn release(&self, handle: f64) -> napi::Result<(), String> {
        let id = self.region_id(handle).map_err(js_error)?;
        self.engine.release(id).map_err(js_error)
    }

    /// Opens a remote segment; resolves with an `OpenResult`. With `abort`, the call's id
    /// for `abort_call`, which ends it (an empty `OpenResult`).
    #[napi(catch_unwind, ts_return_type = "Promise<OpenResult>")]
    pub fn open_segment<'env>(
        &self,
        env: &'env Env,
        name: String,
        abort: Option<f64>,
    ) -> napi::Result<Object<'env>, String> {
        let armed = match abort {
            Some(id) => Some(self.aborts.arm(to_u64(id, "abort").map_err(js_error)?)),
            None => None,
        };
        let (settle, promise) = Settle::<OpenResult>::new(env).map_err(internal)?;
        let engine = self.engine.clone();
        let handles = self.engine.handles();
        let spawned = self.engine.spawn(async move {
            let open = engine.open_segment(&name);
            let opened = match armed {
                Some(armed) => armed.run(open).await,
                None => Some(open.await),
            };
            let result = match opened {
                Some(Ok(info)) => OpenResult {
                    segment: Some(SegmentDesc::new(info, &handles)),
                    error: None,
                },
                Some(Err(e)) => OpenResult {
                    segment: None,
                    error: Some(FailureJs::from(&e)),
                },
                None => OpenResult::default(),
            };
            settle.resolve(result);
        });
        spawned.map_err(js_error)?;
        Ok(promise)
    }

    /// Closes a segment.
    #[napi(catch_unwind)]
    pub fn close_segment(&self, handle: f64) -> napi::Result<(), String> {
        let handle = self.segment_handle(handle).map_err(js_error)?;
        self.engine.close_segment(handle).map_err(js_error)
    }

    /// An open segment as this engine knows it now (the peer's incarnation and buffers).
    #[napi(catch_unwind)]
    pub fn segment_info(&self, handle: f64) -> napi::Result<SegmentDesc, String> {
        let handle = self.segment_handle(handle).map_err(js_error)?;
        let info = self.engine.segment_info(handle).map_err(js_error)?;
        Ok(SegmentDesc::new(info, &self.engine.handles()))
    }

    /// Fetches an open segment's descriptor from the peer now; resolves with an
    /// `OpenResult`.
    #[napi(catch_unwind, ts_return_type = "Promise<OpenResult>")]
    pub fn refresh_segment<'env>(
        &self,
        env: &'env Env,
        handle: f64,
    ) -> napi::Result<Object<'env>, String> {
        let handle = self.segment_handle(handle).map_err(js_error)?;
        let (settle, promise) = Settle::<OpenResult>::new(env).map_err(internal)?;
        let engine = self.engine.clone();
        let handles = self.engine.handles();
        let spawned = self.engine.spawn(async move {
            settle.resolve(match engine.refresh_segment(handle).await {
                Ok(info) => OpenResult {
                    segment: Some(SegmentDesc::new(info, &handles)),
                    error: None,
                },
                Err(e) => OpenResult {
                    segment: None,
                    error: Some(FailureJs::from(&e)),
                },
            });
        });
        spawned.map_err(js_error)?;
        Ok(promise)
    }

    /// Allocates a batch; returns its id.
    #[napi(catch_unwind)]
    pub fn allocate_batch(&self, capacity: f64) -> napi::Result<f64, String> {
        let capacity = to_u64(capacity, "capacity").map_err(js_error)?;
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        let id = self.engine.allocate_batch(capacity).map_err(js_error)?;
        Ok(id as f64)
    }

    /// Submits requests as tasks of a batch; returns the index of the first task.
    #[napi(catch_unwind)]
    pub fn submit_transfer(
        &self,
        batch: f64,
        requests_js: Vec<TransferRequest>,
    ) -> napi::Result<u32, String> {
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        let reqs = requests(&requests_js, &self.engine.handles()).map_err(js_error)?;
        let first = self
            .engine
            .submit_transfer(batch, &reqs)
            .map_err(js_error)?;
        Ok(first as u32)
    }

    /// Status of one task.
    #[napi(catch_unwind)]
    pub fn get_transfer_status(&self, batch: f64, task: f64) -> napi::Result<TaskStatusJs, String> {
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        let task = to_u64(task, "task").map_err(js_error)?;
        let task = usize::try_from(task).unwrap_or(usize::MAX);
        self.engine
            .transfer_status(batch, task)
            .map(TaskStatusJs::from)
            .map_err(js_error)
    }

    /// Status of every task of a batch.
    #[napi(catch_unwind)]
    pub fn get_transfer_status_list(&self, batch: f64) -> napi::Result<Vec<TaskStatusJs>, String> {
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        self.engine
            .transfer_status_list(batch)
            .map(|v| v.into_iter().map(TaskStatusJs::from).collect())
            .map_err(js_error)
    }

    /// Aggregate status of a batch.
    #[napi(catch_unwind)]
    pub fn get_batch_status(&self, batch: f64) -> napi::Result<BatchStatusJs, String> {
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        let s = self.engine.batch_status(batch).map_err(js_error)?;
        Ok(BatchStatusJs {
            status: s.status.number(),
            transferred_bytes: s.transferred as f64,
            tasks: s.tasks as u32,
        })
    }

    /// Frees a batch (pending tasks are canceled).
    #[napi(catch_unwind)]
    pub fn free_batch(&self, batch: f64) -> napi::Result<(), String> {
        let batch = to_u64(batch, "batch").map_err(js_error)?;
        self.engine.free_batch(batch).map_err(js_error)
    }

    /// Starts a transfer; returns `{ op, promise }` where the promise resolves with every
    /// task's final status, or is those statuses when every task ended before the call
    /// returned (same-host copies done inline: no Promise, no wake of the event loop).
    #[napi(
        catch_unwind,
        ts_return_type = "{ op: number, promise: Promise<Array<TaskStatusJs>> | Array<TaskStatusJs> }"
    )]
    pub fn transfer<'env>(
        &self,
        env: &'env Env,
        requests_js: Vec<TransferRequest>,
    ) -> napi::Result<Object<'env>, String> {
        let reqs = requests(&requests_js, &self.engine.handles()).map_err(js_error)?;
        // Replies to small requests can then wake this thread directly (tcp).
        uv_loop::ensure_installed(env);
        let (early, settle) = Early::<Vec<TaskStatusJs>>::new();
        let op = self
            .engine
            .transfer(&reqs, move |snaps| {
                let statuses: Vec<TaskStatusJs> =
                    snaps.into_iter().map(TaskStatusJs::from).collect();
                settle.resolve(statuses);
            })
            .map_err(js_error)?;
        let mut out = Object::new(env).map_err(internal)?;
        out.set("op", op as f64).map_err(internal)?;
        out.set("promise", early.hand(env).map_err(internal)?)
            .map_err(internal)?;
        Ok(out)
    }

    /// One request, every field a number (`engine.read`/`write` without a signal or a
    /// notification): opcode and transports by their tables' numbers (lib/tables.ts),
    /// transport and requireTransport 0 for none. Returns the outcome — `transport + 256 *
    /// attempts` when it completed, its status otherwise — or, when it did not end before
    /// the call returned, a Promise of it.
    #[napi(
        catch_unwind,
        ts_return_type = "number | TaskStatusJs | Promise<number | TaskStatusJs>"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_one<'env>(
        &self,
        env: &'env Env,
        opcode: f64,
        local: f64,
        local_offset: f64,
        segment: f64,
        remote_buffer: f64,
        remote_offset: f64,
        length: f64,
        transport: f64,
        require_transport: f64,
    ) -> napi::Result<settle::Handed<'env, one::OneOutcome>, String> {
        let one = one::request(
            opcode,
            local,
            local_offset,
            segment,
            remote_buffer,
            remote_offset,
            length,
            transport,
            require_transport,
        );
        let reqs =
            requests(std::slice::from_ref(&one), &self.engine.handles()).map_err(js_error)?;
        uv_loop::ensure_installed(env);
        let (early, settle) = Early::<one::OneOutcome>::new();
        self.engine
            .transfer(&reqs, move |snaps| {
                settle.resolve(snaps.into_iter().next().map(Into::into).unwrap_or_default());
            })
            .map_err(js_error)?;
        early.hand(env).map_err(internal)
    }

    /// Cancels a pending transfer; returns whether it was pending.
    #[napi(catch_unwind)]
    pub fn cancel(&self, op: f64) -> napi::Result<bool, String> {
        let op = to_u64(op, "op").map_err(js_error)?;
        Ok(self.engine.cancel(op))
    }

    /// Ends call `id` (see `open_segment`) now; false when it had ended already.
    #[napi(catch_unwind)]
    pub fn abort_call(&self, id: f64) -> napi::Result<bool, String> {
        let id = to_u64(id, "id").map_err(js_error)?;
        Ok(self.aborts.abort(id))
    }

    /// Sets the function that receives engine events. It does not keep Node alive.
    #[napi(catch_unwind)]
    pub fn set_event_handler(
        &self,
        callback: Function<EngineEventJs, ()>,
    ) -> napi::Result<(), String> {
        let call = callback::weak_handler(callback)?;
        self.engine
            .set_event_sink(Some(std::sync::Arc::new(move |event| {
                call(EngineEventJs::from(event))
            })));
        Ok(())
    }

    /// Engine counters.
    #[napi(catch_unwind)]
    pub fn metrics(&self) -> EngineMetrics {
        EngineMetrics::from(self.engine.metrics())
    }

    /// What this engine spreads its work over: I/O threads, tcp lanes, shm copy threads.
    #[napi(catch_unwind)]
    pub fn spread(&self) -> EngineSpreadJs {
        EngineSpreadJs::from(self.engine.spread())
    }

    /// Engine counters in the Prometheus text exposition format, with this process's Node
    /// version in `ferry_build_info`.
    #[napi(catch_unwind)]
    pub fn metrics_text(&self, env: Env) -> String {
        static NODE: OnceLock<Option<String>> = OnceLock::new();
        let node = NODE.get_or_init(|| {
            let v = env.get_node_version().ok()?;
            Some(format!("{}.{}.{}", v.major, v.minor, v.patch))
        });
        let mut m = self.engine.metrics();
        m.build.node = node.clone();
        m.to_prometheus()
    }

    /// Closes the engine: pending work is canceled, threads stop, memory is released, and
    /// the engine no longer holds the event loop.
    #[napi(catch_unwind)]
    pub fn close(&self, env: &Env) -> napi::Result<(), String> {
        self.engine.close();
        self.set_held(env, false)
    }

    /// Whether this engine keeps Node alive (`Engine.ref`/`unref`, as a listening
    /// `net.Server`): one hold on the thread's port (`settle::hold`), taken or given back
    /// only when this changes; never held once closed.
    #[napi(catch_unwind)]
    pub fn set_held(&self, env: &Env, held: bool) -> napi::Result<(), String> {
        let held = held && !self.engine.is_closed();
        if self.held.swap(held, Ordering::Relaxed) == held {
            return Ok(());
        }
        settle::hold(env, held).map_err(|e| {
            self.held.store(!held, Ordering::Relaxed);
            internal(e)
        })
    }

    /// Whether the engine is closed.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.engine.is_closed()
    }
}
