/**
 * The 4 KiB latency phase of the `tcp` and `shm` suites: rounds of one operation at a time
 * with both API methods (or the one chosen in round 1), then the suite's other steps (a
 * baseline, the shm batch-of-64 loop); see bench/lib/rounds.ts for the order.
 */
import { latencyBatch, latencyPromise, medianCpu, type LatencyRun, type Opcode, type Rig } from './rig'
import { METHODS, hostLoad, isResult, methodChoiceNote, perMethod, roundErrors, runRounds, type Method, type RoundContext, type RoundsOutcome } from './rounds'
import { median, pooledSummary, round, summarize } from './stats'

/** The phase's one entry. */
export const LATENCY = 'latency'

export interface LatencyPhase extends RoundsOutcome<typeof LATENCY, LatencyRun> {
  /** Load average when the phase began. */
  hostLoad: number | null
}

/** p50 of a run's samples, µs; null for none. */
export const p50 = (samples: number[]) => (samples.length ? summarize(samples).p50 : null)

/** Runs the rounds of `bytes` `opcode`s; `others` are the suite's other steps of a round. */
export async function latencyPhase(
  suite: string,
  rig: Rig,
  bytes: number,
  opcode: Opcode,
  others: ReadonlyArray<(ctx: RoundContext) => Promise<void>>,
): Promise<LatencyPhase> {
  const { options } = rig
  const load = hostLoad()
  const outcome = await runRounds<typeof LATENCY, LatencyRun>({
    suite,
    options,
    entries: [LATENCY],
    starting: (_, m, { tag, warm }) =>
      `${tag}: ${opcode} ${bytes / 1024} KiB latency, ${m} API (${options.latencyOps} ops${warm > 0 ? `, ${warm} s warm-up` : ''})`,
    measure: (_, m, { warm }) => (m === 'promise' ? latencyPromise(rig, bytes, warm, opcode) : latencyBatch(rig, bytes, warm, opcode)),
    finished: (_, m, res, { tag }) => `${tag}: latency ${m} p50 ${summarize(res.samples).p50.toFixed(1)} us (n ${res.samples.length})`,
    others,
    figure: (x) => p50(x.samples),
    higherIsBetter: false,
    chooseBy: LATENCY,
    methodsName: 'latency methods',
  })
  return { ...outcome, hostLoad: load }
}

/**
 * The phase's figures: p50 per method and round, the samples by method, CPU shares, tasks
 * by transport and per-round errors; `fields` are the record's fields from `method_choice`
 * to `batch_us`, in their order.
 */
export function latencyFigures(phase: LatencyPhase, repeat: number) {
  const series = phase.engine[LATENCY]
  const byMethod = perMethod(series, repeat, (x) => p50(x.samples), 1)
  const samplesOf = (m: Method) => series[m].map((x) => (isResult(x) ? x.samples : undefined))
  const results = (m: Method) => series[m].filter(isResult)
  return {
    byMethod,
    chosen: phase.chosen?.[LATENCY],
    cpu: { promise: medianCpu(results('promise').map((x) => x.cpu)), batch: medianCpu(results('batch').map((x) => x.cpu)) },
    tallies: METHODS.flatMap((m) => results(m).map((x) => x.transports)),
    errors: METHODS.flatMap((m) => roundErrors(series[m], m)),
    fields: {
      method_choice: methodChoiceNote(phase.chosen !== undefined),
      promise_p50_us: round(median(byMethod.promise), 1),
      batch_p50_us: round(median(byMethod.batch), 1),
      promise_rounds: byMethod.promise,
      batch_rounds: byMethod.batch,
      promise_us: pooledSummary(samplesOf('promise')),
      batch_us: pooledSummary(samplesOf('batch')),
    },
  }
}
