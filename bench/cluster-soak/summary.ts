/**
 * The soak's closing record (one JSON object) and its readable form. Pure: it takes what the
 * collector kept and the per-round samples, computes the figures (accounting.ts) and says
 * which of the issue's goals they meet.
 */
import {
  failureFigures,
  mismatchFigures,
  peerLostFigures,
  restartFigures,
  type Distribution,
  type FailRecord,
  type Kill,
  type MismatchRecord,
  type PeerLostRecord,
  type UpRecord,
} from './accounting'
import { judgedQuantities, memoryFigures, MIN_SAMPLES, rssBaselineRound, type MemoryFigures, type MemorySample } from './memory'
import type { SoakConfig } from './flags'
import type { Counters } from './protocol'

export interface SummaryInput {
  config: SoakConfig
  durationS: number
  /** When the hosts were told to stop: what they report from then on is the shutdown's. */
  stoppedAt: number
  totals: Counters
  kills: readonly Kill[]
  fails: readonly FailRecord[]
  ups: readonly UpRecord[]
  mismatches: readonly MismatchRecord[]
  peerLost: readonly PeerLostRecord[]
  peerRecovered: number
  /** Each host's memory after each round (after a full collection), null where it was down or did not answer. */
  memory: Array<Array<MemorySample | null>>
  /** The incarnation that took each sample. */
  incarnations: Array<Array<number | null>>
  floods: readonly object[]
  etcdPauses: readonly object[]
  restartFailures: number
  hostErrors: readonly object[]
  misdeliveredSamples: readonly object[]
}

/** The issue's goals for the figures. */
export const GOALS = { restartP90Ms: 500 } as const

export function summarize(s: SummaryInput) {
  const failures = failureFigures(s.fails.filter((f) => f.tEnd < s.stoppedAt), s.kills)
  const restart = restartFigures(s.kills, s.ups, s.config.hosts)
  const lost = peerLostFigures(s.peerLost.filter((e) => e.t < s.stoppedAt), s.kills)
  const mism = mismatchFigures(s.mismatches.filter((m) => m.tEnd < s.stoppedAt), s.kills)
  const fromRound = rssBaselineRound(s.config.rounds, s.config.warmupRounds)
  const quantities = s.memory.map((host) => host.map((m) => (m ? judgedQuantities(m) : null)))
  const series = (k: 'rss' | 'native' | 'heap') => quantities.map((host) => host.map((q) => q?.[k] ?? null))
  const judge = (k: 'rss' | 'native' | 'heap') => memoryFigures(series(k), s.incarnations, fromRound, k === 'heap' ? s.config.heapSlopeMb : s.config.rssSlopeMb)
  const rss = judge('rss')
  const native = judge('native')
  const heap = judge('heap')
  const t = s.totals
  const goals = {
    restart_p90_le_500ms: s.config.storm ? restart.p90 !== null && restart.p90 <= GOALS.restartP90Ms : null,
    zero_mismatches: mism.mismatches === 0,
    zero_misdelivered: t.misdelivered === 0,
    zero_false_peer_lost: lost.falsePeerLost === 0,
    rss_flat: rss.flat,
    native_memory_flat: native.flat,
    js_heap_flat: heap.flat,
  }
  return {
    record: 'summary' as const,
    hosts: s.config.hosts,
    rounds: s.config.rounds,
    duration_s: s.durationS,
    disruptions: {
      storm: s.config.storm && { kill: s.config.storm.kill, down_ms: s.config.storm.downMs },
      etcd_pause_ms: s.config.etcdPauseMs,
      flood: s.config.flood && { connections: s.config.flood.connections },
    },
    reopen: s.config.reopen,
    time_to_failed_ms: failures.timeToFailedMs,
    unexplained_failures: failures.unexplained,
    restart_to_first_success_ms: { n: restart.n, never: restart.never, p50: restart.p50, p90: restart.p90, p99: restart.p99, max: restart.max, not_restarted: restart.notRestarted },
    restart_to_first_success_from_kill_ms: restart.fromKill,
    restart_ms: { kill_to_ready: restart.killToReady, kill_to_process: restart.killToProcess, process_to_engine: restart.processToEngine, engine_to_ready: restart.engineToReady },
    kills: s.kills.length,
    restart_failures: s.restartFailures,
    writes_ok: t.writesOk,
    bytes_written: t.bytesWritten,
    bytes_verified: t.bytesVerified,
    bytes_verified_at_target: t.notifyVerifiedBytes,
    mismatches: mism.mismatches,
    lost_to_restart: mism.lostToRestart,
    notifications: t.notifications,
    notifications_verified: t.notifyVerified,
    notifications_superseded: t.notifySuperseded,
    misdelivered: t.misdelivered,
    misdelivered_by: t.misdeliveredBy,
    misdelivered_samples: s.misdeliveredSamples,
    peer_lost: lost.total,
    false_peer_lost: lost.falsePeerLost,
    peer_lost_reasons: lost.reasons,
    peer_recovered: s.peerRecovered,
    failures_by_code: t.failures,
    hung: t.hung,
    reopens: t.reopens,
    memory: {
      from_round: fromRound,
      slope_bound_mb_per_round: s.config.rssSlopeMb,
      heap_slope_bound_mb_per_round: s.config.heapSlopeMb,
      min_samples: MIN_SAMPLES,
      rss: memoryRecord(rss),
      native: memoryRecord(native),
      heap: memoryRecord(heap),
    },
    rss_mb_by_round: series('rss'),
    native_mb_by_round: series('native'),
    heap_used_mb_by_round: series('heap'),
    incarnations_by_round: s.incarnations,
    floods: s.floods,
    etcd_pauses: s.etcdPauses,
    host_errors: s.hostErrors,
    goals,
  }
}

export type Summary = ReturnType<typeof summarize>

function memoryRecord(f: MemoryFigures) {
  return {
    flat: f.flat,
    max_slope_mb_per_round: f.maxSlopeMbPerRound,
    hosts: f.hosts.map((h) => ({ host: h.host, from_mb: h.fromMb, end_mb: h.endMb, growth_mb: h.growthMb, slope_mb_per_round: h.slopeMbPerRound, samples: h.samples, flat: h.flat })),
  }
}

const ms = (v: number | null) => (v === null ? 'never' : `${v} ms`)
const dist = (d: Distribution) => (d.n === 0 ? 'none' : `p50 ${ms(d.p50)}, p90 ${ms(d.p90)}, p99 ${ms(d.p99)} (n ${d.n}${d.never ? `, ${d.never} never` : ''})`)
const counts = (r: Record<string, number>) => {
  const e = Object.entries(r)
  return e.length ? e.map(([k, v]) => `${k} ${v}`).join(', ') : 'none'
}
const GiB = 1024 ** 3

/** What the driver records of a flood (driver.ts). */
interface FloodRecord {
  round: number
  host: number
  stats: { peakOpen: number; dropped: number }
  probe: { ok: boolean; openMs?: number; ioMs?: number; code?: string; message?: string }
}

const verdict = (v: boolean | null) => (v === null ? 'not judged' : v ? 'flat' : 'GROWS')

/** The memory verdicts and each host's series, as lines. */
function memoryLines(s: Summary): string[] {
  const m = s.memory
  const what = { rss: 'RSS', native: 'native (RSS less V8\'s heap: the engine, Node)', heap: 'JS heap live after a full GC' } as const
  const lines = [
    `  memory after each round, judged from round ${m.from_round + 1} on (flat: slope <= ${m.slope_bound_mb_per_round} MB/round, the live heap's <= ${m.heap_slope_bound_mb_per_round}, within an incarnation, runs of >= ${m.min_samples} rounds):`,
  ]
  for (const k of ['rss', 'native', 'heap'] as const) {
    lines.push(`    ${what[k]}: ${verdict(m[k].flat)} (steepest ${m[k].max_slope_mb_per_round ?? '-'} MB/round)`)
  }
  const row = (v: Array<number | null>, inc: Array<number | null>) =>
    v.map((x, r) => (x === null ? '-' : x.toFixed(1)).padStart(6) + (r > 0 && inc[r] !== null && inc[r] !== inc[r - 1] ? '*' : ' ')).join('')
  lines.push(`    per host per round (MB), RSS / native / live heap (* a restarted host's first sample):`)
  for (let h = 0; h < s.hosts; h++) {
    const slopes = (['rss', 'native', 'heap'] as const).map((k) => m[k].hosts[h]?.slope_mb_per_round ?? '-').join(' / ')
    const inc = s.incarnations_by_round[h] ?? []
    lines.push(`    host ${h} rss   ${row(s.rss_mb_by_round[h], inc)}  slopes ${slopes} MB/round`)
    lines.push(`           native${row(s.native_mb_by_round[h], inc)}`)
    lines.push(`           heap  ${row(s.heap_used_mb_by_round[h], inc)}`)
  }
  return lines
}

/** The summary as lines for people. */
export function readable(s: Summary): string {
  const d = s.disruptions
  const what = [d.storm ? `storms of ${d.storm.kill} (down ${d.storm.down_ms} ms)` : '', d.etcd_pause_ms ? `etcd paused ${d.etcd_pause_ms} ms` : '', d.flood ? `${d.flood.connections} idle connections` : '']
    .filter(Boolean)
    .join(', ')
  const lines = [
    `cluster soak: ${s.hosts} hosts, ${s.rounds} rounds, ${s.duration_s} s; disruptions: ${what || 'none'}; reopen ${s.reopen}`,
    `  time-to-FAILED (transfers to a killed host): ${dist(s.time_to_failed_ms)}`,
    `  restart-to-first-success, from the restarted host's ready (goal p90 <= ${GOALS.restartP90Ms} ms): ${dist(s.restart_to_first_success_ms)}${s.restart_to_first_success_ms.not_restarted ? `; ${s.restart_to_first_success_ms.not_restarted} hosts never came back` : ''}${s.restart_failures ? `; ${s.restart_failures} restarts failed` : ''}`,
    `    the same from the kill (the restart itself included):   ${dist(s.restart_to_first_success_from_kill_ms)}`,
    `    a restart, kill to ready: ${dist(s.restart_ms.kill_to_ready)}; of which down and spawn ${dist(s.restart_ms.kill_to_process)}; Node and tsx ${dist(s.restart_ms.process_to_engine)}; engine start to ready ${dist(s.restart_ms.engine_to_ready)}`,
    `  bytes verified: ${(s.bytes_verified / GiB).toFixed(3)} GiB read back, ${(s.bytes_verified_at_target / GiB).toFixed(3)} GiB by notified targets; ${s.writes_ok} writes`,
    `  mismatches: ${s.mismatches} (lost to a restart: ${s.lost_to_restart})`,
    `  notifications: ${s.notifications}, verified ${s.notifications_verified}, superseded ${s.notifications_superseded}, misdelivered ${s.misdelivered}${s.misdelivered ? ` (${counts(s.misdelivered_by)})` : ''}`,
    `  peerLost: ${s.peer_lost}, false ${s.false_peer_lost}; reasons: true ${counts(s.peer_lost_reasons.true)}; false ${counts(s.peer_lost_reasons.false)}`,
    `  failures by code: ${counts(s.failures_by_code)}; unexplained by a kill: ${counts(s.unexplained_failures)}; hung ${s.hung}; reopens ${s.reopens}`,
    ...memoryLines(s),
  ]
  for (const f of s.floods as FloodRecord[]) {
    const p = f.probe
    const outcome = p.ok ? `opened in ${p.openMs} ms, wrote and read back in ${p.ioMs} ms` : `failed: ${p.code} ${p.message ?? ''}`.trim()
    lines.push(`  flood, round ${f.round + 1}, host ${f.host}: ${f.stats.peakOpen} idle open at most, ${f.stats.dropped} dropped by the host; a new engine ${outcome}`)
  }
  for (const e of s.host_errors as Array<Record<string, unknown>>) lines.push(`  host error: ${JSON.stringify(e)}`)
  const g = Object.entries(s.goals).map(([k, v]) => `${k} ${v === null ? '-' : v ? 'yes' : 'NO'}`)
  lines.push(`  goals: ${g.join(', ')}`)
  return lines.join('\n')
}
