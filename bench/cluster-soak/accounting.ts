/**
 * The soak's figures from what the hosts reported and what the driver did (kills, restarts).
 * Pure: every function takes the records and returns figures; tested alone.
 *
 *   time-to-FAILED          a transfer to a killed host, from the kill (or its start, if
 *                           later) to its failure — for the transfers in flight when the
 *                           peer went, which the hosts report one by one (host/link.ts);
 *   restart-to-first-success from a restarted host's ready (its engine started and registered,
 *                           its target region allocated) to each survivor's first verified
 *                           write to it, `never` where none came by the end of the run; the
 *                           same from the kill, and the restart's own parts (kill to process
 *                           start, Node and tsx loading, the engine starting), so that the
 *                           time a restart takes is never mistaken for the engine's recovery;
 *   false peerLost          a `peerLost` naming a host that was not killed in the
 *                           attribution window before it;
 *   mismatches              read-backs unlike what was written, except those explained by
 *                           the target's restart between the write and the read (fresh,
 *                           zeroed memory: counted as lost to the restart).
 */
import { percentile } from '../lib/stats'
import { hostName } from './protocol'

export interface Kill {
  host: number
  round: number
  tKill: number
  /** When the restarted incarnation said ready; null while it is not (or never was). */
  tReady: number | null
  /** When its process started (Node's time origin), and when it began to create its engine. */
  tProcess: number | null
  tEngineStart: number | null
  /** The other hosts killed in the same storm. */
  storm: number[]
}

export interface FailRecord {
  host: number
  target: number
  code: string
  tStart: number
  tEnd: number
}

export interface UpRecord {
  host: number
  target: number
  tEnd: number
}

export interface MismatchRecord {
  host: number
  target: number
  tStart: number
  tEnd: number
  zero: boolean
}

export interface PeerLostRecord {
  host: number
  t: number
  event: Record<string, unknown>
}

/** A peerLost this long after a kill of its host is attributed to the kill. */
export const ATTRIBUTION_MS = 30_000

/** Percentiles over samples where `never` ones count as infinitely late; null where the rank falls on one. */
export interface Distribution {
  n: number
  never: number
  p50: number | null
  p90: number | null
  p99: number | null
  max: number | null
}

export function distribution(samples: readonly number[], never = 0): Distribution {
  const s = Float64Array.from([...samples, ...Array<number>(never).fill(Infinity)]).sort()
  const at = (q: number) => {
    const v = percentile(s, q)
    return Number.isFinite(v) ? Math.round(v * 10) / 10 : null
  }
  return { n: s.length, never, p50: at(0.5), p90: at(0.9), p99: at(0.99), max: at(1) }
}

/** The kill of `target` that explains a failure of a transfer started at `tStart` and ended at `tEnd`, if any. */
function killBehind(kills: readonly Kill[], target: number, tStart: number, tEnd: number): Kill | undefined {
  let found: Kill | undefined
  for (const k of kills) {
    if (k.host !== target || k.tKill > tEnd) continue
    if (k.tReady !== null && tStart >= k.tReady) continue
    if (!found || k.tKill > found.tKill) found = k
  }
  return found
}

export interface FailureFigures {
  timeToFailedMs: Distribution
  /** Reported failures no kill explains, by code. */
  unexplained: Record<string, number>
}

export function failureFigures(fails: readonly FailRecord[], kills: readonly Kill[]): FailureFigures {
  const ttf: number[] = []
  const unexplained: Record<string, number> = {}
  for (const f of fails) {
    const k = killBehind(kills, f.target, f.tStart, f.tEnd)
    if (k) ttf.push(f.tEnd - Math.max(f.tStart, k.tKill))
    else unexplained[f.code] = (unexplained[f.code] ?? 0) + 1
  }
  return { timeToFailedMs: distribution(ttf), unexplained }
}

export interface RestartFigures extends Distribution {
  /** Kills whose host never said ready again. */
  notRestarted: number
  /** The same first successes, from the kill. */
  fromKill: Distribution
  /** A restart's parts: kill to ready, kill to the process's start (the down time and the spawn), process start to engine start (Node, tsx, modules), engine start to ready. */
  killToReady: Distribution
  killToProcess: Distribution
  processToEngine: Distribution
  engineToReady: Distribution
}

/**
 * Restart-to-first-success over every (restarted host, survivor) pair, from the host's ready
 * (the figure the goal is about) and from the kill, and the parts of each restart.
 */
export function restartFigures(kills: readonly Kill[], ups: readonly UpRecord[], hosts: number): RestartFigures {
  const fromReady: number[] = []
  const fromKill: number[] = []
  const parts = { killToReady: [] as number[], killToProcess: [] as number[], processToEngine: [] as number[], engineToReady: [] as number[] }
  let never = 0
  let notRestarted = 0
  for (const k of kills) {
    if (k.tReady === null) {
      notRestarted++
      continue
    }
    parts.killToReady.push(k.tReady - k.tKill)
    if (k.tProcess !== null) parts.killToProcess.push(k.tProcess - k.tKill)
    if (k.tProcess !== null && k.tEngineStart !== null) parts.processToEngine.push(k.tEngineStart - k.tProcess)
    if (k.tEngineStart !== null) parts.engineToReady.push(k.tReady - k.tEngineStart)
    // Until this host's next kill: a success after it belongs to that one.
    const next = kills.filter((o) => o.host === k.host && o.tKill > k.tKill).reduce((m, o) => Math.min(m, o.tKill), Infinity)
    for (let s = 0; s < hosts; s++) {
      if (s === k.host || k.storm.includes(s)) continue
      let first = Infinity
      for (const u of ups) if (u.host === s && u.target === k.host && u.tEnd >= k.tKill && u.tEnd < next) first = Math.min(first, u.tEnd)
      if (Number.isFinite(first)) {
        fromReady.push(Math.max(0, first - k.tReady))
        fromKill.push(first - k.tKill)
      } else never++
    }
  }
  return {
    ...distribution(fromReady, never),
    notRestarted,
    fromKill: distribution(fromKill, never),
    killToReady: distribution(parts.killToReady),
    killToProcess: distribution(parts.killToProcess),
    processToEngine: distribution(parts.processToEngine),
    engineToReady: distribution(parts.engineToReady),
  }
}

/** The host a segment name names, or -1. */
export function hostOf(segment: unknown): number {
  if (typeof segment !== 'string') return -1
  const m = /^soak-host-(\d+)$/.exec(segment)
  return m && hostName(Number(m[1])) === segment ? Number(m[1]) : -1
}

export interface PeerLostFigures {
  total: number
  /** Naming a host not killed in the `ATTRIBUTION_MS` before. */
  falsePeerLost: number
  /** Every `reason` seen (and the field's absence as `(none)`), with counts, for true and false ones. */
  reasons: { true: Record<string, number>; false: Record<string, number> }
}

export function peerLostFigures(events: readonly PeerLostRecord[], kills: readonly Kill[]): PeerLostFigures {
  const reasons: PeerLostFigures['reasons'] = { true: {}, false: {} }
  let falsePeerLost = 0
  for (const e of events) {
    const target = hostOf(e.event.segment)
    const explained = kills.some((k) => k.host === target && k.tKill <= e.t && e.t - k.tKill <= ATTRIBUTION_MS)
    if (!explained) falsePeerLost++
    const r = e.event.reason
    const reason = r === undefined ? '(none)' : typeof r === 'string' ? r : JSON.stringify(r)
    const bucket = explained ? reasons.true : reasons.false
    bucket[reason] = (bucket[reason] ?? 0) + 1
  }
  return { total: events.length, falsePeerLost, reasons }
}

export interface MismatchFigures {
  mismatches: number
  /** Read back zero from a target restarted between the write and the read. */
  lostToRestart: number
}

export function mismatchFigures(records: readonly MismatchRecord[], kills: readonly Kill[]): MismatchFigures {
  let mismatches = 0
  let lostToRestart = 0
  for (const m of records) {
    const restarted = m.zero && kills.some((k) => k.host === m.target && k.tKill >= m.tStart && k.tKill <= m.tEnd)
    if (restarted) lostToRestart++
    else mismatches++
  }
  return { mismatches, lostToRestart }
}
