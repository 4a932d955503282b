/** Engine counters as JS sees them. */
import type * as Native from './native'

/** Bytes of completed transfers over one transport for one operation. */
export interface BytesByTransport extends Native.BytesByTransport {}

/** Engine counters (see README, "Metrics"). Counted in the core with atomics. */
export interface EngineMetrics extends Native.EngineMetrics {
  /** Bytes of completed transfers, by transport and op (every combination, zeros too). */
  bytes: BytesByTransport[]
  /** Transfers that ended, by final status: completed, failed, timeout, canceled, invalid. */
  transfers: Record<'completed' | 'failed' | 'timeout' | 'canceled' | 'invalid', number>
}

/** The binding's counters with every transfer outcome present (zeros too). */
export function toMetrics(m: Native.EngineMetrics): EngineMetrics {
  return {
    ...m,
    bytes: m.bytes.map((b) => ({ transport: b.transport, op: b.op, bytes: b.bytes })),
    transfers: { completed: 0, failed: 0, timeout: 0, canceled: 0, invalid: 0, ...m.transfers },
  }
}
