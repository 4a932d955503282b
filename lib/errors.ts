/**
 * Ferry's errors: the stable codes (the core's table, `tables.ts`), `FerryError`, and how
 * the binding's errors (thrown with `code` set, napi's type errors, failures it reports
 * as values with a numeric code) become FerryErrors. No error is recognized by its message.
 */
import type * as Native from './native'
import type { TaskStatus, TransferStatus, TransportName } from './status'
import { ERROR_CODE_NAMES, ERROR_CODE_NUMBERS, LOSS_REASON_NAMES, type FerryErrorCode, type LossReasonName } from './tables'

export type { FerryErrorCode } from './tables'

/**
 * An error from Ferry. `code` is stable; transfer failures also carry the task statuses, and
 * an `ERR_FERRY_PEER_LOST` failure why the peer was lost (`lossReason`: `'restarted'` for
 * work planned against an incarnation of the peer that is gone).
 */
export class FerryError extends Error {
  /** The stable code (docs/errors.md lists them); `ABORT_ERR` for an aborted call. */
  readonly code: FerryErrorCode
  /** A failed transfer's final status. */
  readonly status?: TransferStatus
  /** The transport of a failed transfer's last attempt. */
  readonly transport?: TransportName
  /** Attempts the failed task made. */
  readonly attempts?: number
  /** Every task's status, for a call of several tasks. */
  readonly tasks?: TaskStatus[]
  /** Why the peer was lost, for `ERR_FERRY_PEER_LOST`. */
  readonly lossReason?: LossReasonName

  /** Makes an error with `code`, `message` and what a transfer failure carries besides. */
  constructor(
    code: FerryErrorCode,
    message: string,
    extra: {
      status?: TransferStatus
      transport?: TransportName
      attempts?: number
      tasks?: TaskStatus[]
      lossReason?: LossReasonName
      cause?: unknown
    } = {},
  ) {
    super(message, extra.cause === undefined ? undefined : { cause: extra.cause })
    this.name = code === 'ABORT_ERR' ? 'AbortError' : 'FerryError'
    this.code = code
    this.status = extra.status
    this.transport = extra.transport
    this.attempts = extra.attempts
    this.tasks = extra.tasks
    this.lossReason = extra.lossReason
  }
}

/** The `AbortError` of an aborted call (`cause`: the signal's reason). */
export function abortError(cause: unknown, tasks?: TaskStatus[]): FerryError {
  return new FerryError('ABORT_ERR', 'The operation was aborted', { cause, tasks })
}

/** What a FerryError carries besides its code and message. */
export type FerryErrorExtra = ConstructorParameters<typeof FerryError>[2]

/** The name of an error code's number (`ERR_FERRY_INTERNAL` for one the core does not know). */
export function codeName(code: number): FerryErrorCode {
  return ERROR_CODE_NAMES[code] ?? 'ERR_FERRY_INTERNAL'
}

/**
 * The FerryError of a failure the binding reported as a value (`FailureJs`: its code by
 * number), or of `fallback` when it reported none.
 */
export function failureError(f: Native.FailureJs | null | undefined, fallback: [FerryErrorCode, string], extra?: FerryErrorExtra): FerryError {
  if (!f) return new FerryError(fallback[0], fallback[1], extra)
  const lossReason = f.lossReason == null ? undefined : LOSS_REASON_NAMES[f.lossReason]
  return new FerryError(codeName(f.code), f.message, lossReason ? { ...extra, lossReason } : extra)
}

/** napi's own statuses for a value of the wrong type (a safety net: the binding names fields itself). */
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
  // The binding's own errors: napi set `code` to the name of one of the core's codes.
  if (e && typeof e.code === 'string' && Object.hasOwn(ERROR_CODE_NUMBERS, e.code)) {
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

/** Runs a native call, turning its errors into FerryErrors. */
export function call<T>(fn: () => T): T {
  try {
    return fn()
  } catch (err) {
    rethrow(err)
  }
}
