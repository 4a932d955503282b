/**
 * The `encrypt` suite: what sealing tcp data connections costs (`encrypt`: AES-256-GCM,
 * per-connection keys from the handshake). Two target engines in child processes
 * (bench/target.ts) on this host, both holding the cluster secret, one sealing every data
 * connection (encrypt: true) and one none (encrypt: false), each reached by an initiator
 * engine in this process with the matching setting:
 *
 *   tcp-1MiB-encrypt   GB/s of 1 MiB WRITEs sealed   vs the same WRITEs in plaintext (same run, same method)
 *
 * Every frame is sealed by its sender and opened whole into a staging buffer by its
 * receiver before any of it reaches memory: two passes of AES-GCM and a copy per byte, on
 * the I/O threads. Target ratio >= 0.5. Rounds as in the auth suite: odd rounds plaintext
 * first, even rounds sealed first.
 */
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
import { median, round } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'encrypt'
const TARGET_RATIO = 0.5

type Side = 'off' | 'on'
const SIDES: readonly Side[] = ['off', 'on']

interface Sides {
  targets: Partial<Record<Side, Target>>
  rigs: Partial<Record<Side, Rig>>
}

/** A target and an initiator per side, over tcp, both with the secret; "on" seals. */
async function startSides(regionBytes: number, options: SuiteOptions, secretFile: string, secret: string): Promise<Sides> {
  const sides: Sides = { targets: {}, rigs: {} }
  for (const side of SIDES) {
    const env: Record<string, string> = { FERRY_AUTH_SECRET_FILE: secretFile, FERRY_BENCH_ENCRYPT: side === 'on' ? 'true' : 'false' }
    const target = await startTarget(regionBytes, { env })
    sides.targets[side] = target
    sides.rigs[side] = await openRig(target, regionBytes, options, { transports: ['tcp'], authSecret: secret, encrypt: side === 'on' })
  }
  return sides
}

async function stopSides(sides: Sides): Promise<void> {
  for (const side of SIDES) await sides.rigs[side]?.engine.close()
  for (const side of SIDES) await sides.targets[side]?.stop()
}

async function throughputCase(rig: Record<Side, Rig>, regionBytes: number, options: SuiteOptions): Promise<CaseRecord> {
  const name = 'tcp-1MiB-encrypt'
  const transport = 'tcp'
  const load = hostLoad()
  log(`encrypt: ${name}, ${options.repeat} rounds of off + on, ${options.durationSeconds} s each, ${regionBytes / MiB} MiB working set`)
  const phase: RoundsOutcome<Side, ThroughputResult> = await runRounds<Side, ThroughputResult>({
    suite: SUITE,
    options,
    entries: SIDES,
    starting: (side, m, { tag, warm }) =>
      `${tag}: ${name} encrypt ${side}, ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`,
    measure: (side, m, { warm }) =>
      m === 'promise'
        ? throughputPromise(rig[side], 'write', MiB, regionBytes, warm)
        : throughputBatch(rig[side], 'write', MiB, regionBytes, warm),
    finished: (side, m, res, { tag }) => `${tag}: ${name} encrypt ${side} ${m} ${res.gbps.toFixed(3)} GB/s`,
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
    baseline: `the same 1 MiB WRITEs over plaintext connections (both engines with the secret; same run, same method: ${cmp.method})`,
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
    order: 'rounds alternate the order: odd rounds plaintext first, even rounds sealed first',
    host_load: load,
  }
  const errors = SIDES.flatMap((side) => METHODS.flatMap((m) => roundErrors(phase.engine[side][m], `encrypt ${side} ${m}`)))
  for (const side of SIDES) {
    const other = unexpectedTransports(seen[side], transport)
    if (other) errors.unshift(`transport: expected every task over ${transport} (encrypt ${side}), saw ${other}`)
  }
  if (errors.length) record.error = errors.join('; ')
  return record
}

export async function encryptSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const regionBytes = options.workingSetBytes
  const { secret, file: secretFile, remove } = clusterSecret('encrypt')
  try {
    const sides = await startSides(regionBytes, options, secretFile, secret)
    try {
      return [await throughputCase(sides.rigs as Record<Side, Rig>, regionBytes, options)]
    } finally {
      await stopSides(sides)
    }
  } finally {
    remove()
  }
}
