/**
 * Ferry's errors: the stable codes, `FerryError`, and how the binding's errors (its own,
 * napi's type errors, the start task's) become FerryErrors.
 */
import type { TaskStatus, TransferStatus, TransportName } from './status'

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

/** The `AbortError` of an aborted call (`cause`: the signal's reason). */
export function abortError(cause: unknown, tasks?: TaskStatus[]): FerryError {
  return new FerryError('ABORT_ERR', 'The operation was aborted', { cause, tasks })
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

/** Runs a native call, turning its errors into FerryErrors. */
export function call<T>(fn: () => T): T {
  try {
    return fn()
  } catch (err) {
    rethrow(err)
  }
}

/** The start task's errors carry `CODE\u0000message` (a task cannot set `code`). */
export function startError(err: unknown): unknown {
  const message = (err as { message?: unknown })?.message
  if (typeof message === 'string') {
    const cut = message.indexOf('\u0000')
    if (cut > 0 && message.startsWith('ERR_FERRY_')) {
      return new FerryError(message.slice(0, cut) as FerryErrorCode, message.slice(cut + 1))
    }
  }
  return err
}
