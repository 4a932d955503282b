/**
 * The 1 MiB throughput phase of the `tcp` and `shm` suites: rounds of every case (both API
 * methods, or the one chosen in round 1) then one baseline run, the baseline of every case
 * of that round (iperf3, memcpy); see bench/lib/rounds.ts for the order.
 */
import { log } from './log'
import {
  MiB,
  medianCpu,
  mergeTallies,
  throughputBatch,
  throughputMethodLabel,
  throughputPromise,
  type Opcode,
  type Rig,
  type ThroughputResult,
} from './rig'
import {
  METHODS,
  compare,
  figures,
  hostLoad,
  isResult,
  methodChoiceNote,
  perMethod,
  roundErrors,
  runRounds,
  type Method,
  type RoundsOutcome,
} from './rounds'
import { median, round } from './stats'

/** One throughput case: an opcode over the first `workingSetBytes` of each side. */
export interface ThroughputCase {
  name: string
  opcode: Opcode
  workingSetBytes: number
}

/** What a baseline run reports: GB/s, or null and why not. */
export interface BaselineRun {
  gbps: number | null
  note?: string
}

export interface ThroughputPhase<B extends BaselineRun> extends RoundsOutcome<string, ThroughputResult> {
  /** One baseline run per round. */
  base: B[]
  /** Load average when each case was first measured, by case name. */
  hostLoad: Record<string, number | null>
}

export const gbps = (x: ThroughputResult) => x.gbps

/**
 * Runs the rounds. `baseline.run(seconds, warmupSeconds)` is one baseline run, logged as
 * `baseline.name`; `logTasks` adds each run's tasks by transport to its progress line.
 */
export async function throughputPhase<B extends BaselineRun>(
  suite: string,
  rig: Rig,
  chunk: number,
  cases: readonly ThroughputCase[],
  baseline: { name: string; run(seconds: number, warmupSeconds: number): Promise<B> },
  logTasks = false,
): Promise<ThroughputPhase<B>> {
  const { options } = rig
  const byName = new Map(cases.map((c) => [c.name, c]))
  const caseOf = (name: string) => byName.get(name)!
  const base: B[] = []
  const loads: Record<string, number | null> = Object.fromEntries(cases.map((c) => [c.name, null]))
  const outcome = await runRounds<string, ThroughputResult>({
    suite,
    options,
    entries: cases.map((c) => c.name),
    onEntry: (name, { round }) => {
      if (round === 0) loads[name] = hostLoad()
    },
    starting: (name, m, { tag, warm }) =>
      `${tag}: ${name} (${caseOf(name).workingSetBytes / MiB} MiB working set), ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`,
    measure: (name, m, { warm }) => {
      const c = caseOf(name)
      return m === 'promise'
        ? throughputPromise(rig, c.opcode, chunk, c.workingSetBytes, warm)
        : throughputBatch(rig, c.opcode, chunk, c.workingSetBytes, warm)
    },
    finished: (name, m, res, { tag }) =>
      `${tag}: ${name} ${m} ${res.gbps.toFixed(3)} GB/s, cpu ${JSON.stringify(res.cpu)}${logTasks ? `, tasks ${JSON.stringify(res.transports)}` : ''}`,
    others: [
      async ({ round, tag, warm }) => {
        const res = await baseline.run(options.durationSeconds, warm)
        base[round] = res
        log(`${tag}: ${baseline.name} ${res.gbps === null ? `unavailable (${res.note})` : `${res.gbps.toFixed(3)} GB/s`}`)
      },
    ],
    figure: gbps,
    higherIsBetter: true,
  })
  return { ...outcome, base, hostLoad: loads }
}

/**
 * A case's figures: GB/s per method and round, its baseline's per round, the comparison,
 * CPU shares, tasks by transport and per-round errors; `fields` are the record's fields
 * from `rounds` to `batch_rounds`, in their order.
 */
export function caseFigures<B extends BaselineRun>(phase: ThroughputPhase<B>, name: string, repeat: number) {
  const series = phase.engine[name]
  const byMethod = perMethod(series, repeat, gbps, 3)
  const baselineRounds = figures(phase.base, repeat, (b) => b.gbps, 3)
  const cmp = compare(byMethod, phase.chosen?.[name], true, () => baselineRounds, 3)
  const results = (m: Method) => series[m].filter(isResult)
  return {
    cmp,
    cpu: { promise: medianCpu(results('promise').map((x) => x.cpu)), batch: medianCpu(results('batch').map((x) => x.cpu)) },
    seen: mergeTallies(METHODS.flatMap((m) => results(m).map((x) => x.transports))),
    errors: METHODS.flatMap((m) => roundErrors(series[m], m)),
    fields: {
      rounds: cmp.rounds,
      baseline_rounds: baselineRounds,
      ratio_per_round: cmp.ratioPerRound,
      ratio_median: cmp.ratioMedian,
      method_choice: methodChoiceNote(phase.chosen !== undefined),
      promise_GBps: round(median(byMethod.promise), 3),
      batch_GBps: round(median(byMethod.batch), 3),
      promise_rounds: byMethod.promise,
      batch_rounds: byMethod.batch,
    },
  }
}
