/**
 * What each round of the cluster soak does and when: its length, the idle flood's victim,
 * the etcd pause, the storm's victims and their restart. Pure (a seeded choice of victims),
 * so a run is reproducible from its flags.
 */
import type { SoakConfig } from './flags'

/** Offsets are ms from the round's start. */
export interface RoundPlan {
  round: number
  /** A warm-up round disrupts nothing. */
  warmup: boolean
  lengthMs: number
  flood: { host: number; startMs: number; endMs: number } | null
  etcdPause: { startMs: number; endMs: number } | null
  storm: { hosts: number[]; killMs: number; restartMs: number } | null
}

/** Time after the first disruption of a round starts. */
const LEAD_MS = 1000
/** Between the end of an etcd pause and a storm in the same round. */
const AFTER_PAUSE_MS = 2000

/** How long a round goes on after its last disruption: long enough to see losses and recovery. */
export function settleMs(c: Pick<SoakConfig, 'leaseTtlMs' | 'peerTimeoutMs'>): number {
  return Math.max(4000, 2 * c.leaseTtlMs, c.peerTimeoutMs + 1000)
}

/** mulberry32: a small seeded generator of floats in [0, 1). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** `k` distinct numbers of 0..n-1, ascending, chosen by `random`. */
export function pick(n: number, k: number, random: () => number): number[] {
  const all = Array.from({ length: n }, (_, i) => i)
  for (let i = 0; i < k; i++) {
    const j = i + Math.floor(random() * (n - i))
    ;[all[i], all[j]] = [all[j], all[i]]
  }
  return all.slice(0, k).sort((a, b) => a - b)
}

type PlanConfig = Pick<SoakConfig, 'hosts' | 'roundMs' | 'warmupRounds' | 'storm' | 'etcdPauseMs' | 'flood' | 'seed' | 'leaseTtlMs' | 'peerTimeoutMs'>

/** The plan of round `round` (0-based). */
export function planRound(c: PlanConfig, round: number): RoundPlan {
  const warmup = round < c.warmupRounds
  if (warmup) return { round, warmup, lengthMs: c.roundMs, flood: null, etcdPause: null, storm: null }
  let t = LEAD_MS
  let etcdPause: RoundPlan['etcdPause'] = null
  if (c.etcdPauseMs !== null) {
    etcdPause = { startMs: t, endMs: t + c.etcdPauseMs }
    t = etcdPause.endMs
  }
  let storm: RoundPlan['storm'] = null
  if (c.storm) {
    if (etcdPause) t += AFTER_PAUSE_MS
    const hosts = pick(c.hosts, c.storm.kill, seededRandom(c.seed * 1_000_003 + round))
    storm = { hosts, killMs: t, restartMs: t + c.storm.downMs }
    t = storm.restartMs
  }
  const disrupted = etcdPause !== null || storm !== null || c.flood !== null
  const lengthMs = disrupted ? Math.max(c.roundMs, t + settleMs(c)) : c.roundMs
  const flood = c.flood ? { host: (round - c.warmupRounds) % c.hosts, startMs: 0, endMs: lengthMs - 500 } : null
  return { round, warmup, lengthMs, flood, etcdPause, storm }
}
