/**
 * Tracing of transfers through `node:diagnostics_channel`, for OpenTelemetry or an APM
 * tool to subscribe to (see `examples/otel-tracing.ts`).
 *
 * Every Promise call that moves bytes (`read`, `write`, `transfer`, `readBlocks`,
 * `writeBlocks`) runs inside the tracing channel `ferry:transfer`: its `start` event when
 * the call begins, `end` when it returned its Promise, then `asyncStart`/`asyncEnd` when
 * the Promise settled, with `error` before them when it rejected. Every event of one call
 * carries the same context object, `TransferTraceContext`; the channel adds `result` or
 * `error` to it. Without subscribers a call costs one check and no object.
 */
import { tracingChannel } from 'node:diagnostics_channel'
import type { BlocksResult } from './blocks'
import type { TransferResult } from './requests'

/** The name of the tracing channel of transfers (`tracing:ferry:transfer:start`, …). */
export const TRANSFER_CHANNEL = 'ferry:transfer'

/** What a transfer's tracing events carry: one object per call, the same in each event. */
export interface TransferTraceContext {
  /** The method called. */
  operation: 'read' | 'write' | 'transfer' | 'readBlocks' | 'writeBlocks'
  /** This engine's segment name. */
  engine: string
  /** Requests (or blocks) of the call. */
  requests: number
  /** Bytes the call asked to move. */
  bytes: number
  /** The segment of the first request, by name; undefined if the call named none. */
  segment: string | undefined
  /** Set when the call resolved. */
  result?: TransferResult | BlocksResult
  /** Set when the call rejected. */
  error?: unknown
}

/** The channel, for subscribers: `transferChannel.subscribe({ start, asyncEnd, error })`. */
export const transferChannel = tracingChannel<unknown, TransferTraceContext>(TRANSFER_CHANNEL)

/** Whether anything listens to any of the channel's events. */
function subscribed(): boolean {
  const c = transferChannel
  return c.start.hasSubscribers || c.end.hasSubscribers || c.asyncStart.hasSubscribers || c.asyncEnd.hasSubscribers || c.error.hasSubscribers
}

/**
 * Runs `call` inside the channel, with the context `context()` makes; runs it plainly,
 * making no context, when nobody subscribed.
 */
export function traced<T extends TransferResult | BlocksResult>(context: () => TransferTraceContext, call: () => Promise<T>): Promise<T> {
  if (!subscribed()) return call()
  return transferChannel.tracePromise(call, context())
}

/** The segment name of `remote` (a `Segment`, or the first of a list); any other value gives none. */
function segmentOf(remote: unknown): string | undefined {
  const first: unknown = Array.isArray(remote) ? remote[0] : remote
  const name = typeof first === 'object' && first !== null ? (first as { name?: unknown }).name : undefined
  return typeof name === 'string' ? name : undefined
}

/** A finite byte count, or 0 (the context is made before the call checks its input). */
function bytesOf(length: unknown): number {
  return typeof length === 'number' && Number.isFinite(length) ? length : 0
}

/** The context of `read` or `write` of `request`. */
export function ioContext(engine: string, operation: 'read' | 'write', request: unknown): TransferTraceContext {
  const r = (typeof request === 'object' && request !== null ? request : {}) as { remote?: unknown; length?: unknown }
  return { operation, engine, requests: 1, bytes: bytesOf(r.length), segment: segmentOf(r.remote) }
}

/** The context of `transfer` of `requests`. */
export function transferContext(engine: string, requests: unknown): TransferTraceContext {
  const list: unknown[] = Array.isArray(requests) ? requests : []
  const r = list.map((q) => (typeof q === 'object' && q !== null ? q : {}) as { remote?: unknown; length?: unknown })
  return { operation: 'transfer', engine, requests: r.length, bytes: r.reduce((a, q) => a + bytesOf(q.length), 0), segment: segmentOf(r[0]?.remote) }
}

/** The context of `readBlocks` or `writeBlocks` of `blocks`. */
export function blocksContext(engine: string, operation: 'readBlocks' | 'writeBlocks', blocks: unknown): TransferTraceContext {
  const b = (typeof blocks === 'object' && blocks !== null ? blocks : {}) as { remote?: unknown; localOffsets?: unknown; lengths?: unknown }
  const offsets = b.localOffsets
  const count = ArrayBuffer.isView(offsets) || Array.isArray(offsets) ? (offsets as ArrayLike<unknown>).length : 0
  const lengths = b.lengths
  let bytes = 0
  if (typeof lengths === 'number') bytes = bytesOf(lengths) * count
  else if (ArrayBuffer.isView(lengths) || Array.isArray(lengths)) {
    const all = lengths as ArrayLike<unknown>
    for (let i = 0; i < all.length; i++) bytes += bytesOf(typeof all[i] === 'bigint' ? Number(all[i]) : all[i])
  }
  return { operation, engine, requests: count, bytes, segment: segmentOf(b.remote) }
}
