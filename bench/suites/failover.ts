/**
 * The `failover` suite: what failover costs. 1 MiB WRITEs to a target engine in a child
 * process (bench/target.ts) on the same host, so that shm is the primary transport, from
 * two engines in this process, both with the default transports (['shm', 'tcp']):
 *
 *   clean   no faults
 *   faulty  faults: [{ transport: 'shm', corruptCompletionRate: --fault-rate (0.1), seed:
 *           --fault-seed (7) }]: that share of shm attempts is reported FAILED after the
 *           copy, and the engine fails the task over to tcp, which serves it again
 *
 *   write-1MiB-shm-faults   GB/s of the faulty engine   vs the clean engine (same run, same method)
 *
 * Both engines cycle their 1 MiB blocks through `--failover-working-set` MiB on each side
 * (default 256, pre-touched) and are measured interleaved in `--repeat` rounds (odd rounds
 * clean first, even rounds faulty first), each with the Promise API (window of outstanding
 * calls) and the batch API (polled with backoff; enableAutoFailoverOnPoll is on by
 * default). `value` is the faulty engine's better method, `baseline_value` the clean
 * engine's figure with that same method, `ratio` = faulty / clean. The record carries
 * `engine.metrics().failovers` of both engines and the share of tasks served by each
 * transport (TaskStatus.transport of every task the runs saw, warm-up included).
 */
import type { Engine, FaultOptions } from '../../index'
import { log } from '../lib/log'
import {
  MiB,
  medianCpu,
  mergeTallies,
  openRig,
  startTarget,
  throughputBatch,
  throughputMethodLabel,
  throughputPromise,
  unexpectedTransports,
  type Rig,
  type ThroughputResult,
  type TransportTally,
} from '../lib/rig'
import { METHODS, compare, hostLoad, isResult, perMethod, roundErrors, runRounds, type Method, type RoundsOutcome } from '../lib/rounds'
import { median, round } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'failover'

type Side = 'clean' | 'faulty'
const SIDES: readonly Side[] = ['clean', 'faulty']

interface FaultyRun extends ThroughputResult {
  /** metrics().failovers and tasksFailed gained during the run. */
  failovers: number
  tasksFailed: number
}

type Phase = RoundsOutcome<Side, FaultyRun> & { hostLoad: number | null }

/** Share of the tasks per transport, 3 decimals. */
function shares(t: TransportTally): Record<string, number | null> {
  const total = Object.values(t).reduce((a, n) => a + n, 0)
  return Object.fromEntries(Object.entries(t).map(([k, n]) => [k, total ? round(n / total, 3) : null]))
}

export async function failoverSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const chunk = MiB
  const regionBytes = options.failoverWorkingSetBytes
  const fault: FaultOptions = { transport: 'shm', corruptCompletionRate: options.faultRate, seed: options.faultSeed }
  const target = await startTarget(regionBytes)
  const rigs: Partial<Record<Side, Rig>> = {}
  try {
    rigs.clean = await openRig(target, regionBytes, options, {})
    rigs.faulty = await openRig(target, regionBytes, options, { faults: [fault] })
    const rig = rigs as Record<Side, Rig>
    const load = hostLoad()
    log(`failover: ${options.repeat} rounds of clean + faulty (${JSON.stringify(fault)}), ${options.durationSeconds} s each, ${regionBytes / MiB} MiB working set`)
    const outcome = await runRounds<Side, FaultyRun>({
      suite: SUITE,
      options,
      entries: SIDES,
      starting: (side, m, { tag, warm }) =>
        `${tag}: ${side} write-1MiB, ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`,
      measure: async (side, m, { warm }) => {
        const engine = rig[side].engine
        const before = engine.metrics()
        const t =
          m === 'promise'
            ? await throughputPromise(rig[side], 'write', chunk, regionBytes, warm)
            : await throughputBatch(rig[side], 'write', chunk, regionBytes, warm)
        const after = engine.metrics()
        return { ...t, failovers: after.failovers - before.failovers, tasksFailed: after.tasksFailed - before.tasksFailed }
      },
      finished: (side, m, res, { tag }) =>
        `${tag}: ${side} ${m} ${res.gbps.toFixed(3)} GB/s, tasks ${JSON.stringify(res.attempts)}, failovers ${res.failovers}`,
      figure: (x) => x.gbps,
      higherIsBetter: true,
      // The faulty engine is what is measured; the clean one is its baseline.
      chooseBy: 'faulty',
    })
    const phase: Phase = { ...outcome, hostLoad: load }
    const metrics = { clean: rig.clean.engine.metrics(), faulty: rig.faulty.engine.metrics() }
    return [record(phase, metrics, fault, regionBytes, options)]
  } finally {
    for (const side of SIDES) await rigs[side]?.engine.close()
    await target.stop()
  }
}

function record(
  phase: Phase,
  metrics: Record<Side, ReturnType<Engine['metrics']>>,
  fault: FaultOptions,
  regionBytes: number,
  options: SuiteOptions,
): CaseRecord {
  const per = (side: Side) => perMethod(phase.engine[side], options.repeat, (x) => x.gbps, 3)
  const faulty = per('faulty')
  const clean = per('clean')
  // The clean engine's figures with the faulty engine's method are the baseline.
  const cmp = compare(faulty, phase.chosen?.faulty, true, (m) => clean[m], 3)
  const method = cmp.method
  const results = (side: Side, m?: Method) => (m ? [m] : METHODS).flatMap((x) => phase.engine[side][x].filter(isResult))
  const seen = (side: Side, m?: Method) => mergeTallies(results(side, m).map((x) => x.transports))
  const faultyTasks = seen('faulty')
  const cleanTasks = seen('clean')
  const sum = (xs: number[]) => xs.reduce((a, v) => a + v, 0)
  const rec: CaseRecord = {
    suite: SUITE,
    case: 'write-1MiB-shm-faults',
    value: cmp.value,
    unit: 'GB/s',
    baseline: `the same 1 MiB WRITEs from an engine without faults (same run, same method: ${method})`,
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    method: throughputMethodLabel(method, options),
    fault,
    primary_transport: 'shm',
    fallback_transport: 'tcp',
    failovers: metrics.faulty.failovers,
    failovers_clean: metrics.clean.failovers,
    failovers_note: 'engine.metrics().failovers at the end (every run, warm-up included); failovers_per_round: gained during each round\'s runs of the faulty engine',
    failovers_per_round: Array.from({ length: options.repeat }, (_, r) =>
      sum(METHODS.map((m) => phase.engine.faulty[m][r]).filter(isResult).map((x) => x.failovers)),
    ),
    tasks_failed: metrics.faulty.tasksFailed,
    tasks_by_transport: faultyTasks,
    tasks_by_attempts: mergeTallies(results('faulty').map((x) => x.attempts)),
    transport_share: shares(faultyTasks),
    transport_share_by_method: { promise: shares(seen('faulty', 'promise')), batch: shares(seen('faulty', 'batch')) },
    clean_tasks_by_transport: cleanTasks,
    clean_transport_share: shares(cleanTasks),
    share_note: 'tasks by the transport that finally served them (TaskStatus.transport), over every run, warm-up included; tasks_by_attempts keys are transport@attempts (tcp@2: served by tcp at the second attempt, after a failover; tcp@1: sent to tcp first)',
    rounds: cmp.rounds,
    baseline_rounds: cmp.baselineRounds,
    ratio_per_round: cmp.ratioPerRound,
    ratio_median: cmp.ratioMedian,
    method_choice: phase.chosen
      ? 'picked in round 1 (faulty engine) and used after (both methods every round would exceed --budget)'
      : 'both methods measured every round; the faulty engine\'s better median, compared with the clean engine\'s same method',
    promise_GBps: round(median(faulty.promise), 3),
    batch_GBps: round(median(faulty.batch), 3),
    promise_rounds: faulty.promise,
    batch_rounds: faulty.batch,
    clean_promise_GBps: round(median(clean.promise), 3),
    clean_batch_GBps: round(median(clean.batch), 3),
    clean_promise_rounds: clean.promise,
    clean_batch_rounds: clean.batch,
    cpu_pct: {
      faulty: { promise: medianCpu(results('faulty', 'promise').map((x) => x.cpu)), batch: medianCpu(results('faulty', 'batch').map((x) => x.cpu)) },
      clean: { promise: medianCpu(results('clean', 'promise').map((x) => x.cpu)), batch: medianCpu(results('clean', 'batch').map((x) => x.cpu)) },
    },
    working_set_MiB: regionBytes / MiB,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: 'rounds alternate the order: odd rounds clean engine first, even rounds faulty engine first',
    host_load: phase.hostLoad,
  }
  const errors = [
    ...SIDES.flatMap((side) => METHODS.flatMap((m) => roundErrors(phase.engine[side][m], `${side} ${m}`))),
  ]
  // Sanity of the setup: the clean engine all over shm; the faulty one mostly over shm, the
  // failed-over share over tcp, with failovers counted; no task lost.
  const cleanOther = unexpectedTransports(cleanTasks, 'shm')
  if (cleanOther) errors.unshift(`transport: the clean engine's tasks should all go over shm, saw ${cleanOther}`)
  const faultyTotal = sum(Object.values(faultyTasks))
  if (faultyTotal > 0) {
    const odd = Object.entries(faultyTasks).filter(([k, n]) => k !== 'shm' && k !== 'tcp' && n > 0)
    if (!faultyTasks.shm) errors.unshift('transport: no task of the faulty engine was served by shm (is shm the primary?)')
    if (odd.length) errors.unshift(`transport: the faulty engine saw tasks served by ${odd.map(([k, n]) => `${k} ${n}`).join(', ')}`)
    if ((fault.corruptCompletionRate ?? 0) > 0 && metrics.faulty.failovers === 0) {
      errors.unshift('failover: faults were injected but engine.metrics().failovers stayed 0')
    }
  }
  if (metrics.faulty.tasksFailed > 0 || metrics.clean.tasksFailed > 0) {
    errors.push(`tasks failed: faulty ${metrics.faulty.tasksFailed}, clean ${metrics.clean.tasksFailed}`)
  }
  if (errors.length) rec.error = errors.join('; ')
  return rec
}
