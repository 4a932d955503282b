/** Local memory registered with an engine, and the views over it. */
import { constants as bufferConstants } from 'node:buffer'
import { describe, invalid } from './checks'
import './dispose'
// A type only (the region's owner); engine.ts imports this module, not the reverse.
import type { Engine } from './engine'
import { FerryError } from './errors'

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

  /**
   * `using region = engine.allocate(n)` releases the region at the end of the scope: as
   * `release()`, except that a region already released, or of a closed engine, is left
   * as it is.
   */
  [Symbol.dispose](): void {
    if (!this.#released && !this.engine.closed) this.release()
  }

  /** `await using region = …`: as `[Symbol.dispose]()`. */
  [Symbol.asyncDispose](): Promise<void> {
    this[Symbol.dispose]()
    return Promise.resolve()
  }
}

/** The engine of a region or segment, as the modules below engine.ts name it. */
export type Owner = Region['engine']

/**
 * Checks `registerMemory`'s arguments (user memory: a view over a SharedArrayBuffer, checked
 * natively; options with `readOnly` only) and returns whether it is registered read-only.
 */
export function registerOptions(memory: unknown, options: unknown): boolean {
  if (!ArrayBuffer.isView(memory)) {
    throw invalid(`registerMemory takes a TypedArray, DataView or Buffer over a SharedArrayBuffer, got ${describe(memory)}`)
  }
  if (typeof options !== 'object' || options === null) throw invalid(`registerMemory options must be an object, got ${describe(options)}`)
  const o = options as Record<string, unknown>
  for (const key of Object.keys(o)) {
    if (key !== 'readOnly' && o[key] !== undefined) throw invalid(`registerMemory has no option ${JSON.stringify(key)}`)
  }
  if (o.readOnly !== undefined && typeof o.readOnly !== 'boolean') {
    throw invalid(`registerMemory: readOnly must be a boolean, got ${describe(o.readOnly)}`)
  }
  return (o.readOnly as boolean | undefined) ?? false
}
