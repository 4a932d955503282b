/**
 * What one engine option costs in throughput: the same 1 MiB operations on two rigs that
 * differ only by the option ("off" and "on"), in interleaved rounds of the same run, the
 * record comparing the same API method on both. The `auth`, `integrity` and `encrypt`
 * suites are each this case with their own option, target and words.
 */
import { log } from './log'
import {
  MiB,
  mergeTallies,
  throughputBatch,
  throughputMethodLabel,
  throughputPromise,
  unexpectedTransports,
  type Rig,
  type ThroughputResult,
} from './rig'
import { METHODS, compare, hostLoad, isResult, perMethod, roundErrors, runRounds, type RoundsOutcome } from './rounds'
import { median, round } from './stats'
import type { CaseRecord, SuiteOptions } from '../suites/types'

/** The two rigs of a comparison: without the option, with it. */
export type Side = 'off' | 'on'
export const SIDES: readonly Side[] = ['off', 'on']

/** One option-cost case. */
export interface OptionCost {
  suite: string
  /** The record's case name, e.g. `tcp-1MiB-verify`. */
  name: string
  /** The option as the progress lines name it (`verify on`, `secret off`). */
  word: string
  op: 'write' | 'read'
  transport: 'tcp' | 'shm'
  targetRatio: number
  /** What the "off" side is, for the record's `baseline` (the method is appended). */
  baseline: string
  /** The round order, in words, for the record. */
  order: string
}

export async function optionCostCase(
  c: OptionCost,
  rig: Record<Side, Rig>,
  regionBytes: number,
  options: SuiteOptions,
): Promise<CaseRecord> {
  const load = hostLoad()
  log(`${c.suite}: ${c.name}, ${options.repeat} rounds of off + on, ${options.durationSeconds} s each, ${regionBytes / MiB} MiB working set`)
  const phase: RoundsOutcome<Side, ThroughputResult> = await runRounds<Side, ThroughputResult>({
    suite: c.suite,
    options,
    entries: SIDES,
    starting: (side, m, { tag, warm }) =>
      `${tag}: ${c.name} ${c.word} ${side}, ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`,
    measure: (side, m, { warm }) =>
      m === 'promise'
        ? throughputPromise(rig[side], c.op, MiB, regionBytes, warm)
        : throughputBatch(rig[side], c.op, MiB, regionBytes, warm),
    finished: (side, m, res, { tag }) => `${tag}: ${c.name} ${c.word} ${side} ${m} ${res.gbps.toFixed(3)} GB/s`,
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
    suite: c.suite,
    case: c.name,
    value: cmp.value,
    unit: 'GB/s',
    baseline: `${c.baseline} (same run, same method: ${cmp.method})`,
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    target_ratio: c.targetRatio,
    meets_target: cmp.ratio === null ? null : cmp.ratio >= c.targetRatio,
    method: throughputMethodLabel(cmp.method, options),
    transport: c.transport,
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
    order: c.order,
    host_load: load,
  }
  const errors = SIDES.flatMap((side) => METHODS.flatMap((m) => roundErrors(phase.engine[side][m], `${c.word} ${side} ${m}`)))
  for (const side of SIDES) {
    const other = unexpectedTransports(seen[side], c.transport)
    if (other) errors.unshift(`transport: expected every task over ${c.transport} (${c.word} ${side}), saw ${other}`)
  }
  if (errors.length) record.error = errors.join('; ')
  return record
}
