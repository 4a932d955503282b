/**
 * Ferry: a data transfer engine for Node.js clusters.
 *
 * A process registers memory; another reads or writes it by segment name and offset.
 * This module wraps the native binding with Node conventions: Promises, AbortSignal,
 * events, and errors that carry a stable `code`.
 */
import { constants as bufferConstants } from 'node:buffer'
import { EventEmitter } from 'node:events'
import * as path from 'node:path'
import type * as Native from './binding'
import { loadBinding } from './loader'

// index.ts runs from the package root (tests) or from dist/ (compiled).
const native = loadBinding<typeof Native>([__dirname, path.join(__dirname, '..')])

/** Transfer status values, with Mooncake TENT's numbering. */
export enum TransferStatus {
  WAITING = 0,
  PENDING = 1,
  INVALID = 2,
  CANCELED = 3,
  COMPLETED = 4,
  TIMEOUT = 5,
  FAILED = 6,
}

/** Transports Ferry knows. */
export type TransportName = 'tcp' | 'shm' | 'rdma'

/** Stable error codes. */
export type FerryErrorCode =
  | 'ERR_FERRY_INVALID_ARGUMENT'
  | 'ERR_FERRY_OUT_OF_RANGE'
  | 'ERR_FERRY_CLOSED'
  | 'ERR_FERRY_INVALID_BATCH'
  | 'ERR_FERRY_INVALID_TASK'
  | 'ERR_FERRY_BATCH_FULL'
  | 'ERR_FERRY_UNKNOWN_REGION'
  | 'ERR_FERRY_UNKNOWN_SEGMENT'
  | 'ERR_FERRY_FOREIGN_HANDLE'
  | 'ERR_FERRY_UNKNOWN_BUFFER'
  | 'ERR_FERRY_PERMISSION_DENIED'
  | 'ERR_FERRY_PEER_LOST'
  | 'ERR_FERRY_CONNECT'
  | 'ERR_FERRY_TRANSPORT_UNAVAILABLE'
  | 'ERR_FERRY_PROTOCOL'
  | 'ERR_FERRY_REMOTE_REJECTED'
  | 'ERR_FERRY_IO'
  | 'ERR_FERRY_CANCELED'
  | 'ERR_FERRY_TIMEOUT'
  | 'ERR_FERRY_METADATA'
  | 'ERR_FERRY_TRANSFER_FAILED'
  | 'ERR_FERRY_INTERNAL'
  | 'ERR_FERRY_NOTIFY_TOO_LARGE'
  | 'ERR_FERRY_NOTIFY_FAILED'
  | 'ABORT_ERR'

/** Status of one task: what happened, which transport served it, how many attempts. */
export interface TaskStatus extends Native.TaskStatus {
  status: TransferStatus
}

/** Aggregate status of a batch. */
export interface BatchStatus extends Native.BatchStatus {
  status: TransferStatus
}

/** An error from Ferry. `code` is stable; transfer failures also carry the task statuses. */
export class FerryError extends Error {
  readonly code: FerryErrorCode
  readonly status?: TransferStatus
  readonly transport?: TransportName
  readonly attempts?: number
  readonly tasks?: TaskStatus[]

  constructor(
    code: FerryErrorCode,
    message: string,
    extra: { status?: TransferStatus; transport?: TransportName; attempts?: number; tasks?: TaskStatus[]; cause?: unknown } = {},
  ) {
    super(message, extra.cause === undefined ? undefined : { cause: extra.cause })
    this.name = code === 'ABORT_ERR' ? 'AbortError' : 'FerryError'
    this.code = code
    this.status = extra.status
    this.transport = extra.transport
    this.attempts = extra.attempts
    this.tasks = extra.tasks
  }
}

/** napi's own statuses for a value of the wrong type (a safety net: the binding names fields itself). */
/** Waits one turn of the event loop. */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))
/** How long inline outcomes may follow one another without a turn of the loop. */
const TURN_EVERY_MS = 1
let lastTurn = performance.now()

/**
 * An outcome the binding returns as a Promise, or (done inline: same-host copies, no
 * Promise) as the value itself. The value is passed on at once, except that at least every
 * `TURN_EVERY_MS` it first waits for a turn of the loop: a caller's
 * `while (...) await engine.write(...)` loop then still lets timers and I/O run (delayed
 * by at most about that long) instead of spinning on microtasks for good, while most calls
 * skip the round trip through the loop (a few microseconds each).
 */
async function settled<T>(v: Promise<T> | T): Promise<T> {
  if (v instanceof Promise) {
    const got = await v
    // A Promise the engine settled from another thread resumes from the loop.
    lastTurn = performance.now()
    return got
  }
  if (performance.now() - lastTurn >= TURN_EVERY_MS) {
    await nextTurn()
    lastTurn = performance.now()
  }
  return v
}

const NAPI_TYPE_ERRORS = new Set([
  'InvalidArg',
  'ObjectExpected',
  'StringExpected',
  'NameExpected',
  'FunctionExpected',
  'NumberExpected',
  'BooleanExpected',
  'ArrayExpected',
  'BigintExpected',
  'DateExpected',
  'ArrayBufferExpected',
  'DetachableArraybufferExpected',
])

function toFerryError(err: unknown): unknown {
  if (err instanceof FerryError) return err
  const e = err as { code?: unknown; message?: unknown }
  if (e && typeof e.code === 'string' && e.code.startsWith('ERR_FERRY_')) {
    return new FerryError(e.code as FerryErrorCode, String(e.message))
  }
  if (e && typeof e.code === 'string' && NAPI_TYPE_ERRORS.has(e.code)) {
    return new FerryError('ERR_FERRY_INVALID_ARGUMENT', `invalid argument: ${String(e.message)}`, { cause: err })
  }
  if (err instanceof TypeError || err instanceof RangeError) {
    return new FerryError('ERR_FERRY_INVALID_ARGUMENT', err.message, { cause: err })
  }
  return err
}

function rethrow(err: unknown): never {
  throw toFerryError(err)
}

function invalid(message: string): FerryError {
  return new FerryError('ERR_FERRY_INVALID_ARGUMENT', message)
}

/** What a value is, for messages. */
function describe(v: unknown): string {
  if (v === null) return 'null'
  if (Array.isArray(v)) return 'an array'
  const t = typeof v
  return t === 'object' ? 'an object' : t === 'undefined' ? 'undefined' : `a ${t}`
}

/** The start task's errors carry `CODE\u0000message` (a task cannot set `code`). */
function startError(err: unknown): unknown {
  const message = (err as { message?: unknown })?.message
  if (typeof message === 'string') {
    const cut = message.indexOf('\u0000')
    if (cut > 0 && message.startsWith('ERR_FERRY_')) {
      return new FerryError(message.slice(0, cut) as FerryErrorCode, message.slice(cut + 1))
    }
  }
  return err
}

/** Runs a native call, turning its errors into FerryErrors. */
function call<T>(fn: () => T): T {
  try {
    return fn()
  } catch (err) {
    rethrow(err)
  }
}

/** A transport's number for the binding's all-numbers call: 0 none, 1 tcp, 2 shm, 3 rdma. */
function transportCode(t: string | undefined | null): number {
  return t === 'tcp' ? 1 : t === 'shm' ? 2 : t === 'rdma' ? 3 : 0
}

const TRANSPORT_BY_CODE: ReadonlyArray<TransportName | undefined> = [undefined, 'tcp', 'shm', 'rdma']

/** The status of a task the binding reported completed as `transport + 256 * attempts`. */
function completedTask(done: number, length: number): TaskStatus {
  return {
    status: TransferStatus.COMPLETED,
    name: 'COMPLETED',
    transferredBytes: length,
    length,
    transport: TRANSPORT_BY_CODE[done & 0xff],
    attempts: Math.floor(done / 256),
    code: undefined,
    message: undefined,
  }
}

function toTaskStatus(s: Native.TaskStatus): TaskStatus {
  return {
    status: s.status,
    name: s.name,
    transferredBytes: s.transferredBytes,
    length: s.length,
    transport: s.transport,
    attempts: s.attempts,
    code: s.code ?? undefined,
    message: s.message ?? undefined,
  }
}

/**
 * Engine settings. Every field is optional; each one's default and bounds are declared
 * once, in the core (`EngineConfig`), and documented in the README. A key that is not an
 * option (a typo such as `peerTimeoutMS`) is refused with `ERR_FERRY_INVALID_ARGUMENT`.
 */
export type EngineOptions = Omit<Native.EngineOptions, 'authSecret' | 'authSecretHex'> & {
  /** The cluster secret (a string or its bytes, at least 32 bytes); see the README. */
  authSecret?: string | Uint8Array
}
/** RDMA transport settings. Every field is optional. */
export type RdmaOptions = Native.RdmaOptions
/** Fault injection on one transport (seeded, reproducible). */
export type FaultOptions = Native.FaultOptions

/**
 * Largest Buffer one view can be: this runtime's `buffer.constants.MAX_LENGTH`, read when
 * the module loads (4 GiB on Node 20, 2^53 - 1 from Node 22 on).
 */
export const MAX_VIEW_BYTES: number = bufferConstants.MAX_LENGTH

/**
 * Local memory registered with an engine: engine-owned (`allocate`, any size) or user
 * memory (`registerMemory`, a view over a SharedArrayBuffer). Transfers address it by
 * offset; `view(offset, length)` is a Buffer over a window of it, and `buffer` one over
 * all of it where one Buffer can hold it (`MAX_VIEW_BYTES`, Node's
 * `buffer.constants.MAX_LENGTH`: 4 GiB on Node 20).
 */
export class Region {
  #released = false
  #whole?: Buffer
  /** @internal */
  constructor(
    /** @internal */
    readonly engine: Engine,
    /** @internal Handle of the region in this engine's requests. */
    readonly handle: number,
    /** Buffer id in its engine: what peers name in `remoteBuffer`. */
    readonly id: number,
    /** Length in bytes. */
    readonly length: number,
    /** @internal The registered memory, for user regions. */
    private readonly user?: Buffer,
  ) {}

  /** Whether `release()` was called. */
  get released(): boolean {
    return this.#released
  }

  /**
   * A Buffer over the whole region. A region larger than one Buffer can be
   * (`MAX_VIEW_BYTES`, Node's `buffer.constants.MAX_LENGTH`: 4 GiB on Node 20) has none:
   * this throws `ERR_FERRY_INVALID_ARGUMENT` naming the limit; use `view()`.
   */
  get buffer(): Buffer {
    if (this.user) return this.user
    if (!this.#whole) {
      if (this.length > MAX_VIEW_BYTES) {
        throw invalid(`a region of ${this.length} bytes is larger than one Buffer can be on this runtime (buffer.constants.MAX_LENGTH = ${MAX_VIEW_BYTES}); use region.view(offset, length)`)
      }
      this.#whole = this.view(0, this.length)
    }
    return this.#whole
  }

  /**
   * A Buffer over `[offset, offset + length)` of the region (default: to its end), at most
   * `MAX_VIEW_BYTES` (Node's `buffer.constants.MAX_LENGTH`: 4 GiB on Node 20); a longer
   * one throws `ERR_FERRY_INVALID_ARGUMENT`. A view stays valid after `release()` and `close()`; new views need the region
   * to be registered still.
   */
  view(offset = 0, length?: number): Buffer {
    const len = this.range('view', offset, length)
    if (this.user) return this.user.subarray(offset, offset + len)
    return this.engine.native((n) => n.regionView(this.handle, offset, len))
  }

  /**
   * Fills `[offset, offset + length)` (default: all of it) with `value` as `Buffer.fill`
   * does, window by window (windows of 255 × 4 MiB, so a pattern of up to 255 bytes whose
   * length divides that keeps its phase across them).
   */
  fill(value: string | number | Uint8Array, offset = 0, length?: number): this {
    const end = offset + this.range('fill', offset, length)
    const window = 255 * 2 ** 22
    for (let at = offset; at < end; at += window) {
      this.view(at, Math.min(window, end - at)).fill(value)
    }
    return this
  }

  /** The length of `[offset, offset + length)`, checked to lie inside the region. */
  private range(what: string, offset: unknown, length: unknown): number {
    if (typeof offset !== 'number' || !Number.isSafeInteger(offset) || offset < 0) {
      throw invalid(`${what}: offset must be a non-negative integer, got ${typeof offset === 'number' ? offset : describe(offset)}`)
    }
    const len = length === undefined ? this.length - offset : length
    if (typeof len !== 'number' || !Number.isSafeInteger(len) || len <= 0) {
      throw invalid(`${what}: length must be a positive integer, got ${typeof len === 'number' ? len : describe(len)}`)
    }
    if (offset + len > this.length) {
      throw new FerryError('ERR_FERRY_OUT_OF_RANGE', `${what}: [${offset}, ${offset}+${len}) outside a region of ${this.length} bytes`)
    }
    return len
  }

  /** Releases the region. Transfers still in flight finish first; views stay valid. */
  release(): void {
    this.engine.native((n) => n.release(this.handle))
    this.#released = true
  }
}

/** A buffer a remote segment exposes. */
export interface RemoteBuffer extends Native.RemoteBuffer {}

/** An opened remote segment. */
export class Segment {
  /** @internal */
  constructor(
    /** @internal */
    readonly engine: Engine,
    /** Handle used in requests (names its engine). */
    readonly handle: number,
    /** Segment name (`host:port`, or its name in etcd). */
    readonly name: string,
    /** The peer engine's id. */
    readonly engineId: string,
    /** Buffers the peer exposes (as of the last open). */
    readonly buffers: RemoteBuffer[],
  ) {}

  /** Closes the segment (as `engine.closeSegment(this)`); its in-flight work fails. */
  close(): void {
    this.engine.closeSegment(this)
  }
}

/** One transfer. */
export interface TransferRequest {
  opcode: 'read' | 'write'
  /** Local region. */
  local: Region
  /** Offset in the local region. Default 0. */
  localOffset?: number
  /** Remote segment. */
  remote: Segment
  /** Remote buffer id. Default 0. */
  remoteBuffer?: number
  /** Offset in the remote buffer. Default 0. */
  remoteOffset?: number
  /** Bytes to move (> 0). */
  length: number
  /** Pin the first attempt to this transport (fallback allowed). */
  transport?: TransportName
  /** Only this transport may serve the request; fails with ERR_FERRY_TRANSPORT_UNAVAILABLE otherwise. */
  requireTransport?: TransportName
}

/** Options of the Promise calls. */
export interface CallOptions {
  /** Aborts the transfer; the Promise rejects with an `AbortError` (code `ABORT_ERR`). */
  signal?: AbortSignal
}

/** A notification's payload: bytes, or a string (sent as UTF-8). At most `notifyMaxBytes` (4 KiB by default). */
export type NotifyData = string | ArrayBufferView

/** Options of `transfer` and `submitTransfer`. */
export interface NotifyOptions {
  /** Sent to the target once every byte of the call is in its memory; never for a call that did not complete. */
  notify?: NotifyData
}

/** A read or write through the Promise API. */
export type IoRequest = Omit<TransferRequest, 'opcode'> & CallOptions & NotifyOptions

/** Outcome of a completed transfer. */
export interface TransferResult {
  /** Bytes moved. */
  bytes: number
  /** Per-task statuses (transport and attempts included). */
  tasks: TaskStatus[]
}

/** Offsets or lengths of a block list, one entry per block (integers; below 2^53 in a Float64Array). */
export type BlockArray = Float64Array | BigUint64Array

/**
 * Many blocks in one call, described by parallel typed arrays: block `i` moves
 * `lengths[i]` bytes between `localOffsets[i]` of its local region and `remoteOffsets[i]`
 * of its remote buffer. `local`, `remote` and `remoteBuffer` are one for every block or an
 * array with one entry per block. Blocks adjacent and contiguous on both sides are merged
 * into one request; overlapping blocks are not merged (their order is unspecified). Runs of
 * small requests (up to 256 KiB each) between one region and one remote buffer are then
 * gathered into one task of up to 4 MiB: one task, one completion, however scattered the
 * pages; the task's outcome is each of its blocks'.
 */
export interface BlockList {
  /** Local region(s). */
  local: Region | Region[]
  /** Remote segment(s). */
  remote: Segment | Segment[]
  /** Remote buffer id(s). Default 0. */
  remoteBuffer?: number | number[] | BlockArray
  /** Offset of each block in its local region. */
  localOffsets: BlockArray
  /** Offset of each block in its remote buffer. */
  remoteOffsets: BlockArray
  /** Length of each block (> 0), or one length for all. */
  lengths: number | BlockArray
  /** Pin the first attempt to this transport (fallback allowed). */
  transport?: TransportName
  /** Only this transport may serve the blocks. */
  requireTransport?: TransportName
  /**
   * Notify the blocks' segment (they must share one) once every block completed: one
   * notification for the whole list, `bytes` the list's total (see `notify` on `write`).
   */
  notify?: NotifyData
}

/** A block list submitted to a batch: the list and its opcode. */
export type BatchBlockList = BlockList & { opcode: 'read' | 'write' }

/** A block list through the Promise API. */
export type BlocksRequest = BlockList & CallOptions

/** A block that did not complete. */
export interface BlockFailure {
  /** Index of the block. */
  block: number
  /** Its status. */
  status: TransferStatus
  code: FerryErrorCode
  message: string
}

/** Outcome of `readBlocks` / `writeBlocks`. */
export interface BlocksResult {
  /** One status per block (`TransferStatus`; 4 = COMPLETED). */
  status: Uint8Array
  /** Tasks the blocks became (merged runs, gathered; see `BlockList`). */
  requests: number
  /** The blocks that did not complete (empty when all did). */
  failed: BlockFailure[]
}

/** A block list submitted to a batch (`submitBlocks`), for `getBlockStatusInto`. */
export interface BlockSubmission {
  /** Index of the first task in the batch. */
  firstTask: number
  /** Tasks the list became (merged runs, gathered; see `BlockList`). */
  tasks: number
  /** Blocks of the list. */
  blocks: number
  /** Task `firstTask + r` covers blocks `starts[r]..starts[r + 1]`. */
  starts: Uint32Array
}

/** Bytes of completed transfers over one transport for one operation. */
export interface BytesByTransport extends Native.BytesByTransport {}

/** Engine counters (see README, "Metrics"). Counted in the core with atomics. */
export interface EngineMetrics extends Native.EngineMetrics {
  /** Bytes of completed transfers, by transport and op (every combination, zeros too). */
  bytes: BytesByTransport[]
  /** Transfers that ended, by final status: completed, failed, timeout, canceled, invalid. */
  transfers: Record<'completed' | 'failed' | 'timeout' | 'canceled' | 'invalid', number>
}

/** A peer was declared lost (reset, EOF, or `peerTimeoutMs` of silence); its in-flight work failed. */
export interface PeerLostEvent {
  kind: 'peerLost'
  segment: string
  reason: string
}

/** A lost peer answers again; new transfers to it may succeed. */
export interface PeerRecoveredEvent {
  kind: 'peerRecovered'
  segment: string
}

/** A task's attempt failed and it moved to another attempt. */
export interface FailoverEvent {
  kind: 'failover'
  segment: string
  from: TransportName
  to: TransportName
  /** Switches this task has made, this one included. */
  attempt: number
  reason: string
}

/**
 * A transport was taken out of use: towards one peer by the rail monitor (`segment` and
 * `untilMs` set: the pause ends at that time, ms since the epoch), or on this engine at
 * start because it failed to install (no `segment`).
 */
export interface TransportDisabledEvent {
  kind: 'transportDisabled'
  transport: TransportName
  segment?: string
  reason: string
  untilMs?: number
}

/** A notification that arrived: its data landed here before it was sent. */
export interface Notification {
  /** The sender's segment name (as it named itself on its authenticated connection). */
  from: string
  /** The sender's engine id. */
  engineId: string
  /** The payload. */
  data: Buffer
  /** Bytes of the transfer it rode on (0 for `engine.notify`). */
  bytes: number
}

/** The receive queue (`notifyQueueSize`) was full: notifications were dropped and counted. Once per run of drops. */
export interface NotificationsDroppedEvent {
  kind: 'notificationsDropped'
  /** The sender of the first dropped notification of this run. */
  from: string
  /** Notifications this engine dropped so far (`ferry_notifications_dropped_total`). */
  total: number
}

/** Event name → payload. */
export interface EngineEvents {
  peerLost: PeerLostEvent
  peerRecovered: PeerRecoveredEvent
  failover: FailoverEvent
  transportDisabled: TransportDisabledEvent
  notification: Notification
  notificationsDropped: NotificationsDroppedEvent
}

/** Any engine event about peers and transports (the notification events are typed apart). */
export type EngineEvent = Exclude<EngineEvents[keyof EngineEvents], Notification | NotificationsDroppedEvent>

function toEvent(e: Native.EngineEventJs): EngineEvent | undefined {
  const segment = e.segment ?? undefined
  switch (e.kind) {
    case 'peerLost':
      return { kind: 'peerLost', segment: segment ?? '', reason: e.reason ?? '' }
    case 'peerRecovered':
      return { kind: 'peerRecovered', segment: segment ?? '' }
    case 'failover':
      return {
        kind: 'failover',
        segment: segment ?? '',
        from: e.from as TransportName,
        to: e.to as TransportName,
        attempt: e.attempt ?? 0,
        reason: e.reason ?? '',
      }
    case 'transportDisabled':
      return {
        kind: 'transportDisabled',
        transport: e.transport as TransportName,
        segment,
        reason: e.reason ?? '',
        untilMs: e.untilMs ?? undefined,
      }
    default:
      return undefined
  }
}

const REQUEST_KEYS = new Set([
  'opcode',
  'local',
  'localOffset',
  'remote',
  'remoteBuffer',
  'remoteOffset',
  'length',
  'transport',
  'requireTransport',
  'signal',
  'notify',
])
const TRANSPORTS = new Set(['tcp', 'shm', 'rdma'])

function checkNumber(what: string, v: unknown, optional: boolean): void {
  if (v === undefined && optional) return
  if (typeof v !== 'number') throw invalid(`${what} must be a non-negative integer, got ${describe(v)}`)
}

function checkTransport(what: string, v: unknown): void {
  if (v === undefined) return
  if (typeof v !== 'string' || !TRANSPORTS.has(v)) throw invalid(`${what} must be 'tcp', 'shm' or 'rdma', got ${typeof v === 'string' ? JSON.stringify(v) : describe(v)}`)
}

/** One request as the binding takes it: every field's type checked, handles of `engine`. */
function toNativeRequest(engine: Engine, r: unknown, i: number, opcode?: 'read' | 'write'): Native.TransferRequest {
  const at = `request ${i}`
  if (typeof r !== 'object' || r === null || Array.isArray(r)) throw invalid(`${at} must be an object, got ${describe(r)}`)
  const q = r as Record<string, unknown>
  for (const key of Object.keys(q)) {
    if (!REQUEST_KEYS.has(key) || ((key === 'signal' || key === 'notify') && opcode === undefined)) {
      if (q[key] !== undefined) throw invalid(`${at} has no field ${JSON.stringify(key)} (a typo?)`)
    }
  }
  const op = opcode ?? q.opcode
  if (op !== 'read' && op !== 'write') throw invalid(`${at}: opcode must be 'read' or 'write', got ${typeof op === 'string' ? JSON.stringify(op) : describe(op)}`)
  if (!(q.local instanceof Region)) throw invalid(`${at}: local must be a Region, got ${describe(q.local)}`)
  if (!(q.remote instanceof Segment)) throw invalid(`${at}: remote must be a Segment, got ${describe(q.remote)}`)
  if (q.local.engine !== engine) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', `${at}: local is a Region of another engine`)
  if (q.remote.engine !== engine) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', `${at}: remote is a Segment of another engine`)
  checkNumber(`${at}: localOffset`, q.localOffset, true)
  checkNumber(`${at}: remoteBuffer`, q.remoteBuffer, true)
  checkNumber(`${at}: remoteOffset`, q.remoteOffset, true)
  checkNumber(`${at}: length`, q.length, false)
  checkTransport(`${at}: transport`, q.transport)
  checkTransport(`${at}: requireTransport`, q.requireTransport)
  return {
    opcode: op,
    local: q.local.handle,
    localOffset: q.localOffset as number | undefined,
    segment: q.remote.handle,
    remoteBuffer: q.remoteBuffer as number | undefined,
    remoteOffset: q.remoteOffset as number | undefined,
    length: q.length as number,
    // What the two mean together is decided once, in the core (`TransportHint`).
    transport: q.transport as string | undefined,
    requireTransport: q.requireTransport as string | undefined,
  }
}

function toNativeRequests(engine: Engine, requests: unknown): Native.TransferRequest[] {
  if (!Array.isArray(requests)) throw invalid(`requests must be an array, got ${describe(requests)}`)
  if (requests.length === 0) throw invalid('no requests given')
  return requests.map((r, i) => toNativeRequest(engine, r, i))
}

/** A notification payload as bytes; a string is UTF-8. */
function notifyBytes(what: string, v: unknown): Buffer {
  if (typeof v === 'string') return Buffer.from(v, 'utf8')
  if (ArrayBuffer.isView(v)) return Buffer.from(v.buffer, v.byteOffset, v.byteLength)
  throw invalid(`${what} must be a string, Buffer or TypedArray, got ${describe(v)}`)
}

/** Checks an options object of `transfer`/`submitTransfer` against the keys it may have. */
function checkOptions(what: string, options: unknown, keys: string[]): Record<string, unknown> {
  if (typeof options !== 'object' || options === null) throw invalid(`${what} options must be an object, got ${describe(options)}`)
  const o = options as Record<string, unknown>
  for (const key of Object.keys(o)) {
    if (!keys.includes(key) && o[key] !== undefined) throw invalid(`${what} has no option ${JSON.stringify(key)}`)
  }
  return o
}

const BLOCK_KEYS = new Set(['local', 'remote', 'remoteBuffer', 'localOffsets', 'remoteOffsets', 'lengths', 'transport', 'requireTransport', 'notify'])

function checkBytes(what: string, v: unknown): void {
  if (!(v instanceof Uint8Array)) throw invalid(`${what} must be a Uint8Array, got ${describe(v)}`)
}

/** One handle, or a Float64Array of one per block, of `engine`'s regions or segments. */
function blockHandles(engine: Engine, what: string, v: unknown, kind: typeof Region | typeof Segment): number | Float64Array {
  const one = (x: unknown, at: string): number => {
    if (!(x instanceof kind)) throw invalid(`${at} must be a ${kind.name}, got ${describe(x)}`)
    if (x.engine !== engine) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', `${at} is a ${kind.name} of another engine`)
    return x.handle
  }
  if (!Array.isArray(v)) return one(v, what)
  const out = new Float64Array(v.length)
  for (let i = 0; i < v.length; i++) out[i] = one(v[i], `${what}[${i}]`)
  return out
}

/** The native arguments of a block list (the arrays themselves are checked natively). */
function toNativeBlocks(engine: Engine, b: unknown, form: 'promise' | 'batch') {
  if (typeof b !== 'object' || b === null || Array.isArray(b)) throw invalid(`blocks must be an object, got ${describe(b)}`)
  const q = b as Record<string, unknown>
  for (const key in q) {
    const known = BLOCK_KEYS.has(key) || key === (form === 'promise' ? 'signal' : 'opcode')
    if (!known && q[key] !== undefined) throw invalid(`blocks has no field ${JSON.stringify(key)} (a typo?)`)
  }
  checkTransport('transport', q.transport)
  checkTransport('requireTransport', q.requireTransport)
  const rb = q.remoteBuffer
  const list: Native.NativeBlockList = {
    local: blockHandles(engine, 'local', q.local, Region),
    remote: blockHandles(engine, 'remote', q.remote, Segment),
    remoteBuffer: Array.isArray(rb) ? Float64Array.from(rb, (x) => (typeof x === 'number' ? x : NaN)) : (rb as number | undefined),
    localOffsets: q.localOffsets as Float64Array,
    remoteOffsets: q.remoteOffsets as Float64Array,
    lengths: q.lengths as number,
    transport: q.transport as string | undefined,
    requireTransport: q.requireTransport as string | undefined,
  }
  return list
}

/** The per-block failures of an outcome (one entry per block of each failed request). */
function blockFailures(runs: Native.FailedBlocks[]): BlockFailure[] {
  const failed: BlockFailure[] = []
  for (const r of runs) {
    for (let b = r.first; b < r.first + r.count; b++) {
      failed.push({ block: b, status: r.status, code: r.code as FerryErrorCode, message: r.message })
    }
  }
  return failed
}

function checkSignal(signal: unknown): AbortSignal | undefined {
  if (signal === undefined) return undefined
  if (!(signal instanceof AbortSignal)) throw invalid(`signal must be an AbortSignal, got ${describe(signal)}`)
  return signal
}

/** One tebench case for the native workers. */
export interface BenchCase extends Omit<Native.BenchCase, 'local' | 'segment' | 'peer' | 'extraTargets'> {
  local: Region
  remote: Segment
  /** Further targets: worker i works against target i % (1 + extraTargets.length). */
  extraTargets?: Array<{ remote: Segment; remoteBuffer: number }>
}

/** tebench's columns for one case (the bench crate's report row, as it is). */
export type BenchRow = Native.ReportRow
/** One transport's part of a case: bytes and percent. */
export type TransportShare = Native.TransportShare
/** Why a case failed: status, transport, peer and request. */
export type BenchFailure = Native.BenchFailure
/** A case's outcome. */
export type BenchResult = Native.BenchResult

/** Mooncake's table header, two lines: the column names and a line of 160 `-`. */
export function benchMooncakeHeader(): string {
  return native.benchMooncakeHeader()
}

/** A row in Mooncake's layout (left-aligned fixed widths, 6 decimals for GB/s, 1 for µs). */
export function benchMooncakeLine(row: BenchRow): string {
  return call(() => native.benchMooncakeLine(row))
}

/**
 * Native benchmark workers (the tebench runner): `threads` threads that loop allocate →
 * submit → poll (with backoff) → free through the engine, timing every operation.
 */
export class Bench {
  readonly #native: Native.NativeBench
  /** @internal */
  constructor(n: Native.NativeBench) {
    this.#native = n
  }

  /** Runs one case on every worker; a failure stops the gate (later cases return it). */
  async runCase(c: BenchCase): Promise<BenchResult> {
    if (typeof c !== 'object' || c === null) throw invalid(`runCase takes a BenchCase, got ${describe(c)}`)
    const { local, remote, extraTargets, ...rest } = c
    if (!(local instanceof Region)) throw invalid(`runCase: local must be a Region, got ${describe(local)}`)
    if (!(remote instanceof Segment)) throw invalid(`runCase: remote must be a Segment, got ${describe(remote)}`)
    return call(() =>
      this.#native.runCase({
        ...rest,
        local: local.handle,
        segment: remote.handle,
        peer: remote.name,
        extraTargets: extraTargets?.map((t) => ({ segment: t.remote.handle, peer: t.remote.name, remoteBuffer: t.remoteBuffer })),
      }),
    )
  }

  /** Stops the workers; a running case resolves as "stopped" with partial results. */
  stop(): void {
    this.#native.stop()
  }
}

/** Typed `on`/`once`/`off`/`emit` for the engine's events (see `EngineEvents`). */
export interface Engine {
  on<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  once<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  off<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  addListener<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  removeListener<K extends keyof EngineEvents>(event: K, listener: (e: EngineEvents[K]) => void): this
  emit<K extends keyof EngineEvents>(event: K, payload: EngineEvents[K]): boolean
}

/**
 * A Ferry engine: owns memory, opens peers' segments, moves bytes. An EventEmitter of
 * `peerLost`, `peerRecovered`, `failover` and `transportDisabled` (typed by `EngineEvents`).
 * `transportDisabled` events that arrive while nobody listens to them (those of a transport
 * that failed to install at start, typically) are kept and delivered to the first listener.
 */
export class Engine extends EventEmitter {
  readonly #native: Native.NativeEngine
  #closing?: Promise<void>
  #unheard: TransportDisabledEvent[] = []

  /** Open `notifications()` iterators. */
  readonly #inboxes = new Set<NotificationQueue>()

  private constructor(n: Native.NativeEngine, queueSize: number) {
    super()
    this.#native = n
    this.#queueSize = queueSize
    super.on('newListener', (name: string | symbol) => {
      // Notifications that waited for a listener go to it once it is in place.
      if (name === 'notification') process.nextTick(() => this.#drainNotifications())
    })
    n.setNotificationHandler((s: Native.NotifySignalJs) => {
      if (s.kind === 'ready') this.#drainNotifications()
      else if (s.kind === 'dropped') {
        super.emit('notificationsDropped', { kind: 'notificationsDropped', from: s.from ?? '', total: s.total ?? 0 })
      }
    })
    super.on('newListener', (name: string | symbol) => {
      if (name !== 'transportDisabled' || this.#unheard.length === 0) return
      // After the listener is in place (newListener runs before it is added).
      process.nextTick(() => {
        for (const e of this.#unheard.splice(0)) super.emit('transportDisabled', e)
      })
    })
    n.setEventHandler((raw: Native.EngineEventJs) => {
      const event = toEvent(raw)
      if (!event) return
      if (event.kind === 'transportDisabled' && this.listenerCount('transportDisabled') === 0) {
        if (this.#unheard.length < 64) this.#unheard.push(event)
        return
      }
      if (event.kind === 'peerLost') {
        this.#announceLoss(event.segment, event.reason)
        return
      }
      if (event.kind === 'peerRecovered') this.#lost.delete(event.segment)
      super.emit(event.kind, event)
    })
  }

  /** Segments whose `peerLost` was emitted and that have not recovered since. */
  readonly #lost = new Set<string>()

  /** Emits `peerLost` for `segment` unless it was emitted for this loss already. */
  #announceLoss(segment: string, reason: string): void {
    if (this.#lost.has(segment)) return
    this.#lost.add(segment)
    super.emit('peerLost', { kind: 'peerLost', segment, reason })
  }

  /**
   * The core emits `peerLost` before it fails the work the loss explains, but the event and
   * a Promise's settlement reach JS through different native queues, in either order. So a
   * status that shows such a failure emits the event first if it has not arrived yet (the
   * native one is then not emitted again).
   */
  #explainLosses(tasks: ReadonlyArray<{ code?: string | null; message?: string | null }>): void {
    for (const t of tasks) {
      if (t.code !== 'ERR_FERRY_PEER_LOST' || typeof t.message !== 'string') continue
      // The core's wording: "peer <segment> lost: <reason>".
      const m = /^peer (.+?) lost: (.*)$/s.exec(t.message)
      if (m) this.#announceLoss(m[1], m[2])
    }
  }

  /**
   * Starts an engine. Binding, starting threads and registering in etcd happen off the JS
   * thread, so a slow or unreachable etcd never blocks the event loop.
   */
  static async create(options: EngineOptions = {}): Promise<Engine> {
    if (typeof options !== 'object' || options === null || Array.isArray(options)) {
      throw invalid(`options must be an object, got ${describe(options)}`)
    }
    const { authSecret, ...rest } = options
    const nativeOptions: Native.EngineOptions =
      authSecret instanceof Uint8Array
        ? { ...rest, authSecretHex: Buffer.from(authSecret.buffer, authSecret.byteOffset, authSecret.byteLength).toString('hex') }
        : authSecret === undefined ? rest : { ...rest, authSecret }
    const started = call(() => native.startEngine(nativeOptions))
    let engine: Engine
    try {
      engine = new Engine(await started, typeof rest.notifyQueueSize === 'number' ? rest.notifyQueueSize : 1024)
    } catch (err) {
      throw startError(err)
    }
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
    if (!ArrayBuffer.isView(memory)) {
      throw invalid(`registerMemory takes a TypedArray, DataView or Buffer over a SharedArrayBuffer, got ${describe(memory)}`)
    }
    if (typeof options !== 'object' || options === null) throw invalid(`registerMemory options must be an object, got ${describe(options)}`)
    for (const key of Object.keys(options)) {
      if (key !== 'readOnly' && (options as Record<string, unknown>)[key] !== undefined) throw invalid(`registerMemory has no option ${JSON.stringify(key)}`)
    }
    if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean') {
      throw invalid(`registerMemory: readOnly must be a boolean, got ${describe(options.readOnly)}`)
    }
    const r = this.native((n) => n.registerMemory(memory, options.readOnly ?? false))
    const bytes = Buffer.isBuffer(memory) ? memory : Buffer.from(memory.buffer, memory.byteOffset, memory.byteLength)
    return new Region(this, r.handle, r.id, r.length, bytes)
  }

  /** Opens (or refreshes) a peer's segment by name (`host:port`, or its name in etcd). */
  async openSegment(name: string): Promise<Segment> {
    if (typeof name !== 'string') throw invalid(`segment name must be a string, got ${describe(name)}`)
    const r = await this.native((n) => n.openSegment(name))
    if (!r.segment) throw new FerryError((r.code ?? 'ERR_FERRY_CONNECT') as FerryErrorCode, r.message ?? 'openSegment failed')
    const s = r.segment
    return new Segment(
      this,
      s.handle,
      s.name,
      s.engineId,
      s.buffers.map((b) => ({
        id: b.id,
        length: b.length,
        access: b.access,
        transports: b.transports,
      })),
    )
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
    const status = toTaskStatus(this.native((n) => n.getTransferStatus(batch, task)))
    this.#explainLosses([status])
    return status
  }

  /** Status of every task of a batch. */
  getTransferStatusList(batch: number): TaskStatus[] {
    const list = this.native((n) => n.getTransferStatusList(batch)).map(toTaskStatus)
    this.#explainLosses(list)
    return list
  }

  /** Aggregate status of a batch. */
  getBatchStatus(batch: number): BatchStatus {
    const s = this.native((n) => n.getBatchStatus(batch))
    return { status: s.status, name: s.name, transferredBytes: s.transferredBytes, tasks: s.tasks }
  }

  /** Frees a batch; tasks still pending are canceled. */
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
    return this.blocks('read', blocks)
  }

  /** Writes many blocks (see `readBlocks`). */
  async writeBlocks(blocks: BlocksRequest): Promise<BlocksResult> {
    return this.blocks('write', blocks)
  }

  private async blocks(opcode: 'read' | 'write', blocks: BlocksRequest): Promise<BlocksResult> {
    const list = call(() => toNativeBlocks(this, blocks, 'promise'))
    const signal = checkSignal(blocks.signal)
    if (signal?.aborted) {
      throw new FerryError('ABORT_ERR', 'The operation was aborted', { cause: signal.reason })
    }
    const notify = blocks.notify === undefined ? undefined : call(() => notifyBytes('blocks: notify', blocks.notify))
    const { op, requests, promise } = this.native((n) => n.transferBlocks(opcode, list, notify))
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
    if (raw.failed.length === 0) {
      const e = raw.notifyError
      if (e) throw new FerryError((e.code ?? 'ERR_FERRY_NOTIFY_FAILED') as FerryErrorCode, e.message ?? 'notification not delivered')
      return { status: raw.status, requests, failed: [] }
    }
    this.#explainLosses(raw.failed)
    if (signal?.aborted && raw.failed.some((r) => r.code === 'ERR_FERRY_CANCELED')) {
      throw new FerryError('ABORT_ERR', 'The operation was aborted', { cause: signal.reason })
    }
    return { status: raw.status, requests, failed: blockFailures(raw.failed) }
  }

  /**
   * Submits a block list (see `BlockList`) as tasks of `batch` (merged runs, gathered);
   * poll it with `getBlockStatusInto`. Every block is checked first; on any error nothing
   * is submitted.
   */
  submitBlocks(batch: number, blocks: BatchBlockList): BlockSubmission {
    checkNumber('batch', batch, false)
    const list = call(() => toNativeBlocks(this, blocks, 'batch'))
    const op = (blocks as { opcode?: unknown }).opcode
    if (op !== 'read' && op !== 'write') throw invalid(`blocks: opcode must be 'read' or 'write', got ${typeof op === 'string' ? JSON.stringify(op) : describe(op)}`)
    const notify = blocks.notify === undefined ? undefined : call(() => notifyBytes('submitBlocks: notify', blocks.notify))
    const { firstTask, starts } = this.native((n) => n.submitBlocks(batch, op, list, notify))
    return { firstTask, tasks: starts.length - 1, blocks: starts[starts.length - 1], starts }
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
    return this.io('read', request)
  }

  /** Writes local bytes into remote memory. Bad input rejects (never throws). */
  async write(request: IoRequest): Promise<TransferResult> {
    return this.io('write', request)
  }

  private async io(opcode: 'read' | 'write', request: IoRequest): Promise<TransferResult> {
    const native = call(() => toNativeRequest(this, request, 0, opcode))
    if (request.signal === undefined && request.notify === undefined) return this.one(native)
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
        q.opcode === 'read' ? 0 : 1,
        q.local,
        q.localOffset ?? 0,
        q.segment,
        q.remoteBuffer ?? 0,
        q.remoteOffset ?? 0,
        q.length,
        transportCode(q.transport),
        transportCode(q.requireTransport),
      ),
    )
    const done = await settled(started)
    if (typeof done === 'number') {
      const task = completedTask(done, q.length)
      return { bytes: q.length, tasks: [task] }
    }
    return this.#outcome([toTaskStatus(done)], undefined, undefined)
  }

  /**
   * Runs several requests; resolves when all completed, rejects with the first failure
   * (a FerryError whose `tasks` holds every task's status).
   */
  async transfer(requests: TransferRequest[], options: CallOptions & NotifyOptions = {}): Promise<TransferResult> {
    const o = checkOptions('transfer', options, ['signal', 'notify'])
    const notify = o.notify === undefined ? undefined : notifyBytes('transfer: notify', o.notify)
    return this.run(call(() => toNativeRequests(this, requests)), o.signal, notify)
  }

  private async run(list: Native.TransferRequest[], signalArg: unknown, notify?: Buffer): Promise<TransferResult> {
    const signal = checkSignal(signalArg)
    if (signal?.aborted) {
      throw new FerryError('ABORT_ERR', 'The operation was aborted', { cause: signal.reason })
    }
    const started =
      notify === undefined
        ? this.native((n) => n.transfer(list))
        : this.native((n) => n.transferNotify(list, notify))
    const onAbort = () => {
      this.#native.cancel(started.op)
    }
    signal?.addEventListener('abort', onAbort, { once: true })
    let raw: Native.TaskStatus[]
    let notifyError: Native.NotifyResult | undefined
    try {
      const done = await settled<Native.TaskStatus[] | Native.NotifiedTransfer>(started.promise)
      if (Array.isArray(done)) raw = done
      else {
        raw = done.tasks
        notifyError = done.notifyError ?? undefined
      }
    } finally {
      signal?.removeEventListener('abort', onAbort)
    }
    return this.#outcome(raw.map(toTaskStatus), signal, notifyError)
  }

  /** A call's result from its tasks' statuses, or the error of the first that failed. */
  #outcome(tasks: TaskStatus[], signal: AbortSignal | undefined, notifyError: Native.NotifyResult | undefined): TransferResult {
    this.#explainLosses(tasks)
    const failed = tasks.find((t) => t.status !== TransferStatus.COMPLETED)
    if (!failed && notifyError) {
      throw new FerryError((notifyError.code ?? 'ERR_FERRY_NOTIFY_FAILED') as FerryErrorCode, notifyError.message ?? 'notification not delivered', { tasks })
    }
    if (!failed) {
      return { bytes: tasks.reduce((a, t) => a + t.transferredBytes, 0), tasks }
    }
    if (signal?.aborted && failed.code === 'ERR_FERRY_CANCELED') {
      throw new FerryError('ABORT_ERR', 'The operation was aborted', { cause: signal.reason, tasks })
    }
    throw new FerryError((failed.code ?? 'ERR_FERRY_TRANSFER_FAILED') as FerryErrorCode, failed.message ?? `transfer ${failed.name}`, {
      status: failed.status,
      transport: failed.transport,
      attempts: failed.attempts,
      tasks,
    })
  }

  readonly #queueSize: number

  /**
   * Sends a notification without data to `segment`. Notifications from this engine reach a
   * target in the order of the calls that sent them (these and the ones riding on transfers,
   * in the order those completed). Resolves with what the target did with it: `queued`, or
   * `dropped` when its queue was full.
   */
  async notify(segment: Segment, data: NotifyData): Promise<{ outcome: 'queued' | 'dropped' }> {
    if (!(segment instanceof Segment)) throw invalid(`notify takes a Segment, got ${describe(segment)}`)
    if (segment.engine !== this) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', 'notify: a Segment of another engine')
    const bytes = call(() => notifyBytes('notify: data', data))
    const r = await this.native((n) => n.notify(segment.handle, bytes))
    if (r.outcome === 'queued' || r.outcome === 'dropped') return { outcome: r.outcome }
    throw new FerryError((r.code ?? 'ERR_FERRY_NOTIFY_FAILED') as FerryErrorCode, r.message ?? 'notification not delivered')
  }

  /**
   * The notifications that arrive, as an async iterator (`for await (const n of
   * engine.notifications({ signal }))`). It ends when the engine closes; an abort rejects
   * with an AbortError. While a consumer lags, notifications wait in the engine's bounded
   * queue (`notifyQueueSize`), where overflow is dropped and counted — never in JS memory.
   */
  notifications(options: { signal?: AbortSignal } = {}): AsyncIterableIterator<Notification> {
    const o = checkOptions('notifications', options, ['signal'])
    const signal = checkSignal(o.signal)
    const queue = new NotificationQueue(this.#queueSize, () => this.#drainNotifications())
    if (signal?.aborted) queue.abort(signal.reason)
    else {
      const onAbort = () => queue.abort(signal?.reason)
      signal?.addEventListener('abort', onAbort, { once: true })
      queue.onEnd = () => {
        signal?.removeEventListener('abort', onAbort)
        this.#inboxes.delete(queue)
      }
      this.#inboxes.add(queue)
      process.nextTick(() => this.#drainNotifications())
    }
    return queue
  }

  /**
   * Takes waiting notifications to listeners and iterators, while someone listens and every
   * iterator has room; otherwise they stay in the engine's bounded queue.
   */
  #drainNotifications(): void {
    if (this.closed) return
    for (;;) {
      if (this.listenerCount('notification') === 0 && this.#inboxes.size === 0) return
      let room = 256
      for (const q of this.#inboxes) room = Math.min(room, q.room())
      if (room <= 0) return
      const batch = this.#native.takeNotifications(room)
      if (batch.length === 0) return
      for (const raw of batch) {
        const n: Notification = { from: raw.from, engineId: raw.engineId, data: raw.data, bytes: raw.bytes }
        super.emit('notification', n)
        for (const q of this.#inboxes) q.push(n)
      }
    }
  }

  /** Starts `threads` native benchmark workers on this engine (tebench's runner). */
  bench(threads: number): Bench {
    checkNumber('threads', threads, false)
    return new Bench(call(() => new native.NativeBench(this.#native, threads)))
  }

  /** Engine counters (see README, "Metrics"). */
  metrics(): EngineMetrics {
    const m = this.native((n) => n.metrics())
    return {
      ...m,
      bytes: m.bytes.map((b) => ({ transport: b.transport, op: b.op, bytes: b.bytes })),
      transfers: { completed: 0, failed: 0, timeout: 0, canceled: 0, invalid: 0, ...m.transfers },
    }
  }

  /** Engine counters in the Prometheus text exposition format (for a `/metrics` endpoint). */
  metricsText(): string {
    return this.native((n) => n.metricsText())
  }

  /**
   * Closes the engine: pending work rejects with ERR_FERRY_CLOSED, threads stop, memory is
   * released. Idempotent.
   */
  /** `await using engine = await Engine.create()` closes the engine at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close()
  }

  close(): Promise<void> {
    if (!this.#closing) {
      // Synchronous underneath: calls made after close() returns already see ERR_FERRY_CLOSED.
      this.#native.close()
      for (const q of this.#inboxes) q.end()
      this.removeAllListeners()
      this.#closing = Promise.resolve()
    }
    return this.#closing
  }
}

/** One `notifications()` iterator: what was taken for it and not yet consumed (bounded). */
class NotificationQueue implements AsyncIterableIterator<Notification> {
  readonly #items: Notification[] = []
  readonly #waiting: Array<{ resolve: (r: IteratorResult<Notification>) => void; reject: (e: unknown) => void }> = []
  #done = false
  #error: unknown
  onEnd?: () => void

  constructor(
    private readonly capacity: number,
    private readonly pull: () => void,
  ) {}

  /** How many more it may hold. */
  room(): number {
    return this.capacity - this.#items.length
  }

  push(n: Notification): void {
    const w = this.#waiting.shift()
    if (w) w.resolve({ value: n, done: false })
    else this.#items.push(n)
  }

  end(): void {
    this.#finish(undefined)
  }

  abort(reason: unknown): void {
    this.#finish(new FerryError('ABORT_ERR', 'The operation was aborted', { cause: reason }))
  }

  #finish(error: unknown): void {
    if (this.#done) return
    this.#done = true
    this.#error = error
    this.onEnd?.()
    for (const w of this.#waiting.splice(0)) {
      if (error === undefined) w.resolve({ value: undefined, done: true })
      else w.reject(error)
    }
  }

  next(): Promise<IteratorResult<Notification>> {
    const n = this.#items.shift()
    if (n) {
      // Room again: what waits in the engine may come now.
      if (this.#items.length === this.capacity - 1) this.pull()
      return Promise.resolve({ value: n, done: false })
    }
    if (this.#done) {
      const error = this.#error
      this.#error = undefined
      return error === undefined ? Promise.resolve({ value: undefined, done: true }) : Promise.reject(error)
    }
    return new Promise((resolve, reject) => this.#waiting.push({ resolve, reject }))
  }

  return(): Promise<IteratorResult<Notification>> {
    this.end()
    return Promise.resolve({ value: undefined, done: true })
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Notification> {
    return this
  }
}
