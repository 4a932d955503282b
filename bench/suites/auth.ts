/**
 * The `auth` suite: what the cluster secret costs. Two target engines in child processes
 * (bench/target.ts) on this host, the same but for the secret (FERRY_AUTH_SECRET_FILE on one),
 * each reached by an initiator engine in this process with the matching setting:
 *
 *   tcp-write-1MiB-auth   GB/s with the secret   vs the same WRITEs without (same run, same method)
 *   shm-write-1MiB-auth   the same over shm
 *   open-segment-handshake  openSegment's median µs with the secret vs without (same run)
 *
 * The secret is proved once per connection (HMAC-SHA256 challenge-response, both ways); no
 * frame after the handshake carries anything more, so throughput should not move: target
 * ratio >= 0.97. The throughput cases run like the failover suite's: `--repeat` rounds, odd
 * rounds without the secret first, even rounds with it first, both API methods (or the one
 * chosen in round 1), the record comparing the same method. openSegment is timed
 * alternately on both sides, each time a closed segment opened again (new control and data
 * connections, a new handshake on each).
 */
import type { EngineOptions } from '../../index'
import { log } from '../lib/log'
import { clusterSecret } from '../lib/secret'
import {
  MiB,
  mergeTallies,
  openRig,
  startTarget,
  throughputBatch,
  throughputMethodLabel,
  throughputPromise,
  unexpectedTransports,
  type Rig,
  type Target,
  type ThroughputResult,
} from '../lib/rig'
import { METHODS, compare, hostLoad, isResult, perMethod, roundErrors, runRounds, type RoundsOutcome } from '../lib/rounds'
import { median, nowNs, percentile, round, sorted } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'auth'
const TARGET_RATIO = 0.97
/** openSegment timings per side. */
const OPENS = 40

type Side = 'off' | 'on'
const SIDES: readonly Side[] = ['off', 'on']
type Transport = 'tcp' | 'shm'

interface Sides {
  targets: Partial<Record<Side, Target>>
  rigs: Partial<Record<Side, Rig>>
}

/** A target and an initiator per side; tcp only where `transport` is tcp. */
async function startSides(transport: Transport, regionBytes: number, options: SuiteOptions, secretFile: string, secret: string): Promise<Sides> {
  const sides: Sides = { targets: {}, rigs: {} }
  const transports: EngineOptions = transport === 'tcp' ? { transports: ['tcp'] } : {}
  for (const side of SIDES) {
    // "off" is no secret at all: without allowUnauthenticated an engine proves the per-user one.
    const env: Record<string, string> = side === 'on' ? { FERRY_AUTH_SECRET_FILE: secretFile } : { FERRY_BENCH_UNAUTHENTICATED: '1' }
    const target = await startTarget(regionBytes, { env })
    sides.targets[side] = target
    sides.rigs[side] = await openRig(target, regionBytes, options, side === 'on' ? { ...transports, authSecret: secret } : { ...transports, allowUnauthenticated: true })
  }
  return sides
}

async function stopSides(sides: Sides): Promise<void> {
  for (const side of SIDES) await sides.rigs[side]?.engine.close()
  for (const side of SIDES) await sides.targets[side]?.stop()
}

async function throughputCase(transport: Transport, rig: Record<Side, Rig>, regionBytes: number, options: SuiteOptions): Promise<CaseRecord> {
  const name = `${transport}-write-1MiB-auth`
  const load = hostLoad()
  log(`auth: ${name}, ${options.repeat} rounds of off + on, ${options.durationSeconds} s each, ${regionBytes / MiB} MiB working set`)
  const phase: RoundsOutcome<Side, ThroughputResult> = await runRounds<Side, ThroughputResult>({
    suite: SUITE,
    options,
    entries: SIDES,
    starting: (side, m, { tag, warm }) =>
      `${tag}: ${name} secret ${side}, ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`,
    measure: (side, m, { warm }) =>
      m === 'promise'
        ? throughputPromise(rig[side], 'write', MiB, regionBytes, warm)
        : throughputBatch(rig[side], 'write', MiB, regionBytes, warm),
    finished: (side, m, res, { tag }) => `${tag}: ${name} secret ${side} ${m} ${res.gbps.toFixed(3)} GB/s`,
    figure: (x) => x.gbps,
    higherIsBetter: true,
    chooseBy: 'on',
  })
  const per = (side: Side) => perMethod(phase.engine[side], options.repeat, (x) => x.gbps, 3)
  const on = per('on')
  const off = per('off')
  const cmp = compare(on, phase.chosen?.on, true, (m) => off[m], 3)
  const results = (side: Side) => METHODS.flatMap((m) => phase.engine[side][m].filter(isResult))
  const seen = { on: mergeTallies(results('on').map((x) => x.transports)), off: mergeTallies(results('off').map((x) => x.transports)) }
  const record: CaseRecord = {
    suite: SUITE,
    case: name,
    value: cmp.value,
    unit: 'GB/s',
    baseline: `the same 1 MiB WRITEs between engines without a secret (same run, same method: ${cmp.method})`,
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    target_ratio: TARGET_RATIO,
    meets_target: cmp.ratio === null ? null : cmp.ratio >= TARGET_RATIO,
    method: throughputMethodLabel(cmp.method, options),
    transport,
    tasks_by_transport: seen,
    rounds: cmp.rounds,
    baseline_rounds: cmp.baselineRounds,
    ratio_per_round: cmp.ratioPerRound,
    ratio_median: cmp.ratioMedian,
    promise_GBps: { on: round(median(on.promise), 3), off: round(median(off.promise), 3) },
    batch_GBps: { on: round(median(on.batch), 3), off: round(median(off.batch), 3) },
    working_set_MiB: regionBytes / MiB,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    order: 'rounds alternate the order: odd rounds without the secret first, even rounds with it first',
    host_load: load,
  }
  const errors = SIDES.flatMap((side) => METHODS.flatMap((m) => roundErrors(phase.engine[side][m], `secret ${side} ${m}`)))
  for (const side of SIDES) {
    const other = unexpectedTransports(seen[side], transport)
    if (other) errors.unshift(`transport: expected every task over ${transport} (secret ${side}), saw ${other}`)
  }
  if (errors.length) record.error = errors.join('; ')
  return record
}

/** openSegment after closeSegment, alternating sides, `OPENS` times each. */
async function handshakeCase(rig: Record<Side, Rig>): Promise<CaseRecord> {
  const us: Record<Side, number[]> = { off: [], on: [] }
  for (let i = 0; i < OPENS; i++) {
    for (const side of i % 2 === 0 ? SIDES : [...SIDES].reverse()) {
      const r = rig[side]
      r.engine.closeSegment(r.remote)
      const t0 = nowNs()
      r.remote = await r.engine.openSegment(r.target.segment)
      us[side].push((nowNs() - t0) / 1e3)
    }
  }
  const on = sorted(us.on)
  const off = sorted(us.off)
  const p50 = { on: percentile(on, 0.5), off: percentile(off, 0.5) }
  return {
    suite: SUITE,
    case: 'open-segment-handshake',
    value: round(p50.on, 1),
    unit: 'us (p50 of openSegment)',
    baseline: 'openSegment of a target without a secret, from an engine without one (same run, alternating)',
    baseline_value: round(p50.off, 1),
    ratio: round(p50.on / p50.off, 3),
    added_us_p50: round(p50.on - p50.off, 1),
    p90_us: { on: round(percentile(on, 0.9), 1), off: round(percentile(off, 0.9), 1) },
    opens: OPENS,
    note: 'each openSegment follows a closeSegment of the same segment, so it makes new connections and proves the secret on each',
    host_load: hostLoad(),
  }
}

export async function authSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const regionBytes = options.workingSetBytes
  const { secret, file: secretFile, remove } = clusterSecret('auth')
  const records: CaseRecord[] = []
  try {
    for (const transport of ['tcp', 'shm'] as const) {
      const sides = await startSides(transport, regionBytes, options, secretFile, secret)
      try {
        const rig = sides.rigs as Record<Side, Rig>
        records.push(await throughputCase(transport, rig, regionBytes, options))
        if (transport === 'tcp') records.push(await handshakeCase(rig))
      } finally {
        await stopSides(sides)
      }
    }
  } finally {
    remove()
  }
  return records
}
