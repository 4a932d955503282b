/** The engine: memory, segments, transfers, block lists, notifications, and its events. */
import { EventEmitter } from 'node:events'
import type * as Native from './native'
import './dispose'
import { untilAborted } from './abort'
import { startBench, type Bench } from './bench'
import { blockOpcode, blocksOutcome, toNativeBlocks, toSubmission, type BatchBlockList, type BlocksRequest, type BlocksResult, type BlockSubmission } from './blocks'
import { checkBytes, checkNumber, checkOptions, checkSignal, describe, invalid } from './checks'
import { abortError, call, failureError, FerryError } from './errors'
import { EventRelay, type Emit, type EngineEvents, type Notification } from './events'
import { toMetrics, toSpread, type EngineMetrics, type EngineSpread } from './metrics'
import { native } from './native'
import { notifyBytes, NotificationRelay, type NotifyData, type NotifyOptions } from './notifications'
import { notifyQueueSize, toNativeOptions, type CreateOptions } from './options'
import { MAX_VIEW_BYTES, Region, registerOptions } from './region'
import { toNativeRequest, toNativeRequests, transferOutcome, type CallOptions, type IoRequest, type TransferRequest, type TransferResult } from './requests'
import { Segment, toSegment } from './segment'
import { settled } from './settle'
import { completedTask, toBatchStatus, toTaskStatus, type BatchStatus, type TaskStatus } from './status'
import { OPCODE_NUMBERS, type OpcodeName } from './tables'
import { blocksContext, ioContext, traced, transferContext } from './tracing'

/** Typed `on`/`once`/`off`/`emit` for the engine's events (see `EngineEvents`). */
export interface Engine {
  /** Adds `listener` for `event`, typed by `EngineEvents`. */
  on<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  /** Adds `listener` for the next `event` only. */
  once<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  /** Removes `listener` from `event`. */
  off<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  /** The same as `on`. */
  addListener<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  /** The same as `off`. */
  removeListener<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  /** Calls the listeners of `event` with `payload`; the engine emits its own events, so this is for tests. */
  emit<K extends keyof EngineEvents>(event: K, payload: EngineEvents[K]): boolean
}

/**
 * The engines that hold the event loop, kept reachable as a listening server is by its
 * handle: one that holds the loop is never collected unclosed.
 */
const holding = new Set<object>()

/**
 * A Ferry engine: owns memory, opens peers' segments, moves bytes. An EventEmitter of
 * `peerLost`, `peerRecovered`, `failover` and `transportDisabled` (typed by `EngineEvents`).
 * `transportDisabled` events that arrive while nobody listens to them (those of a transport
 * that failed to install at start, typically) are kept and delivered to the first listener.
 *
 * Like a listening `net.Server`, an open engine keeps the process alive (it serves its
 * memory to peers, and a `notifications()` loop waits on it) until `close()`, or `unref()`.
 * Every engine listens, so one that only initiates holds the process too, as a connected
 * `net.Socket` does: whether a process ends never depends on whether a peer opened it.
 */
export class Engine extends EventEmitter {
  readonly #native: Native.NativeEngine
  #closing?: Promise<void>
  readonly #events: EventRelay
  readonly #notifications: NotificationRelay
  /** The last id given to a call that a signal may abort (`openSegment`). */
  #abortable = 0

  private constructor(n: Native.NativeEngine, queueSize: number) {
    super()
    this.#native = n
    // The EventEmitter's own emit, as the relays emit on this engine.
    const emit: Emit = (name, payload) => super.emit(name, payload)
    this.#notifications = new NotificationRelay(n, queueSize, this, emit)
    this.#events = new EventRelay(this, emit)
    super.on('newListener', (name: string | symbol) => this.#notifications.listenerAdded(name))
    n.setNotificationHandler((s: Native.NotifySignalJs) => this.#notifications.signal(s))
    super.on('newListener', (name: string | symbol) => this.#events.listenerAdded(name))
    n.setEventHandler((raw: Native.EngineEventJs) => this.#events.deliver(raw))
    this.ref()
  }

  /**
   * Starts an engine. Binding, starting threads and registering in etcd happen off the JS
   * thread, so a slow or unreachable etcd never blocks the event loop. `signal` aborts the
   * start: a signal that already fired rejects with an `AbortError` before anything starts;
   * one that fires while the engine starts rejects at once, and the engine, should it start
   * all the same, is closed.
   */
  static async create(options: CreateOptions = {}): Promise<Engine> {
    if (typeof options !== 'object' || options === null || Array.isArray(options)) {
      throw invalid(`options must be an object, got ${describe(options)}`)
    }
    const { signal: signalArg, ...engineOptions } = options
    const signal = checkSignal(signalArg)
    if (signal?.aborted) throw abortError(signal.reason)
    const nativeOptions = toNativeOptions(engineOptions)
    // The start task resolves to the engine, or to why it did not start (a task's
    // rejection cannot carry a code).
    const starting = call(() => native.startEngine(nativeOptions))
    const started = await untilAborted(starting, signal, {
      late: (engine) => {
        if (engine instanceof native.NativeEngine) engine.close()
      },
    })
    if (!(started instanceof native.NativeEngine)) throw failureError(started, ['ERR_FERRY_INTERNAL', 'the engine did not start'])
    const engine = new Engine(started, notifyQueueSize(engineOptions))
    const warning = engine.#native.exposureWarning
    if (warning) process.emitWarning(warning, { code: 'FERRY_UNAUTHENTICATED' })
    return engine
  }

  /** @internal */
  native<T>(fn: (n: Native.NativeEngine) => T): T {
    return call(() => fn(this.#native))
  }

  /** This engine's segment name, which peers open: `host:port`, or its name in etcd. */
  get segmentName(): string {
    return this.#native.segmentName
  }

  /** Whether the engine is closed. */
  get closed(): boolean {
    return this.#native.closed
  }

  /**
   * Lets this engine keep the process alive again (the default), as `net.Server.ref()`:
   * while it is open, Node does not exit. Harmless after `close()`, which lets go for good.
   */
  ref(): this {
    this.#hold(true)
    return this
  }

  /**
   * Lets the process exit while this engine is open, as `net.Server.unref()`: it still
   * serves and delivers notifications while something else keeps the process alive. A
   * call in flight (`read`, `openSegment`, …) holds the process until it settles, whatever
   * this says, as Node's own Promise APIs do.
   */
  unref(): this {
    this.#hold(false)
    return this
  }

  #hold(held: boolean): void {
    if (this.closed) return
    this.native((n) => n.setHeld(held))
    if (held) holding.add(this)
    else holding.delete(this)
  }

  /**
   * Allocates `bytes` of engine-owned, page-aligned, zeroed memory: any size the machine
   * can back (a memfd, touched lazily). See `Region.view` for regions over
   * `MAX_VIEW_BYTES` (Node's `buffer.constants.MAX_LENGTH`: 4 GiB on Node 20).
   */
  allocate(bytes: number): Region {
    const r = this.native((n) => n.allocate(bytes))
    const region = new Region(this, r.handle, r.id, r.length)
    // The whole-region Buffer is made now, where one can hold it, so it stays readable
    // after release() and close() (the memory lives while the Buffer does).
    if (r.length <= MAX_VIEW_BYTES) void region.buffer
    return region
  }

  /**
   * Registers user memory (held until released): a TypedArray, DataView or Buffer over a
   * `SharedArrayBuffer` (a shared `WebAssembly.Memory`'s buffer included). Memory over a
   * plain ArrayBuffer is refused: JS can detach it (`structuredClone(ab, { transfer })`),
   * after which the engine would write memory it no longer owns. Use `allocate(n)`, or
   * `Buffer.from(new SharedArrayBuffer(n))`.
   */
  registerMemory(memory: ArrayBufferView, options: { readOnly?: boolean } = {}): Region {
    const readOnly = registerOptions(memory, options)
    const r = this.native((n) => n.registerMemory(memory, readOnly))
    const bytes = Buffer.isBuffer(memory) ? memory : Buffer.from(memory.buffer, memory.byteOffset, memory.byteLength)
    return new Region(this, r.handle, r.id, r.length, bytes)
  }

  /**
   * Opens (or refreshes) a peer's segment by name (`host:port`, or its name in etcd).
   * `signal` aborts the call: fired already, it rejects with an `AbortError` before any
   * connection is made; fired later, it rejects at once and the attempt stops (a segment
   * it had opened by then stays open, and the next `openSegment(name)` finds it).
   */
  async openSegment(name: string, options: CallOptions = {}): Promise<Segment> {
    if (typeof name !== 'string') throw invalid(`segment name must be a string, got ${describe(name)}`)
    const signal = checkSignal(checkOptions('openSegment', options, ['signal']).signal)
    if (signal?.aborted) throw abortError(signal.reason)
    const id = signal ? ++this.#abortable : undefined
    const opening = this.native((n) => n.openSegment(name, id))
    const r = await untilAborted(opening, signal, { stop: () => void this.#native.abortCall(id ?? 0) })
    if (!r.segment) throw failureError(r.error, ['ERR_FERRY_CONNECT', 'openSegment failed'])
    return toSegment(this, r.segment)
  }

  /** Closes a segment; its in-flight work fails. */
  closeSegment(segment: Segment): void {
    if (!(segment instanceof Segment)) throw invalid(`closeSegment takes a Segment, got ${describe(segment)}`)
    if (segment.engine !== this) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', 'closeSegment: a Segment of another engine')
    this.native((n) => n.closeSegment(segment.handle))
  }

  /** Allocates a batch for up to `capacity` tasks (TENT's batch API). */
  allocateBatch(capacity: number): number {
    return this.native((n) => n.allocateBatch(capacity))
  }

  /**
   * Validates and submits requests as tasks of `batch`; returns the first task's index. With
   * `notify`, the requests' segment (they must share one) is notified once every task of this
   * submission completed.
   */
  submitTransfer(batch: number, requests: TransferRequest[], options: NotifyOptions = {}): number {
    checkNumber('batch', batch, false)
    const o = checkOptions('submitTransfer', options, ['notify'])
    const list = call(() => toNativeRequests(this, requests))
    if (o.notify === undefined) return this.native((n) => n.submitTransfer(batch, list))
    const data = notifyBytes('submitTransfer: notify', o.notify)
    return this.native((n) => n.submitTransferNotify(batch, list, data))
  }

  /** Status of one task. */
  getTransferStatus(batch: number, task: number): TaskStatus {
    checkNumber('batch', batch, false)
    checkNumber('task', task, false)
    const raw = this.native((n) => n.getTransferStatus(batch, task))
    this.#events.explainLosses([raw.error])
    return toTaskStatus(raw)
  }

  /** Status of every task of a batch. */
  getTransferStatusList(batch: number): TaskStatus[] {
    const raw = this.native((n) => n.getTransferStatusList(batch))
    this.#events.explainLosses(raw.map((t) => t.error))
    return raw.map(toTaskStatus)
  }

  /** Aggregate status of a batch. */
  getBatchStatus(batch: number): BatchStatus {
    return toBatchStatus(this.native((n) => n.getBatchStatus(batch)))
  }

  /**
   * Frees a batch; tasks still pending are canceled, and it returns once nothing of them
   * can land any more (it blocks for that wait: over tcp about a round trip; bounded by
   * the attempt deadline).
   */
  freeBatch(batch: number): void {
    this.native((n) => n.freeBatch(batch))
  }

  /**
   * Reads many blocks (see `BlockList`) in one call: one Promise for all of them, settled
   * with one status byte per block. Blocks that fail are reported in `failed`, not by a
   * rejection; bad input rejects with nothing moved, and an abort rejects with an
   * `AbortError`.
   */
  async readBlocks(blocks: BlocksRequest): Promise<BlocksResult> {
    return traced(() => blocksContext(this.segmentName, 'readBlocks', blocks), () => this.blocks('read', blocks))
  }

  /** Writes many blocks (see `readBlocks`). */
  async writeBlocks(blocks: BlocksRequest): Promise<BlocksResult> {
    return traced(() => blocksContext(this.segmentName, 'writeBlocks', blocks), () => this.blocks('write', blocks))
  }

  private async blocks(opcode: OpcodeName, blocks: BlocksRequest): Promise<BlocksResult> {
    const list = call(() => toNativeBlocks(this, blocks, 'promise'))
    const signal = checkSignal(blocks.signal)
    if (signal?.aborted) throw abortError(signal.reason)
    const notify = blocks.notify === undefined ? undefined : call(() => notifyBytes('blocks: notify', blocks.notify))
    const { op, requests, promise } = this.native((n) => n.transferBlocks(OPCODE_NUMBERS[opcode], list, notify))
    const onAbort = () => {
      this.#native.cancel(op)
    }
    signal?.addEventListener('abort', onAbort, { once: true })
    let raw: Native.BlocksOutcome
    try {
      raw = await settled(promise)
    } finally {
      signal?.removeEventListener('abort', onAbort)
    }
    this.#events.explainLosses(raw.failed.map((f) => f.error))
    return blocksOutcome(raw, requests, signal)
  }

  /**
   * Submits a block list (see `BlockList`) as tasks of `batch` (merged runs, gathered);
   * poll it with `getBlockStatusInto`. Every block is checked first; on any error nothing
   * is submitted.
   */
  submitBlocks(batch: number, blocks: BatchBlockList): BlockSubmission {
    checkNumber('batch', batch, false)
    const list = call(() => toNativeBlocks(this, blocks, 'batch'))
    const op = OPCODE_NUMBERS[blockOpcode(blocks)]
    const notify = blocks.notify === undefined ? undefined : call(() => notifyBytes('submitBlocks: notify', blocks.notify))
    const { firstTask, starts } = this.native((n) => n.submitBlocks(batch, op, list, notify))
    return toSubmission(firstTask, starts)
  }

  /**
   * Writes the status of every block of `submission` into `out` (one byte per block, as
   * many as fit; `TransferStatus` values) and returns how many blocks are not yet done —
   * a poll that creates no object per block. Codes of failed blocks: `getTransferStatus`
   * of their task.
   */
  getBlockStatusInto(batch: number, submission: BlockSubmission, out: Uint8Array): number {
    checkNumber('batch', batch, false)
    if (typeof submission !== 'object' || submission === null || !(submission.starts instanceof Uint32Array)) {
      throw invalid(`getBlockStatusInto takes the BlockSubmission of submitBlocks, got ${describe(submission)}`)
    }
    checkBytes('out', out)
    return this.native((n) => n.getBlockStatusInto(batch, submission.firstTask, submission.starts, out))
  }

  /**
   * Writes the status of tasks `firstTask..` of `batch` into `out` (one byte per task, as
   * many as fit); returns how many it wrote.
   */
  getTransferStatusInto(batch: number, out: Uint8Array, firstTask = 0): number {
    checkNumber('batch', batch, false)
    checkNumber('firstTask', firstTask, false)
    checkBytes('out', out)
    return this.native((n) => n.getTransferStatusInto(batch, firstTask, out))
  }

  /** Reads remote bytes into local memory. Bad input rejects (never throws). */
  async read(request: IoRequest): Promise<TransferResult> {
    return traced(() => ioContext(this.segmentName, 'read', request), () => this.io('read', request))
  }

  /** Writes local bytes into remote memory. Bad input rejects (never throws). */
  async write(request: IoRequest): Promise<TransferResult> {
    return traced(() => ioContext(this.segmentName, 'write', request), () => this.io('write', request))
  }

  private async io(opcode: OpcodeName, request: IoRequest): Promise<TransferResult> {
    const native = call(() => toNativeRequest(this, request, 0, opcode))
    // The all-numbers call carries no verify flag: a verified request takes the general one.
    if (request.signal === undefined && request.notify === undefined && native.verify === undefined) return this.one(native)
    return this.run([native], request.signal, request.notify === undefined ? undefined : notifyBytes('notify', request.notify))
  }

  /**
   * One checked request through the binding's all-numbers call: no object to read by
   * property name on the way in and, when it completed, a number on the way out (the
   * task's status object is built here).
   */
  private async one(q: Native.TransferRequest): Promise<TransferResult> {
    const started = this.native((n) =>
      n.transferOne(
        q.opcode,
        q.local,
        q.localOffset ?? 0,
        q.segment,
        q.remoteBuffer ?? 0,
        q.remoteOffset ?? 0,
        q.length,
        q.transport ?? 0,
        q.requireTransport ?? 0,
      ),
    )
    const done = await settled(started)
    if (typeof done === 'number') {
      const task = completedTask(done, q.length)
      return { bytes: q.length, tasks: [task] }
    }
    return this.#outcome([done], undefined, undefined)
  }

  /**
   * Runs several requests; resolves when all completed, rejects with the first failure
   * (a FerryError whose `tasks` holds every task's status).
   */
  async transfer(requests: TransferRequest[], options: CallOptions & NotifyOptions = {}): Promise<TransferResult> {
    return traced(() => transferContext(this.segmentName, requests), () => this.#transfer(requests, options))
  }

  async #transfer(requests: TransferRequest[], options: CallOptions & NotifyOptions): Promise<TransferResult> {
    const o = checkOptions('transfer', options, ['signal', 'notify'])
    const notify = o.notify === undefined ? undefined : notifyBytes('transfer: notify', o.notify)
    return this.run(call(() => toNativeRequests(this, requests)), o.signal, notify)
  }

  private async run(list: Native.TransferRequest[], signalArg: unknown, notify?: Buffer): Promise<TransferResult> {
    const signal = checkSignal(signalArg)
    if (signal?.aborted) throw abortError(signal.reason)
    const started =
      notify === undefined
        ? this.native((n) => n.transfer(list))
        : this.native((n) => n.transferNotify(list, notify))
    const onAbort = () => {
      this.#native.cancel(started.op)
    }
    signal?.addEventListener('abort', onAbort, { once: true })
    let raw: Native.TaskStatusJs[]
    let notifyError: Native.NotifyResult | undefined
    try {
      const done = await settled<Native.TaskStatusJs[] | Native.NotifiedTransfer>(started.promise)
      if (Array.isArray(done)) raw = done
      else {
        raw = done.tasks
        notifyError = done.notifyError ?? undefined
      }
    } finally {
      signal?.removeEventListener('abort', onAbort)
    }
    return this.#outcome(raw, signal, notifyError)
  }

  /** A call's result from its tasks' statuses, or the error of the first that failed. */
  #outcome(raw: Native.TaskStatusJs[], signal: AbortSignal | undefined, notifyError: Native.NotifyResult | undefined): TransferResult {
    this.#events.explainLosses(raw.map((t) => t.error))
    return transferOutcome(raw.map(toTaskStatus), signal, notifyError)
  }

  /**
   * Sends a notification without data to `segment`. Notifications from this engine reach a
   * target in the order of the calls that sent them (these and the ones riding on transfers,
   * in the order those completed). Resolves with what the target did with it: `queued`, or
   * `dropped` when its queue was full. `signal` aborts the call: fired already, it rejects
   * with an `AbortError` and nothing is sent; fired later, it rejects at once, and the
   * notification, already on its way, may still arrive.
   */
  async notify(
    segment: Segment,
    data: NotifyData,
    options: CallOptions = {},
  ): Promise<{
    /** What the target did with it. */
    outcome: 'queued' | 'dropped'
  }> {
    if (!(segment instanceof Segment)) throw invalid(`notify takes a Segment, got ${describe(segment)}`)
    if (segment.engine !== this) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', 'notify: a Segment of another engine')
    const bytes = call(() => notifyBytes('notify: data', data))
    const signal = checkSignal(checkOptions('notify', options, ['signal']).signal)
    if (signal?.aborted) throw abortError(signal.reason)
    const r = await untilAborted(this.native((n) => n.notify(segment.handle, bytes)), signal)
    if (r.outcome === 'queued' || r.outcome === 'dropped') return { outcome: r.outcome }
    throw failureError(r.error, ['ERR_FERRY_NOTIFY_FAILED', 'notification not delivered'])
  }

  /**
   * The notifications that arrive, as an async iterator (`for await (const n of
   * engine.notifications({ signal }))`). It ends when the engine closes; an abort rejects
   * with an AbortError. While a consumer lags, notifications wait in the engine's bounded
   * queue (`notifyQueueSize`), where overflow is dropped and counted — never in JS memory.
   */
  notifications(options: { signal?: AbortSignal } = {}): AsyncIterableIterator<Notification> {
    return this.#notifications.iterator(options)
  }

  /** Starts `threads` native benchmark workers on this engine (tebench's runner). */
  bench(threads: number): Bench {
    return startBench(this.#native, threads)
  }

  /** Engine counters (docs/operations.md, "Metrics"). */
  metrics(): EngineMetrics {
    return toMetrics(this.native((n) => n.metrics()))
  }

  /** What this engine spreads its work over: I/O threads, tcp lanes per peer, shm copy threads. */
  spread(): EngineSpread {
    return toSpread(this.native((n) => n.spread()))
  }

  /** Engine counters in the Prometheus text exposition format (for a `/metrics` endpoint). */
  metricsText(): string {
    return this.native((n) => n.metricsText())
  }

  /** `await using engine = await Engine.create()` closes the engine at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close()
  }

  /**
   * Closes the engine: pending work rejects with ERR_FERRY_CLOSED, threads stop, memory is
   * released, and the engine no longer keeps the process alive. Idempotent.
   */
  close(): Promise<void> {
    if (!this.#closing) {
      // Synchronous underneath: calls made after close() returns already see ERR_FERRY_CLOSED.
      this.#native.close()
      holding.delete(this)
      this.#notifications.end()
      this.removeAllListeners()
      this.#closing = Promise.resolve()
    }
    return this.#closing
  }
}
