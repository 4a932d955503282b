/**
 * The `integrity` suite: what `verify` costs. One target engine in a child process
 * (bench/target.ts) on this host, reached over tcp by two initiator engines in this
 * process, the same but for `verify` (the engine's default for every request):
 *
 *   tcp-1MiB-verify        1 MiB WRITEs, GB/s with verify vs the same without (same run)
 *   tcp-1MiB-verify-read   the same for READs
 *
 * With verify a WRITE's payload is checksummed (CRC32C, SSE4.2) at the source, and at the
 * target read into a staging buffer, checked, then copied into the buffer; a READ is
 * checksummed at the target and checked where it landed. Target ratio >= 0.85. The rounds
 * run like the auth suite's: `--repeat` rounds, odd rounds without verify first, even
 * rounds with it first, both API methods (or the one chosen in round 1), the record
 * comparing the same method.
 */
import { log } from '../lib/log'
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
  type ThroughputResult,
} from '../lib/rig'
import { METHODS, compare, hostLoad, isResult, perMethod, roundErrors, runRounds, type RoundsOutcome } from '../lib/rounds'
import { median, round } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'integrity'
const TARGET_RATIO = 0.85

type Side = 'off' | 'on'
const SIDES: readonly Side[] = ['off', 'on']
type Op = 'write' | 'read'

async function throughputCase(op: Op, rig: Record<Side, Rig>, regionBytes: number, options: SuiteOptions): Promise<CaseRecord> {
  const name = op === 'write' ? 'tcp-1MiB-verify' : 'tcp-1MiB-verify-read'
  const load = hostLoad()
  log(`integrity: ${name}, ${options.repeat} rounds of off + on, ${options.durationSeconds} s each, ${regionBytes / MiB} MiB working set`)
  const phase: RoundsOutcome<Side, ThroughputResult> = await runRounds<Side, ThroughputResult>({
    suite: SUITE,
    options,
    entries: SIDES,
    starting: (side, m, { tag, warm }) =>
      `${tag}: ${name} verify ${side}, ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`,
    measure: (side, m, { warm }) =>
      m === 'promise' ? throughputPromise(rig[side], op, MiB, regionBytes, warm) : throughputBatch(rig[side], op, MiB, regionBytes, warm),
    finished: (side, m, res, { tag }) => `${tag}: ${name} verify ${side} ${m} ${res.gbps.toFixed(3)} GB/s`,
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
    baseline: `the same 1 MiB ${op.toUpperCase()}s over tcp without verify (same run, same target, same method: ${cmp.method})`,
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    target_ratio: TARGET_RATIO,
    meets_target: cmp.ratio === null ? null : cmp.ratio >= TARGET_RATIO,
    method: throughputMethodLabel(cmp.method, options),
    transport: 'tcp',
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
    order: 'rounds alternate the order: odd rounds without verify first, even rounds with it first',
    host_load: load,
  }
  const errors = SIDES.flatMap((side) => METHODS.flatMap((m) => roundErrors(phase.engine[side][m], `verify ${side} ${m}`)))
  for (const side of SIDES) {
    const other = unexpectedTransports(seen[side], 'tcp')
    if (other) errors.unshift(`transport: expected every task over tcp (verify ${side}), saw ${other}`)
  }
  if (errors.length) record.error = errors.join('; ')
  return record
}

export async function integritySuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const regionBytes = options.workingSetBytes
  const target = await startTarget(regionBytes)
  const rigs: Partial<Record<Side, Rig>> = {}
  try {
    for (const side of SIDES) rigs[side] = await openRig(target, regionBytes, options, { transports: ['tcp'], verify: side === 'on' })
    const rig = rigs as Record<Side, Rig>
    const records: CaseRecord[] = []
    for (const op of ['write', 'read'] as const) records.push(await throughputCase(op, rig, regionBytes, options))
    return records
  } finally {
    for (const side of SIDES) await rigs[side]?.engine.close()
    await target.stop()
  }
}
