/**
 * What the soak's driver and its host processes say to each other: the host's settings (an
 * environment variable), the driver's commands (JSON lines on the host's stdin) and the
 * host's reports (JSON lines on its stdout). Times are `Date.now()` ms: every process runs
 * on this machine, so their clocks agree.
 */
import type { MemorySample } from './memory'

/** A host's settings, as JSON in FERRY_SOAK_HOST. */
export interface HostSettings {
  index: number
  hosts: number
  /** `addr:port` to listen on. */
  listen: string
  etcd: `etcd://${string}`
  peerTimeoutMs: number
  leaseTtlMs: number
  lanes: number
  gapMs: number
  blockMin: number
  blockMax: number
  slots: number
  reopen: 'on-stale' | 'never'
  hangMs: number
}

export const hostName = (i: number) => `soak-host-${i}`

/** Driver → host. */
export type Command =
  /** Start the traffic (every host is ready). */
  | { cmd: 'go' }
  /** Host `target` was SIGKILLed at `t`. */
  | { cmd: 'killed'; target: number; t: number }
  /** Report memory, right after a full garbage collection, as round `round`'s sample (`memory`). */
  | { cmd: 'sample'; round: number }
  /** End the traffic and report the last counters (then `quiet`). */
  | { cmd: 'quiesce' }
  /** Close the engine and exit. */
  | { cmd: 'stop' }

/** Cumulative counters of one host incarnation. */
export interface Counters {
  writesOk: number
  bytesWritten: number
  /** Read back equal to what was written. */
  bytesVerified: number
  readbackMismatches: number
  /** Of those, slots read back all zero. */
  readbackZero: number
  /** Failed transfers by code (writes, reads, opens). */
  failures: Record<string, number>
  hung: number
  reopens: number
  notifications: number
  notifyVerified: number
  notifyVerifiedBytes: number
  notifySuperseded: number
  misdelivered: number
  misdeliveredBy: Record<string, number>
  peerLost: number
  peerRecovered: number
}

export function newCounters(): Counters {
  return {
    writesOk: 0,
    bytesWritten: 0,
    bytesVerified: 0,
    readbackMismatches: 0,
    readbackZero: 0,
    failures: {},
    hung: 0,
    reopens: 0,
    notifications: 0,
    notifyVerified: 0,
    notifyVerifiedBytes: 0,
    notifySuperseded: 0,
    misdelivered: 0,
    misdeliveredBy: {},
    peerLost: 0,
    peerRecovered: 0,
  }
}

/** Host → driver. `host` and `inc` (the incarnation: its start time) are on every report. */
export type Report = { host: number; inc: number; t: number } & (
  /**
   * The engine is started and registered and the target region allocated. `tProcess`: when
   * the process started (Node's time origin); `tEngineStart`: when it began to create the
   * engine (Node, tsx and the modules loaded).
   */
  | { ev: 'ready'; pid: number; tProcess: number; tEngineStart: number }
  | { ev: 'opened'; peers: number; failed: number }
  | { ev: 'fail'; target: number; op: 'write' | 'read' | 'open'; code: string; tStart: number; tEnd: number }
  | { ev: 'up'; target: number; downAt: number; tStart: number; tEnd: number; failures: number }
  | { ev: 'mismatch'; target: number; tStart: number; tEnd: number; zero: boolean }
  | { ev: 'misdelivered'; from: string; why: string; payload: string }
  /** Every field of the engine's event as it came (a later version may add some). */
  | { ev: 'peerLost' | 'peerRecovered'; event: Record<string, unknown> }
  | { ev: 'counters'; counters: Counters }
  /** The process's memory (bytes) after a full collection, for round `round` (`sample`). */
  | { ev: 'memory'; round: number; memory: MemorySample }
  /** The traffic ended (`quiesce`); no counters change after this. */
  | { ev: 'quiet' }
  | { ev: 'error'; message: string }
)

/** A report's own fields (the host adds `host`, `inc` and, unless given, `t`). */
export type ReportFields = Report extends infer R ? (R extends unknown ? Omit<R, 'host' | 'inc' | 't'> & { t?: number } : never) : never
export type Emit = (r: ReportFields) => void

/** Adds `b`'s counts to `a`. */
export function addCounters(a: Counters, b: Counters): Counters {
  const out = newCounters()
  for (const k of Object.keys(out) as Array<keyof Counters>) {
    const x = a[k]
    const y = b[k]
    if (typeof x === 'number' && typeof y === 'number') (out[k] as number) = x + y
    else (out[k] as Record<string, number>) = mergeCounts(x as Record<string, number>, y as Record<string, number>)
  }
  return out
}

function mergeCounts(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = { ...a }
  for (const [k, v] of Object.entries(b)) out[k] = (out[k] ?? 0) + v
  return out
}
