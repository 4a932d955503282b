/**
 * The `tcp` suite: Ferry's TCP transport over loopback, between this process and a target
 * engine in a child process (bench/target.ts).
 *
 *   write-1MiB       1 MiB WRITEs, many in flight, GB/s, hot working set   vs iperf3 -l 1M (same run)
 *   read-1MiB        1 MiB READs, many in flight, GB/s, hot working set    vs iperf3 -l 1M (same run)
 *   write-1MiB-cold  the same WRITEs over the cold working set             vs iperf3 -l 1M (same run)
 *   read-1MiB-cold   the same READs over the cold working set              vs iperf3 -l 1M (same run)
 *   read-4KiB-p50    one 4 KiB READ at a time, p50 in µs                   vs pure-Node TCP request/answer
 *
 * Locality: iperf3 -l 1M sends from one reused 1 MiB buffer, which stays in CPU cache. The
 * primary cases (write-1MiB, read-1MiB) cycle their 1 MiB blocks through a working set of the
 * same kind, `--working-set` MiB on each side (default 8), so their ratio compares like with
 * like. The `-cold` cases cycle through `--cold-working-set` MiB on each side (default 256,
 * pre-touched), DRAM-bound, against the same iperf3 rounds, so the gap between the two shows
 * what locality costs; `--no-cold` skips them. Each record names its `working_set_MiB` and
 * `locality`. One region of max(hot, cold) bytes per side holds both (the hot set is its
 * first `--working-set` MiB); the 4 KiB latency reads span the whole region.
 *
 * Throughput is measured two ways, the Promise API with a window of outstanding calls and
 * the batch API (submitTransfer, getBatchStatus polled with backoff); latency two ways, the
 * Promise API and the batch API with a spin on getTransferStatus. Each record reports the
 * better method as `value` and names it in `method`; both figures are in the record.
 */
import { Engine } from '../../index'
import { startIperf3Loopback, type Iperf3Result } from '../baselines/iperf3'
import { startNodeTcpLatency, type LatencyBaselineSession } from '../baselines/node_tcp_lat'
import { log } from '../lib/log'
import {
  MiB,
  METHODS,
  ORDER_NOTE,
  attempt,
  betterByMedian,
  bothFit,
  hostLoad,
  isResult,
  latencyBatch,
  latencyMethodLabel,
  latencyPromise,
  medianCpu,
  mergeTallies,
  roundErrors,
  startTarget,
  throughputBatch,
  throughputMethodLabel,
  throughputPromise,
  unexpectedTransports,
  type LatencyRun,
  type Method,
  type Opcode,
  type Rig,
  type Rounds,
  type ThroughputResult,
} from '../lib/rig'
import { median, ratio, round, summarize } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'tcp'

/** One throughput case: an opcode over a working set of a given locality. */
interface ThroughputCase {
  /** Record name: write-1MiB, read-1MiB, write-1MiB-cold, read-1MiB-cold. */
  name: string
  opcode: Opcode
  /** Bytes cycled through on each side, from offset 0. */
  workingSetBytes: number
  locality: string
  /** For a cold case, the name of the hot case it is compared with. */
  hotCase?: string
}

const HOT_LOCALITY = "hot (like iperf3's reused 1 MiB buffer)"
const coldLocality = (bytes: number) => `cold (${bytes / MiB} MiB per side, DRAM-bound)`

/** The throughput cases to run: hot write and read, then (unless --no-cold) cold ones. */
function throughputCases(options: SuiteOptions, chunk: number): ThroughputCase[] {
  const label = `${chunk / MiB}MiB`
  const cases: ThroughputCase[] = (['write', 'read'] as const).map((opcode) => ({
    name: `${opcode}-${label}`,
    opcode,
    workingSetBytes: options.workingSetBytes,
    locality: HOT_LOCALITY,
  }))
  if (options.cold) {
    for (const opcode of ['write', 'read'] as const) {
      cases.push({
        name: `${opcode}-${label}-cold`,
        opcode,
        workingSetBytes: options.coldWorkingSetBytes,
        locality: coldLocality(options.coldWorkingSetBytes),
        hotCase: `${opcode}-${label}`,
      })
    }
  }
  return cases
}

interface ThroughputPhase {
  /** Per case name. */
  engine: Record<string, Record<Method, Rounds<ThroughputResult>>>
  /** One iperf3 run per round, the baseline of every case of that round. */
  iperf: Iperf3Result[]
  /** Set when rounds after the first measured only this method (budget); per case name. */
  chosen?: Record<string, Method>
  hostLoad: Record<string, number | null>
}

/**
 * `repeat` rounds of: each case in turn (write, read, then write-cold, read-cold; both
 * methods, or the one chosen in round 1), then one iperf3 client run, the baseline of every
 * case of the round; odd rounds in that order, even rounds reversed. The warm-up runs in
 * round 1 only: the target, its connections and the working sets are reused, and one iperf3
 * server serves every client run.
 */
async function throughputPhase(rig: Rig, chunk: number, cases: ThroughputCase[]): Promise<ThroughputPhase> {
  const { options } = rig
  const phase: ThroughputPhase = {
    engine: Object.fromEntries(cases.map((c) => [c.name, { promise: [], batch: [] }])),
    iperf: [],
    hostLoad: Object.fromEntries(cases.map((c) => [c.name, null])),
  }
  const iperf = startIperf3Loopback('1M')
  const phaseStart = Date.now()
  try {
    for (let r = 0; r < options.repeat; r++) {
      const roundStart = Date.now()
      const warm = r === 0 ? options.warmupSeconds : 0
      const forward = r % 2 === 0
      const tag = `tcp: round ${r + 1}/${options.repeat}`
      const engineStep = async (c: ThroughputCase) => {
        if (r === 0) phase.hostLoad[c.name] = hostLoad()
        const methods = phase.chosen ? [phase.chosen[c.name]] : forward ? [...METHODS] : [...METHODS].reverse()
        for (const m of methods) {
          log(`${tag}: ${c.name} (${c.workingSetBytes / MiB} MiB working set), ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`)
          const res = await attempt(`${tag} ${c.name} ${m}`, () =>
            m === 'promise'
              ? throughputPromise(rig, c.opcode, chunk, c.workingSetBytes, warm)
              : throughputBatch(rig, c.opcode, chunk, c.workingSetBytes, warm),
          )
          phase.engine[c.name][m][r] = res
          if (isResult(res)) log(`${tag}: ${c.name} ${m} ${res.gbps.toFixed(3)} GB/s, cpu ${JSON.stringify(res.cpu)}`)
        }
      }
      const iperfStep = async () => {
        const res = await iperf.run(options.durationSeconds, warm)
        phase.iperf[r] = res
        log(`${tag}: iperf3 ${res.gbps === null ? `unavailable (${res.note})` : `${res.gbps.toFixed(3)} GB/s`}`)
      }
      const steps = [...cases.map((c) => () => engineStep(c)), iperfStep]
      for (const step of forward ? steps : steps.reverse()) await step()

      if (r === 0 && options.repeat > 1 && !bothFit(options, phaseStart, Date.now() - roundStart)) {
        const pick = (c: ThroughputCase): Method => {
          const e = phase.engine[c.name]
          const fig = (x: ThroughputResult | Error | undefined) => (isResult(x) ? x.gbps : null)
          return betterByMedian({ promise: [fig(e.promise[0])], batch: [fig(e.batch[0])] }, true)
        }
        const chosen: Record<string, Method> = Object.fromEntries(cases.map((c) => [c.name, pick(c)]))
        phase.chosen = chosen
        log(`tcp: both methods every round would exceed --budget ${options.budgetSeconds} s; using ${cases.map((c) => `${c.name} ${chosen[c.name]}`).join(', ')} from round 2`)
      }
    }
  } finally {
    await iperf.close()
  }
  return phase
}

function throughputRecord(c: ThroughputCase, cases: ThroughputCase[], phase: ThroughputPhase, options: SuiteOptions): CaseRecord {
  const series = phase.engine[c.name]
  const figures = (rounds: Rounds<ThroughputResult>) =>
    Array.from({ length: options.repeat }, (_, r) => {
      const x = rounds[r]
      return isResult(x) ? round(x.gbps, 3) : null
    })
  const perMethod: Record<Method, Array<number | null>> = { promise: figures(series.promise), batch: figures(series.batch) }
  const method = phase.chosen ? phase.chosen[c.name] : betterByMedian(perMethod, true)
  const rounds = perMethod[method]
  const baselineRounds = Array.from({ length: options.repeat }, (_, r) => {
    const g = phase.iperf[r]?.gbps
    return typeof g === 'number' ? round(g, 3) : null
  })
  const value = round(median(rounds), 3)
  const baselineValue = round(median(baselineRounds), 3)
  const ratioPerRound = rounds.map((v, r) => ratio(v, baselineRounds[r]))
  const cpus = (m: Method) => series[m].filter(isResult).map((x) => x.cpu)
  const iperfOk = phase.iperf.filter((i) => i.gbps !== null)
  const record: CaseRecord = {
    suite: SUITE,
    case: c.name,
    value,
    unit: 'GB/s',
    working_set_MiB: c.workingSetBytes / MiB,
    locality: c.locality,
    baseline: phase.iperf.find((i) => i.label)?.label ?? 'iperf3 -l 1M',
    baseline_value: baselineValue,
    ratio: ratio(value, baselineValue),
    method: throughputMethodLabel(method, options),
    rounds,
    baseline_rounds: baselineRounds,
    ratio_per_round: ratioPerRound,
    ratio_median: round(median(ratioPerRound), 3),
    method_choice: phase.chosen
      ? 'picked in round 1 and used after (both methods every round would exceed --budget)'
      : 'both methods measured every round; the better median',
    promise_GBps: round(median(perMethod.promise), 3),
    batch_GBps: round(median(perMethod.batch), 3),
    promise_rounds: perMethod.promise,
    batch_rounds: perMethod.batch,
    cpu_pct: {
      promise: medianCpu(cpus('promise')),
      batch: medianCpu(cpus('batch')),
      iperf3: iperfOk.length
        ? {
            sender: round(median(iperfOk.map((i) => i.senderCpu ?? null)), 0),
            receiver: round(median(iperfOk.map((i) => i.receiverCpu ?? null)), 0),
          }
        : null,
    },
    baseline_note: `one iperf3 run per round (one reused 1 MiB buffer, cache-resident), the baseline of ${cases.map((x) => x.name).join(', ')} in that round`,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: phase.hostLoad[c.name],
  }
  if (c.hotCase !== undefined) {
    // What locality costs: this (cold) case over its hot counterpart, same rounds.
    const hot = phase.engine[c.hotCase]
    const hotMethod = phase.chosen ? phase.chosen[c.hotCase] : betterByMedian({ promise: figures(hot.promise), batch: figures(hot.batch) }, true)
    const hotRounds = figures(hot[hotMethod])
    const hotValue = round(median(hotRounds), 3)
    record.hot_case = c.hotCase
    record.hot_value = hotValue
    record.cold_vs_hot = ratio(value, hotValue)
    record.cold_vs_hot_per_round = rounds.map((v, r) => ratio(v, hotRounds[r]))
  }
  const errors = METHODS.flatMap((m) => roundErrors(series[m], m))
  const seen = mergeTallies(METHODS.flatMap((m) => series[m].filter(isResult).map((x) => x.transports)))
  record.tasks_by_transport = seen
  const other = unexpectedTransports(seen, 'tcp')
  if (other) errors.unshift(`transport: expected every task over tcp, saw ${other}`)
  if (errors.length) record.error = errors.join('; ')
  const notes = [...new Set(phase.iperf.map((i) => i.note).filter((n): n is string => !!n))]
  if (notes.length) record.note = notes.join('; ')
  return record
}

interface LatencyPhase {
  engine: Record<Method, Rounds<LatencyRun>>
  base: Rounds<number[]>
  chosen?: Method
  hostLoad: number | null
}

/**
 * `repeat` rounds of: engine 4 KiB READ latency (both methods, or the one chosen in round
 * 1), then the pure-Node baseline; odd rounds in that order, even rounds reversed. One
 * baseline server and connection serve every round, as one target serves the engine; the
 * warm-up runs in round 1 only.
 */
async function latencyPhase(rig: Rig, bytes: number): Promise<LatencyPhase> {
  const { options } = rig
  const phase: LatencyPhase = { engine: { promise: [], batch: [] }, base: [], hostLoad: hostLoad() }
  const phaseStart = Date.now()
  let base: LatencyBaselineSession | Error | undefined
  try {
    for (let r = 0; r < options.repeat; r++) {
      const roundStart = Date.now()
      const warm = r === 0 ? options.warmupSeconds : 0
      const forward = r % 2 === 0
      const tag = `tcp: round ${r + 1}/${options.repeat}`
      const engineStep = async () => {
        const methods = phase.chosen ? [phase.chosen] : forward ? [...METHODS] : [...METHODS].reverse()
        for (const m of methods) {
          log(`${tag}: read ${bytes / 1024} KiB latency, ${m} API (${options.latencyOps} ops${warm > 0 ? `, ${warm} s warm-up` : ''})`)
          const res = await attempt(`${tag} latency ${m}`, () =>
            m === 'promise' ? latencyPromise(rig, bytes, warm) : latencyBatch(rig, bytes, warm),
          )
          phase.engine[m][r] = res
          if (isResult(res)) log(`${tag}: latency ${m} p50 ${summarize(res.samples).p50.toFixed(1)} us (n ${res.samples.length})`)
        }
      }
      const baseStep = async () => {
        log(`${tag}: baseline node tcp request/answer ${bytes / 1024} KiB (${options.latencyOps} ops)`)
        if (base === undefined) base = await attempt('latency baseline start', () => startNodeTcpLatency(bytes))
        const session = base
        const res =
          session instanceof Error
            ? session
            : await attempt(`${tag} latency baseline`, () =>
                session.run({ ops: options.latencyOps, warmupSeconds: warm, maxSeconds: options.latencyMaxSeconds }),
              )
        phase.base[r] = res
        if (isResult(res)) log(`${tag}: baseline p50 ${summarize(res).p50.toFixed(1)} us (n ${res.length})`)
      }
      const steps = [engineStep, baseStep]
      for (const step of forward ? steps : steps.reverse()) await step()

      if (r === 0 && options.repeat > 1 && !bothFit(options, phaseStart, Date.now() - roundStart)) {
        const fig = (x: LatencyRun | Error | undefined) => (isResult(x) && x.samples.length ? summarize(x.samples).p50 : null)
        phase.chosen = betterByMedian({ promise: [fig(phase.engine.promise[0])], batch: [fig(phase.engine.batch[0])] }, false)
        log(`tcp: both latency methods every round would exceed --budget ${options.budgetSeconds} s; using ${phase.chosen} from round 2`)
      }
    }
  } finally {
    const session: LatencyBaselineSession | Error | undefined = base
    if (session !== undefined && !(session instanceof Error)) await session.close()
  }
  return phase
}

function latencyRecord(phase: LatencyPhase, bytes: number, spanBytes: number, options: SuiteOptions): CaseRecord {
  const p50s = (runs: Array<number[] | undefined>) =>
    Array.from({ length: options.repeat }, (_, r) => {
      const s = runs[r]
      return s && s.length ? round(summarize(s).p50, 1) : null
    })
  const samplesOf = (m: Method) => phase.engine[m].map((x) => (isResult(x) ? x.samples : undefined))
  const baseSamples = phase.base.map((x) => (isResult(x) ? x : undefined))
  const perMethod: Record<Method, Array<number | null>> = { promise: p50s(samplesOf('promise')), batch: p50s(samplesOf('batch')) }
  const method = phase.chosen ?? betterByMedian(perMethod, false)
  const rounds = perMethod[method]
  const baselineRounds = p50s(baseSamples)
  const value = round(median(rounds), 1)
  const baselineValue = round(median(baselineRounds), 1)
  const ratioPerRound = rounds.map((v, r) => ratio(v, baselineRounds[r]))
  /** Summary of all rounds' samples pooled (tails need the numbers). */
  const pooled = (runs: Array<number[] | undefined>) => {
    const all = runs.flatMap((s) => s ?? [])
    if (all.length === 0) return null
    const r = summarize(all)
    return { n: r.n, p50: round(r.p50, 1), p90: round(r.p90, 1), p99: round(r.p99, 1), p999: round(r.p999, 1), mean: round(r.mean, 1) }
  }
  const cpus = (m: Method) => phase.engine[m].filter(isResult).map((x) => x.cpu)
  const record: CaseRecord = {
    suite: SUITE,
    case: `read-${bytes / 1024}KiB-p50`,
    value,
    unit: 'us',
    baseline: `node tcp request/answer ${bytes / 1024} KiB`,
    baseline_value: baselineValue,
    ratio: ratio(value, baselineValue),
    method: latencyMethodLabel(method),
    lower_is_better: true,
    rounds,
    baseline_rounds: baselineRounds,
    ratio_per_round: ratioPerRound,
    ratio_median: round(median(ratioPerRound), 3),
    method_choice: phase.chosen
      ? 'picked in round 1 and used after (both methods every round would exceed --budget)'
      : 'both methods measured every round; the better median',
    promise_p50_us: round(median(perMethod.promise), 1),
    batch_p50_us: round(median(perMethod.batch), 1),
    promise_rounds: perMethod.promise,
    batch_rounds: perMethod.batch,
    promise_us: pooled(samplesOf('promise')),
    batch_us: pooled(samplesOf('batch')),
    baseline_us: pooled(baseSamples),
    pooled_note: 'promise_us, batch_us, baseline_us pool the samples of all rounds',
    cpu_pct: {
      promise: medianCpu(cpus('promise')),
      batch: medianCpu(cpus('batch')),
    },
    ops_per_round: options.latencyOps,
    working_set_MiB: spanBytes / MiB,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: phase.hostLoad,
  }
  const errors = [...METHODS.flatMap((m) => roundErrors(phase.engine[m], m)), ...roundErrors(phase.base, 'baseline')]
  const seen = mergeTallies(METHODS.flatMap((m) => phase.engine[m].filter(isResult).map((x) => x.transports)))
  record.tasks_by_transport = seen
  const other = unexpectedTransports(seen, 'tcp')
  if (other) errors.unshift(`transport: expected every task over tcp, saw ${other}`)
  if (errors.length) record.error = errors.join('; ')
  return record
}

export async function tcpSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  const chunk = MiB
  const latBytes = 4096

  // One target and one pre-touched region on each side, reused by every round: the hot
  // cases use its first --working-set MiB, the cold cases its first --cold-working-set MiB,
  // the latency reads all of it (as before: 256 MiB by default, with or without --no-cold).
  const regionBytes = Math.max(options.workingSetBytes, options.coldWorkingSetBytes)
  const cases = throughputCases(options, chunk)
  const target = await startTarget(regionBytes)
  let engine: Engine | undefined
  try {
    // The target is on this host: with the default transports (['shm', 'tcp']) the engine
    // would serve it over shm. This suite measures tcp, so tcp is the only one enabled here.
    engine = await Engine.create({ listen: '127.0.0.1:0', transports: ['tcp'] })
    const local = engine.allocate(regionBytes)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(target.segment)
    const rig: Rig = { engine, local, regionBytes, remote, remoteBuffer: target.buffer, target, options }

    log(`tcp: throughput, ${options.repeat} rounds of ${cases.map((c) => c.name).join(' + ')} + iperf3, ${options.durationSeconds} s each`)
    const tput = await throughputPhase(rig, chunk, cases)
    for (const c of cases) records.push(throughputRecord(c, cases, tput, options))

    log(`tcp: latency, ${options.repeat} rounds of engine + pure-Node baseline, ${options.latencyOps} ops each`)
    const lat = await latencyPhase(rig, latBytes)
    records.push(latencyRecord(lat, latBytes, regionBytes, options))
  } finally {
    await engine?.close()
    await target.stop()
  }
  return records
}
