/** Engine counters as JS sees them, and what the engine spreads its work over. */
import type * as Native from './native'

/** Bytes of completed transfers over one transport for one operation. */
export interface BytesByTransport extends Native.BytesByTransport {}

/** Engine counters (docs/operations.md, "Metrics"). Counted in the core with atomics. */
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

/**
 * What an engine spreads its work over, as its transports use it: I/O threads, tcp lanes
 * (data connections per peer), shm copy threads; a transport that is not enabled is null.
 */
export interface EngineSpread {
  /** The runtime's I/O threads (`ioThreads`). */
  ioThreads: number
  /** Tcp lanes (data connections) per peer (`connectionsPerPeer`); null without tcp. */
  tcpLanes: number | null
  /** Threads that share large shm copies with the submitting ones; null without shm. */
  shmCopyThreads: number | null
}

/** The binding's spread with every field present. */
export function toSpread(s: Native.EngineSpreadJs): EngineSpread {
  return { ioThreads: s.ioThreads, tcpLanes: s.tcpLanes ?? null, shmCopyThreads: s.shmCopyThreads ?? null }
}
