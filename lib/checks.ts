/**
 * Checks of the arguments JS passes, before any native call: each refusal is an
 * `ERR_FERRY_INVALID_ARGUMENT` that names the argument and what it got.
 */
import { FerryError } from './errors'
import { OPCODE_NUMBERS, TRANSPORT_NUMBERS, type OpcodeName, type TransportName } from './tables'

/** The error of a refused argument: `ERR_FERRY_INVALID_ARGUMENT` with `message`. */
export function invalid(message: string): FerryError {
  return new FerryError('ERR_FERRY_INVALID_ARGUMENT', message)
}

/** What a value is, for messages. */
export function describe(v: unknown): string {
  if (v === null) return 'null'
  if (Array.isArray(v)) return 'an array'
  const t = typeof v
  return t === 'object' ? 'an object' : t === 'undefined' ? 'undefined' : `a ${t}`
}

/** A table's names for a message: `'tcp', 'shm' or 'rdma'`. */
function oneOf(table: object): string {
  const names = Object.keys(table).map((n) => `'${n}'`)
  return names.length > 1 ? `${names.slice(0, -1).join(', ')} or ${names[names.length - 1]}` : names.join('')
}

/** What a value that should have been a name was, for messages. */
function got(v: unknown): string {
  return typeof v === 'string' ? JSON.stringify(v) : describe(v)
}

/** A number (its range is the binding's to check), or nothing where `optional`. */
export function checkNumber(what: string, v: unknown, optional: boolean): void {
  if (v === undefined && optional) return
  if (typeof v !== 'number') throw invalid(`${what} must be a non-negative integer, got ${describe(v)}`)
}

/** An opcode by name: `read` or `write` (the core's table). */
/** An optional `verify` flag: a boolean or absent. */
export function checkVerify(what: string, v: unknown): boolean | undefined {
  if (v !== undefined && typeof v !== 'boolean') throw invalid(`${what} must be a boolean, got ${describe(v)}`)
  return v as boolean | undefined
}

export function checkOpcode(what: string, v: unknown): OpcodeName {
  if (typeof v === 'string' && Object.hasOwn(OPCODE_NUMBERS, v)) return v as OpcodeName
  throw invalid(`${what} must be ${oneOf(OPCODE_NUMBERS)}, got ${got(v)}`)
}

/** The number the binding takes for an optional transport name (the core's table). */
export function transportNumber(what: string, v: unknown): number | undefined {
  if (v === undefined) return undefined
  if (typeof v === 'string' && Object.hasOwn(TRANSPORT_NUMBERS, v)) return TRANSPORT_NUMBERS[v as TransportName]
  throw invalid(`${what} must be ${oneOf(TRANSPORT_NUMBERS)}, got ${got(v)}`)
}

/** Checks an options object of `transfer`/`submitTransfer` against the keys it may have. */
export function checkOptions(what: string, options: unknown, keys: string[]): Record<string, unknown> {
  if (typeof options !== 'object' || options === null) throw invalid(`${what} options must be an object, got ${describe(options)}`)
  const o = options as Record<string, unknown>
  for (const key of Object.keys(o)) {
    if (!keys.includes(key) && o[key] !== undefined) throw invalid(`${what} has no option ${JSON.stringify(key)}`)
  }
  return o
}

/** Bytes: a Uint8Array (a Buffer is one). */
export function checkBytes(what: string, v: unknown): void {
  if (!(v instanceof Uint8Array)) throw invalid(`${what} must be a Uint8Array, got ${describe(v)}`)
}

/** A call's `signal`: an AbortSignal, or nothing. */
export function checkSignal(signal: unknown): AbortSignal | undefined {
  if (signal === undefined) return undefined
  if (!(signal instanceof AbortSignal)) throw invalid(`signal must be an AbortSignal, got ${describe(signal)}`)
  return signal
}
