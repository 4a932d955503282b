/**
 * Ferry: a data transfer engine for Node.js clusters.
 *
 * A process registers memory; another reads or writes it by segment name and offset.
 * This module wraps the native binding with Node conventions: Promises, AbortSignal,
 * events, and errors that carry a stable `code`.
 */
import { EventEmitter } from 'node:events'
import * as fs from 'node:fs'
import * as path from 'node:path'
import type * as Native from './binding'

function loadNative(): typeof Native {
  // index.ts runs from the package root (tests) or from dist/ (compiled).
  for (const dir of [__dirname, path.join(__dirname, '..')]) {
    const file = path.join(dir, 'binding.cjs')
    if (fs.existsSync(file)) {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      return require(file) as typeof Native
    }
  }
  throw new Error('ferry-engine: native binding not found; run `npm install` in the package')
}

const native = loadNative()

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
  | 'ABORT_ERR'
  | string

/** Status of one task: what happened, which transport served it, how many attempts. */
export interface TaskStatus {
  status: TransferStatus
  name: string
  transferredBytes: number
  length: number
  transport?: TransportName
  attempts: number
  code?: string
  message?: string
}

/** Aggregate status of a batch. */
export interface BatchStatus {
  status: TransferStatus
  name: string
  transferredBytes: number
  tasks: number
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

function rethrow(err: unknown): never {
  if (err instanceof FerryError) throw err
  const e = err as { code?: unknown; message?: unknown }
  if (e && typeof e.code === 'string' && e.code.startsWith('ERR_FERRY_')) {
    throw new FerryError(e.code, String(e.message))
  }
  if (err instanceof TypeError || err instanceof RangeError) {
    throw new FerryError('ERR_FERRY_INVALID_ARGUMENT', err.message, { cause: err })
  }
  throw err
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

function toTaskStatus(s: Native.TaskStatus): TaskStatus {
  return {
    status: s.status as TransferStatus,
    name: s.name,
    transferredBytes: s.transferredBytes,
    length: s.length,
    transport: s.transport as TransportName | undefined,
    attempts: s.attempts,
    code: s.code ?? undefined,
    message: s.message ?? undefined,
  }
}

/** Engine settings. Every field is optional. */
export interface EngineOptions {
  /** Listen address for control and data, `host:port`. Default `127.0.0.1:0` (loopback only). */
  listen?: string
  /** A silent peer is declared lost after this many ms; its in-flight work fails. Default 3000. */
  peerTimeoutMs?: number
  /** I/O threads. Default 2. */
  ioThreads?: number
  /**
   * Enabled transports. Default `['shm', 'rdma', 'tcp']`: rdma is disabled (one log line
   * with `FERRY_LOG=info`) where libibverbs or an RDMA device is missing.
   */
  transports?: TransportName[]
  /** RDMA settings. */
  rdma?: RdmaOptions
  /** Overrides the machine identity used to detect same-host peers (tests). */
  machineId?: string
  /**
   * The address peers reach this engine at, `host` or `host:port` (the bound port when
   * none is given): the segment name in p2p mode and the address published in etcd. Set it
   * when listening on `0.0.0.0`. Default: the bound address.
   */
  advertise?: string
  /** TCP data connections per peer. Default 2. */
  connectionsPerPeer?: number
  /** Requests larger than this are sliced (bytes). Default 1 MiB. */
  sliceSize?: number
  /** Connect timeout in ms. Default 3000. */
  connectTimeoutMs?: number
  /**
   * Metadata service. `'p2p'` (default, embedded): segment names are `host:port`.
   * `'etcd://host:port[,host:port]'` (clusters): the engine publishes itself in etcd under
   * `segmentName`, bound to a lease it keeps alive, and `openSegment` looks names up there;
   * a peer whose lease expires is reported lost. Creation fails with `ERR_FERRY_METADATA`
   * when etcd does not answer within `connectTimeoutMs`.
   */
  metadata?: 'p2p' | `etcd://${string}`
  /** With etcd: key prefix of the segment records. Default `'/ferry/segments/'`. */
  metadataPrefix?: string
  /** With etcd: the logical name this engine is published under. Default its `host:port`. */
  segmentName?: string
  /**
   * With etcd: lease TTL of this engine's record in ms (whole seconds, >= 1000). Peers see
   * this engine lost at most about this long after it stops answering. Default 5000.
   */
  leaseTtlMs?: number
  /** Transport switches allowed per task; 0 disables failover, 1 allows one. Default 3. */
  maxFailoverAttempts?: number
  /** Whether polled (batch) tasks fail over; the Promise calls always do. Default true. */
  enableAutoFailoverOnPoll?: boolean
  /** Deadline of one attempt in ms; a late attempt fails over. 0 = none. Default 10000. */
  attemptTimeoutMs?: number
  /** Fault injection (tests, benchmarks): per transport. */
  faults?: FaultOptions[]
}

/** RDMA transport settings. Every field is optional. */
export interface RdmaOptions {
  /**
   * `'ibverbs'` (real NICs, libibverbs loaded at run time) or `'emulated'` (a software
   * verbs device for tests on machines without NICs). Default: `FERRY_RDMA_PROVIDER`, else
   * `'ibverbs'`. The emulated device is never chosen silently.
   */
  provider?: 'ibverbs' | 'emulated'
  /** Devices that may be used (e.g. `['mlx5_0']`). Default: every device with an active port. */
  devices?: string[]
  /** GID index. Default: chosen automatically (RoCE v2 with an IPv4 address first). */
  gidIndex?: number
  /** Port number. Default 1. */
  port?: number
  /** Queue pairs per peer; slices are spread over them (and over devices). Default 2. */
  qpsPerPeer?: number
  /** Bytes per RDMA work request. Default 65536. */
  sliceSize?: number
  /** Work requests outstanding per queue pair. Default 64. */
  maxOutstanding?: number
  /** A slice not completed within this resets its endpoint and fails over. Default 5000. */
  sliceTimeoutMs?: number
  /**
   * Faults of the emulated device, e.g. `'silent_loss=0.1,retry_exceeded=0.05,remote_access=0,delay_ms=5,seed=7'`.
   * Default: `FERRY_RDMA_EMULATED_FAULTS`, else none.
   */
  emulatedFaults?: string
}

/** Fault injection on one transport (seeded, reproducible). */
export interface FaultOptions {
  transport: TransportName
  /** Probability that submitting a request fails. */
  submitFailureRate?: number
  /** Every submission after this many fails. */
  failAfterSubmits?: number
  /** Probability that a completed attempt is reported FAILED. */
  corruptCompletionRate?: number
  /** Delay before each submission, in ms. */
  delayMs?: number
  /** The transport fails to install. */
  failInstall?: boolean
  /** Seed of the random choices. */
  seed?: number
}

/** Local memory registered with an engine. `buffer` views it. */
export class Region {
  #released = false
  constructor(
    private readonly engine: Engine,
    /** Region id in its engine. */
    readonly id: number,
    /** The bytes. For engine-owned regions, a Buffer over engine memory. */
    readonly buffer: Buffer,
  ) {}

  /** Length in bytes. */
  get length(): number {
    return this.buffer.length
  }

  /** Whether `release()` was called. */
  get released(): boolean {
    return this.#released
  }

  /** Releases the region. Transfers still in flight finish first; the Buffer stays valid. */
  release(): void {
    this.engine.native((n) => n.release(this.id))
    this.#released = true
  }
}

/** A buffer a remote segment exposes. */
export interface RemoteBuffer {
  id: number
  length: number
  access: 'read-only' | 'read-write'
  transports: TransportName[]
}

/** An opened remote segment. */
export class Segment {
  constructor(
    /** Handle used in requests. */
    readonly handle: number,
    /** Segment name (`host:port`). */
    readonly name: string,
    /** The peer engine's id. */
    readonly engineId: string,
    /** Buffers the peer exposes (as of the last open). */
    readonly buffers: RemoteBuffer[],
  ) {}
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

/** A read or write through the Promise API. */
export type IoRequest = Omit<TransferRequest, 'opcode'> & CallOptions

/** Outcome of a completed transfer. */
export interface TransferResult {
  /** Bytes moved. */
  bytes: number
  /** Per-task statuses (transport and attempts included). */
  tasks: TaskStatus[]
}

/** Bytes of completed transfers over one transport for one operation. */
export interface BytesByTransport {
  transport: TransportName
  op: 'read' | 'write'
  bytes: number
}

/** Engine counters (see README, "Metrics"). Counted in the core with atomics. */
export interface EngineMetrics {
  tasksSubmitted: number
  tasksCompleted: number
  tasksFailed: number
  bytesTransferred: number
  /** Bytes of completed transfers, by transport and op (every combination, zeros too). */
  bytes: BytesByTransport[]
  /** Transfers that ended, by final status: completed, failed, timeout, canceled, invalid. */
  transfers: Record<'completed' | 'failed' | 'timeout' | 'canceled' | 'invalid', number>
  /** Transfers submitted and not yet ended. */
  inflight: number
  peersLost: number
  peersRecovered: number
  failovers: number
  attemptTimeouts: number
  /** Times the rail monitor took a (peer, transport) path out of use. */
  transportsDisabled: number
  segmentsOpen: number
  regions: number
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

/** Event name → payload. */
export interface EngineEvents {
  peerLost: PeerLostEvent
  peerRecovered: PeerRecoveredEvent
  failover: FailoverEvent
  transportDisabled: TransportDisabledEvent
}

/** Any engine event. */
export type EngineEvent = EngineEvents[keyof EngineEvents]

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

function toNativeRequest(r: TransferRequest): Native.TransferRequest {
  if (!(r.local instanceof Region)) {
    throw new FerryError('ERR_FERRY_INVALID_ARGUMENT', 'request.local must be a Region')
  }
  if (!(r.remote instanceof Segment)) {
    throw new FerryError('ERR_FERRY_INVALID_ARGUMENT', 'request.remote must be a Segment')
  }
  if (r.requireTransport !== undefined && r.transport !== undefined && r.transport !== r.requireTransport) {
    throw new FerryError('ERR_FERRY_INVALID_ARGUMENT', 'transport and requireTransport name different transports')
  }
  return {
    opcode: r.opcode,
    local: r.local.id,
    localOffset: r.localOffset,
    segment: r.remote.handle,
    remoteBuffer: r.remoteBuffer,
    remoteOffset: r.remoteOffset,
    length: r.length,
    transport: r.requireTransport ?? r.transport,
    requireTransport: r.requireTransport !== undefined,
  }
}

/** One tebench case for the native workers. */
export interface BenchCase {
  opcode: 'read' | 'write'
  /** Bytes per request. */
  blockSize: number
  /** Requests per batch. */
  batchSize: number
  local: Region
  remote: Segment
  remoteBuffer: number
  /** Worker i works on [stripeBase + i·stripeLen, … + stripeLen) of both buffers. */
  stripeBase: number
  stripeLen: number
  /** Further targets: worker i works against target i % (1 + extraTargets.length). */
  extraTargets?: Array<{ remote: Segment; remoteBuffer: number }>
  transport?: TransportName
  durationMs: number
  warmupMs: number
  requestIntervalUs: number
}

/** tebench's columns for one case. */
export type BenchRow = Native.BenchRow
/** Why a case failed: status, transport, peer and request. */
export type BenchFailure = Native.BenchFailure
/** A case's outcome. */
export type BenchResult = Native.BenchResult

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
  runCase(c: BenchCase): Promise<BenchResult> {
    const { local, remote, extraTargets, ...rest } = c
    return call(() =>
      this.#native.runCase({
        ...rest,
        local: local.id,
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

  private constructor(n: Native.NativeEngine) {
    super()
    this.#native = n
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
      super.emit(event.kind, event)
    })
  }

  /**
   * Starts an engine. Binding, starting threads and registering in etcd happen off the JS
   * thread, so a slow or unreachable etcd never blocks the event loop.
   */
  static async create(options: EngineOptions = {}): Promise<Engine> {
    const started = call(() => native.startEngine(options))
    try {
      return new Engine(await started)
    } catch (err) {
      throw startError(err)
    }
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

  /** Allocates `bytes` of engine-owned, page-aligned, zeroed memory. */
  allocate(bytes: number): Region {
    const id = this.native((n) => n.allocate(bytes))
    return new Region(this, id, this.native((n) => n.regionBuffer(id)))
  }

  /** Registers a user Buffer (held until released). */
  registerMemory(buffer: Buffer, options: { readOnly?: boolean } = {}): Region {
    if (!Buffer.isBuffer(buffer)) {
      throw new FerryError('ERR_FERRY_INVALID_ARGUMENT', 'registerMemory takes a Buffer')
    }
    const id = this.native((n) => n.registerMemory(buffer, options.readOnly ?? false))
    return new Region(this, id, buffer)
  }

  /** Opens (or refreshes) a peer's segment by name (`host:port`). */
  async openSegment(name: string): Promise<Segment> {
    if (typeof name !== 'string') {
      throw new FerryError('ERR_FERRY_INVALID_ARGUMENT', 'segment name must be a string')
    }
    const r = await this.native((n) => n.openSegment(name))
    if (!r.segment) throw new FerryError(r.code ?? 'ERR_FERRY_CONNECT', r.message ?? 'openSegment failed')
    const s = r.segment
    return new Segment(
      s.handle,
      s.name,
      s.engineId,
      s.buffers.map((b) => ({
        id: b.id,
        length: b.length,
        access: b.access as RemoteBuffer['access'],
        transports: b.transports as TransportName[],
      })),
    )
  }

  /** Closes a segment; its in-flight work fails. */
  closeSegment(segment: Segment): void {
    this.native((n) => n.closeSegment(segment.handle))
  }

  /** Allocates a batch for up to `capacity` tasks (TENT's batch API). */
  allocateBatch(capacity: number): number {
    return this.native((n) => n.allocateBatch(capacity))
  }

  /** Validates and submits requests as tasks of `batch`; returns the first task's index. */
  submitTransfer(batch: number, requests: TransferRequest[]): number {
    const list = call(() => requests.map(toNativeRequest))
    return this.native((n) => n.submitTransfer(batch, list))
  }

  /** Status of one task. */
  getTransferStatus(batch: number, task: number): TaskStatus {
    return toTaskStatus(this.native((n) => n.getTransferStatus(batch, task)))
  }

  /** Status of every task of a batch. */
  getTransferStatusList(batch: number): TaskStatus[] {
    return this.native((n) => n.getTransferStatusList(batch)).map(toTaskStatus)
  }

  /** Aggregate status of a batch. */
  getBatchStatus(batch: number): BatchStatus {
    const s = this.native((n) => n.getBatchStatus(batch))
    return { status: s.status as TransferStatus, name: s.name, transferredBytes: s.transferredBytes, tasks: s.tasks }
  }

  /** Frees a batch; tasks still pending are canceled. */
  freeBatch(batch: number): void {
    this.native((n) => n.freeBatch(batch))
  }

  /** Reads remote bytes into local memory. */
  read(request: IoRequest): Promise<TransferResult> {
    const { signal, ...rest } = request
    return this.transfer([{ ...rest, opcode: 'read' }], { signal })
  }

  /** Writes local bytes into remote memory. */
  write(request: IoRequest): Promise<TransferResult> {
    const { signal, ...rest } = request
    return this.transfer([{ ...rest, opcode: 'write' }], { signal })
  }

  /**
   * Runs several requests; resolves when all completed, rejects with the first failure
   * (a FerryError whose `tasks` holds every task's status).
   */
  async transfer(requests: TransferRequest[], options: CallOptions = {}): Promise<TransferResult> {
    const { signal } = options
    if (signal?.aborted) {
      throw new FerryError('ABORT_ERR', 'The operation was aborted', { cause: signal.reason })
    }
    const list = call(() => requests.map(toNativeRequest))
    const { op, promise } = this.native((n) => n.transfer(list))
    const onAbort = () => {
      this.#native.cancel(op)
    }
    signal?.addEventListener('abort', onAbort, { once: true })
    let raw: Native.TaskStatus[]
    try {
      raw = await promise
    } finally {
      signal?.removeEventListener('abort', onAbort)
    }
    const tasks = raw.map(toTaskStatus)
    const failed = tasks.find((t) => t.status !== TransferStatus.COMPLETED)
    if (!failed) {
      return { bytes: tasks.reduce((a, t) => a + t.transferredBytes, 0), tasks }
    }
    if (signal?.aborted && failed.code === 'ERR_FERRY_CANCELED') {
      throw new FerryError('ABORT_ERR', 'The operation was aborted', { cause: signal.reason, tasks })
    }
    throw new FerryError(failed.code ?? 'ERR_FERRY_TRANSFER_FAILED', failed.message ?? `transfer ${failed.name}`, {
      status: failed.status,
      transport: failed.transport,
      attempts: failed.attempts,
      tasks,
    })
  }

  /** Starts `threads` native benchmark workers on this engine (tebench's runner). */
  bench(threads: number): Bench {
    return new Bench(call(() => new native.NativeBench(this.#native, threads)))
  }

  /** Engine counters (see README, "Metrics"). */
  metrics(): EngineMetrics {
    const m = this.native((n) => n.metrics())
    return {
      ...m,
      bytes: m.bytes.map((b) => ({ transport: b.transport as TransportName, op: b.op as 'read' | 'write', bytes: b.bytes })),
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
  close(): Promise<void> {
    if (!this.#closing) {
      // Synchronous underneath: calls made after close() returns already see ERR_FERRY_CLOSED.
      this.#native.close()
      this.removeAllListeners()
      this.#closing = Promise.resolve()
    }
    return this.#closing
  }
}
