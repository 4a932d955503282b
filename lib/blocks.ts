/**
 * Block lists: many blocks in one call as parallel typed arrays. Their types, the checks
 * that need JS objects (regions and segments of this engine, known keys), their form for
 * the binding, and their outcomes block by block.
 */
import type * as Native from './native'
import { checkOpcode, checkVerify, describe, invalid, transportNumber } from './checks'
import { abortError, codeName, failureError, FerryError, type FerryErrorCode } from './errors'
import type { NotifyData } from './notifications'
import { Region, type Owner } from './region'
import type { CallOptions } from './requests'
import { Segment } from './segment'
import type { TransferStatus, TransportName } from './status'
import { ERROR_CODE_NUMBERS, type OpcodeName } from './tables'

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
  /** Check every block's bytes end to end (CRC32C; see TransferRequest.verify). Default: the engine's `verify`. */
  verify?: boolean
  /**
   * Notify the blocks' segment (they must share one) once every block completed: one
   * notification for the whole list, `bytes` the list's total (see `notify` on `write`).
   */
  notify?: NotifyData
}

/** A block list submitted to a batch: the list and its opcode. */
export type BatchBlockList = BlockList & {
  /** What every block of the list does. */
  opcode: 'read' | 'write'
}

/** A block list through the Promise API. */
export type BlocksRequest = BlockList & CallOptions

/** A block that did not complete. */
export interface BlockFailure {
  /** Index of the block. */
  block: number
  /** Its status. */
  status: TransferStatus
  /** Why it did not complete: the failure's stable code. */
  code: FerryErrorCode
  /** The failure in words. */
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

const BLOCK_KEYS = new Set(['local', 'remote', 'remoteBuffer', 'localOffsets', 'remoteOffsets', 'lengths', 'transport', 'requireTransport', 'verify', 'notify'])

/** One handle, or a Float64Array of one per block, of `engine`'s regions or segments. */
function blockHandles(engine: Owner, what: string, v: unknown, kind: typeof Region | typeof Segment): number | Float64Array {
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

/**
 * The native arguments of a block list (the arrays themselves are checked natively;
 * transports by number).
 */
export function toNativeBlocks(engine: Owner, b: unknown, form: 'promise' | 'batch') {
  if (typeof b !== 'object' || b === null || Array.isArray(b)) throw invalid(`blocks must be an object, got ${describe(b)}`)
  const q = b as Record<string, unknown>
  for (const key in q) {
    const known = BLOCK_KEYS.has(key) || key === (form === 'promise' ? 'signal' : 'opcode')
    if (!known && q[key] !== undefined) throw invalid(`blocks has no field ${JSON.stringify(key)} (a typo?)`)
  }
  const transport = transportNumber('transport', q.transport)
  const requireTransport = transportNumber('requireTransport', q.requireTransport)
  const rb = q.remoteBuffer
  const list: Native.NativeBlockList = {
    local: blockHandles(engine, 'local', q.local, Region),
    remote: blockHandles(engine, 'remote', q.remote, Segment),
    remoteBuffer: Array.isArray(rb) ? Float64Array.from(rb, (x) => (typeof x === 'number' ? x : NaN)) : (rb as number | undefined),
    localOffsets: q.localOffsets as Float64Array,
    remoteOffsets: q.remoteOffsets as Float64Array,
    lengths: q.lengths as number,
    transport,
    requireTransport,
    verify: checkVerify('verify', q.verify),
  }
  return list
}

/** The per-block failures of an outcome (one entry per block of each failed request). */
function blockFailures(runs: Native.FailedBlocks[]): BlockFailure[] {
  const failed: BlockFailure[] = []
  for (const r of runs) {
    for (let b = r.first; b < r.first + r.count; b++) {
      failed.push({ block: b, status: r.status, code: codeName(r.error.code), message: r.error.message })
    }
  }
  return failed
}

/** The opcode of a block list submitted to a batch. */
export function blockOpcode(blocks: unknown): OpcodeName {
  return checkOpcode('blocks: opcode', (blocks as { opcode?: unknown }).opcode)
}

/** What `submitBlocks` returns for the binding's task starts. */
export function toSubmission(firstTask: number, starts: Uint32Array): BlockSubmission {
  return { firstTask, tasks: starts.length - 1, blocks: starts[starts.length - 1], starts }
}

/**
 * The outcome of `readBlocks`/`writeBlocks`: blocks that failed are reported, not thrown;
 * an abort that canceled blocks throws an AbortError, and a notification not delivered
 * after every block completed throws its error.
 */
export function blocksOutcome(raw: Native.BlocksOutcome, requests: number, signal: AbortSignal | undefined): BlocksResult {
  if (raw.failed.length === 0) {
    const e = raw.notifyError
    if (e) throw failureError(e.error, ['ERR_FERRY_NOTIFY_FAILED', 'notification not delivered'])
    return { status: raw.status, requests, failed: [] }
  }
  if (signal?.aborted && raw.failed.some((r) => r.error.code === ERROR_CODE_NUMBERS.ERR_FERRY_CANCELED)) {
    throw abortError(signal.reason)
  }
  return { status: raw.status, requests, failed: blockFailures(raw.failed) }
}
