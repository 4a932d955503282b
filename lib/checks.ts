/**
 * Checks of the arguments JS passes, before any native call: each refusal is an
 * `ERR_FERRY_INVALID_ARGUMENT` that names the argument and what it got.
 */
import { FerryError } from './errors'

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

const TRANSPORTS = new Set(['tcp', 'shm', 'rdma'])

export function checkNumber(what: string, v: unknown, optional: boolean): void {
  if (v === undefined && optional) return
  if (typeof v !== 'number') throw invalid(`${what} must be a non-negative integer, got ${describe(v)}`)
}

export function checkTransport(what: string, v: unknown): void {
  if (v === undefined) return
  if (typeof v !== 'string' || !TRANSPORTS.has(v)) throw invalid(`${what} must be 'tcp', 'shm' or 'rdma', got ${typeof v === 'string' ? JSON.stringify(v) : describe(v)}`)
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

export function checkBytes(what: string, v: unknown): void {
  if (!(v instanceof Uint8Array)) throw invalid(`${what} must be a Uint8Array, got ${describe(v)}`)
}

export function checkSignal(signal: unknown): AbortSignal | undefined {
  if (signal === undefined) return undefined
  if (!(signal instanceof AbortSignal)) throw invalid(`signal must be an AbortSignal, got ${describe(signal)}`)
  return signal
}
