/**
 * Transfer requests: their types, their checks that need JS objects (a `Region` and a
 * `Segment` of this engine, numbers, known keys), their form for the binding, and a call's
 * result from its tasks' statuses.
 */
import type * as Native from './native'
import { checkNumber, checkOpcode, checkVerify, describe, invalid, transportNumber } from './checks'
import { abortError, failureError, FerryError, type FerryErrorCode } from './errors'
import type { NotifyOptions } from './notifications'
import { Region, type Owner } from './region'
import { Segment } from './segment'
import { TransferStatus, type TaskStatus, type TransportName } from './status'
import { OPCODE_NUMBERS, type OpcodeName } from './tables'

/** One transfer. */
export interface TransferRequest {
  /** `read` moves the remote bytes into `local`; `write` moves `local`'s bytes to the remote buffer. */
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
  /**
   * Check the bytes end to end: a CRC32C taken at the source and checked at the destination
   * (tcp, shm; not rdma yet); a mismatch fails the request with ERR_FERRY_INTEGRITY, never retried. Default: the
   * engine's `verify` (false).
   */
  verify?: boolean
}

/** Options of the Promise calls. */
export interface CallOptions {
  /**
   * Aborts the transfer; the Promise rejects with an `AbortError` (code `ABORT_ERR`) once
   * nothing of it can land any more (over tcp: once the target answered what was sent).
   */
  signal?: AbortSignal
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
  'verify',
  'signal',
  'notify',
])

/**
 * One request as the binding takes it: every field's type checked, handles of `engine`,
 * opcode and transports by number.
 */
export function toNativeRequest(engine: Owner, r: unknown, i: number, opcode?: OpcodeName): Native.TransferRequest {
  const at = `request ${i}`
  if (typeof r !== 'object' || r === null || Array.isArray(r)) throw invalid(`${at} must be an object, got ${describe(r)}`)
  const q = r as Record<string, unknown>
  for (const key of Object.keys(q)) {
    if (!REQUEST_KEYS.has(key) || ((key === 'signal' || key === 'notify') && opcode === undefined)) {
      if (q[key] !== undefined) throw invalid(`${at} has no field ${JSON.stringify(key)} (a typo?)`)
    }
  }
  const op = checkOpcode(`${at}: opcode`, opcode ?? q.opcode)
  if (!(q.local instanceof Region)) throw invalid(`${at}: local must be a Region, got ${describe(q.local)}`)
  if (!(q.remote instanceof Segment)) throw invalid(`${at}: remote must be a Segment, got ${describe(q.remote)}`)
  if (q.local.engine !== engine) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', `${at}: local is a Region of another engine`)
  if (q.remote.engine !== engine) throw new FerryError('ERR_FERRY_FOREIGN_HANDLE', `${at}: remote is a Segment of another engine`)
  checkNumber(`${at}: localOffset`, q.localOffset, true)
  checkNumber(`${at}: remoteBuffer`, q.remoteBuffer, true)
  checkNumber(`${at}: remoteOffset`, q.remoteOffset, true)
  checkNumber(`${at}: length`, q.length, false)
  const transport = transportNumber(`${at}: transport`, q.transport)
  const requireTransport = transportNumber(`${at}: requireTransport`, q.requireTransport)
  const verify = checkVerify(`${at}: verify`, q.verify)
  return {
    opcode: OPCODE_NUMBERS[op],
    local: q.local.handle,
    localOffset: q.localOffset as number | undefined,
    segment: q.remote.handle,
    remoteBuffer: q.remoteBuffer as number | undefined,
    remoteOffset: q.remoteOffset as number | undefined,
    length: q.length as number,
    // What the two mean together is decided once, in the core (`TransportHint`).
    transport,
    requireTransport,
    verify,
  }
}

/** A call's requests, checked one by one (at least one), in the binding's form. */
export function toNativeRequests(engine: Owner, requests: unknown): Native.TransferRequest[] {
  if (!Array.isArray(requests)) throw invalid(`requests must be an array, got ${describe(requests)}`)
  if (requests.length === 0) throw invalid('no requests given')
  return requests.map((r, i) => toNativeRequest(engine, r, i))
}

/**
 * A call's result from its tasks' statuses, or the error of the first that failed (a
 * FerryError whose `tasks` holds every task's status); `notifyError`: its notification was
 * not delivered.
 */
export function transferOutcome(tasks: TaskStatus[], signal: AbortSignal | undefined, notifyError: Native.NotifyResult | undefined): TransferResult {
  const failed = tasks.find((t) => t.status !== TransferStatus.COMPLETED)
  if (!failed && notifyError) {
    throw failureError(notifyError.error, ['ERR_FERRY_NOTIFY_FAILED', 'notification not delivered'], { tasks })
  }
  if (!failed) {
    return { bytes: tasks.reduce((a, t) => a + t.transferredBytes, 0), tasks }
  }
  if (signal?.aborted && failed.code === 'ERR_FERRY_CANCELED') {
    throw abortError(signal.reason, tasks)
  }
  throw new FerryError((failed.code ?? 'ERR_FERRY_TRANSFER_FAILED') as FerryErrorCode, failed.message ?? `transfer ${failed.name}`, {
    status: failed.status,
    transport: failed.transport,
    attempts: failed.attempts,
    lossReason: failed.lossReason,
    tasks,
  })
}
