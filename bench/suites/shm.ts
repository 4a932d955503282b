/**
 * The `shm` suite: Ferry's shared-memory transport, between this process and a target
 * engine in a child process (bench/target.ts) on the same host. Both engines run with the
 * default transports (['shm', 'tcp']); same-host transfers go over shm, and every case
 * checks that they did (TaskStatus.transport of every task it saw): a task served by
 * anything else puts an `error` on the record.
 *
 *   write-1MiB      1 MiB WRITEs, many in flight, GB/s     vs memcpy, 1 thread (same run)
 *   read-1MiB       1 MiB READs, many in flight, GB/s      vs memcpy, 1 thread (same run)
 *   write-4KiB-p50  one 4 KiB WRITE at a time, p50 in µs   no baseline (aim: single-digit µs natively)
 *
 * Working set: the 1 MiB requests cycle through `--shm-working-set` MiB on each side
 * (default 1024, pre-touched), DRAM-bound; the baseline, bench/baselines/memcpy_bench.c
 * (compiled at run time with gcc -O2), copies 1 MiB blocks through a source and a
 * destination of the same size, pre-touched, on one thread. One baseline run per round
 * serves both throughput cases of that round. Target: ratio >= 0.85.
 *
 * Throughput is measured two ways, the Promise API with a window of outstanding calls and
 * the batch API (submitTransfer, getBatchStatus polled with backoff); latency two ways, the
 * Promise API (await engine.write) and the batch API with a spin on getTransferStatus. Each
 * record reports the better method as `value` and names it in `method`; both figures are in
 * the record. The latency record also carries `batch64`: the per-op time of a tight loop of
 * batches of 64 x 4 KiB WRITEs (allocateBatch, submitTransfer, spin on getBatchStatus,
 * freeBatch), one batch at a time.
 */
import { Engine, TransferStatus, type TransferRequest } from '../../index'
import { startMemcpyBaseline, type MemcpyResult, type MemcpySession } from '../baselines/memcpy'
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
  request,
  roundErrors,
  startTarget,
  tally,
  terminal,
  throughputBatch,
  throughputMethodLabel,
  throughputPromise,
  unexpectedTransports,
  yieldToLoop,
  type LatencyRun,
  type Method,
  type Opcode,
  type Rig,
  type Rounds,
  type ThroughputResult,
  type TransportTally,
} from '../lib/rig'
import { median, nowNs, ratio, round, summarize } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'shm'
const TRANSPORT = 'shm'
const TARGET_RATIO = 0.85

interface ShmCase {
  name: string
  opcode: Opcode
}

const CASES: ShmCase[] = [
  { name: 'write-1MiB', opcode: 'write' },
  { name: 'read-1MiB', opcode: 'read' },
]

/** The check every record gets: every task it saw was served by shm. */
function transportError(seen: TransportTally): string | undefined {
  const total = Object.values(seen).reduce((a, n) => a + n, 0)
  if (total === 0) return undefined // nothing completed; the run errors say why
  const other = unexpectedTransports(seen, TRANSPORT)
  return other ? `transport: expected every task over ${TRANSPORT}, saw ${other} (of ${total})` : undefined
}

// ---------------------------------------------------------------------------------------
// Throughput: write-1MiB, read-1MiB, memcpy baseline, interleaved rounds.
// ---------------------------------------------------------------------------------------

interface ThroughputPhase {
  engine: Record<string, Record<Method, Rounds<ThroughputResult>>>
  /** One memcpy run per round, the baseline of both cases of that round. */
  base: MemcpyResult[]
  chosen?: Record<string, Method>
  hostLoad: Record<string, number | null>
}

/**
 * `repeat` rounds of: write-1MiB, read-1MiB (both methods, or the one chosen in round 1),
 * then one memcpy run; odd rounds in that order, even rounds reversed. The warm-up runs in
 * round 1 only.
 */
async function throughputPhase(rig: Rig, chunk: number, memcpy: MemcpySession): Promise<ThroughputPhase> {
  const { options } = rig
  const phase: ThroughputPhase = {
    engine: Object.fromEntries(CASES.map((c) => [c.name, { promise: [], batch: [] }])),
    base: [],
    hostLoad: Object.fromEntries(CASES.map((c) => [c.name, null])),
  }
  const phaseStart = Date.now()
  for (let r = 0; r < options.repeat; r++) {
    const roundStart = Date.now()
    const warm = r === 0 ? options.warmupSeconds : 0
    const forward = r % 2 === 0
    const tag = `shm: round ${r + 1}/${options.repeat}`
    const engineStep = async (c: ShmCase) => {
      if (r === 0) phase.hostLoad[c.name] = hostLoad()
      const methods = phase.chosen ? [phase.chosen[c.name]] : forward ? [...METHODS] : [...METHODS].reverse()
      for (const m of methods) {
        log(`${tag}: ${c.name} (${rig.regionBytes / MiB} MiB working set), ${throughputMethodLabel(m, options)}${warm > 0 ? `, ${warm} s warm-up` : ''}`)
        const res = await attempt(`${tag} ${c.name} ${m}`, () =>
          m === 'promise'
            ? throughputPromise(rig, c.opcode, chunk, rig.regionBytes, warm)
            : throughputBatch(rig, c.opcode, chunk, rig.regionBytes, warm),
        )
        phase.engine[c.name][m][r] = res
        if (isResult(res)) log(`${tag}: ${c.name} ${m} ${res.gbps.toFixed(3)} GB/s, cpu ${JSON.stringify(res.cpu)}, tasks ${JSON.stringify(res.transports)}`)
      }
    }
    const baseStep = async () => {
      const res = await memcpy.run(options.durationSeconds, warm)
      phase.base[r] = res
      log(`${tag}: memcpy ${res.gbps === null ? `unavailable (${res.note})` : `${res.gbps.toFixed(3)} GB/s`}`)
    }
    const steps = [...CASES.map((c) => () => engineStep(c)), baseStep]
    for (const step of forward ? steps : steps.reverse()) await step()

    if (r === 0 && options.repeat > 1 && !bothFit(options, phaseStart, Date.now() - roundStart)) {
      const pick = (c: ShmCase): Method => {
        const e = phase.engine[c.name]
        const fig = (x: ThroughputResult | Error | undefined) => (isResult(x) ? x.gbps : null)
        return betterByMedian({ promise: [fig(e.promise[0])], batch: [fig(e.batch[0])] }, true)
      }
      const chosen: Record<string, Method> = Object.fromEntries(CASES.map((c) => [c.name, pick(c)]))
      phase.chosen = chosen
      log(`shm: both methods every round would exceed --budget ${options.budgetSeconds} s; using ${CASES.map((c) => `${c.name} ${chosen[c.name]}`).join(', ')} from round 2`)
    }
  }
  return phase
}

function throughputRecord(c: ShmCase, phase: ThroughputPhase, memcpy: MemcpySession, rig: Rig): CaseRecord {
  const { options } = rig
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
    const g = phase.base[r]?.gbps
    return typeof g === 'number' ? round(g, 3) : null
  })
  const value = round(median(rounds), 3)
  const baselineValue = round(median(baselineRounds), 3)
  const ratioValue = ratio(value, baselineValue)
  const ratioPerRound = rounds.map((v, r) => ratio(v, baselineRounds[r]))
  const cpus = (m: Method) => series[m].filter(isResult).map((x) => x.cpu)
  const seen = mergeTallies(METHODS.flatMap((m) => series[m].filter(isResult).map((x) => x.transports)))
  const record: CaseRecord = {
    suite: SUITE,
    case: c.name,
    value,
    unit: 'GB/s',
    working_set_MiB: rig.regionBytes / MiB,
    locality: `cold (${rig.regionBytes / MiB} MiB per side, pre-touched, DRAM-bound)`,
    baseline: memcpy.label,
    baseline_value: baselineValue,
    ratio: ratioValue,
    target_ratio: TARGET_RATIO,
    meets_target: ratioValue === null ? null : ratioValue >= TARGET_RATIO,
    method: throughputMethodLabel(method, options),
    transport: TRANSPORT,
    tasks_by_transport: seen,
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
    cpu_pct: { promise: medianCpu(cpus('promise')), batch: medianCpu(cpus('batch')) },
    baseline_note: `one memcpy run per round, the baseline of ${CASES.map((x) => x.name).join(', ')} in that round; GB/s = payload bytes / s / 1e9 on both sides`,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: phase.hostLoad[c.name],
  }
  const errors = METHODS.flatMap((m) => roundErrors(series[m], m))
  const wrong = transportError(seen)
  if (wrong) errors.unshift(wrong)
  if (errors.length) record.error = errors.join('; ')
  const notes = [...new Set(phase.base.map((b) => b.note).filter((n): n is string => !!n))]
  if (notes.length) record.note = notes.join('; ')
  return record
}

// ---------------------------------------------------------------------------------------
// Latency: write-4KiB-p50 (Promise API, batch API with spin), plus the batch-of-64 loop.
// ---------------------------------------------------------------------------------------

interface Batch64Run {
  /** Timed µs per batch (allocate, submit, spin until terminal, free). */
  batchUs: number[]
  /** µs inside submitTransfer per batch. */
  submitUs: number[]
  ops: number
  /** Sum of the timed parts, seconds. */
  seconds: number
  transports: TransportTally
}

const BATCH64_TASKS = 64

/**
 * A tight loop of batches of `BATCH64_TASKS` WRITEs of `bytes`, one batch at a time:
 * allocateBatch, submitTransfer, spin on getBatchStatus until terminal, freeBatch. The
 * checks of every batch (status of each task and its transport) run between the timed
 * parts. About `--lat-ops` WRITEs per run, bounded by `--lat-max`.
 */
async function batch64Run(rig: Rig, bytes: number, warmupSeconds: number): Promise<Batch64Run> {
  const { engine, options } = rig
  const slots = Math.floor(rig.regionBytes / bytes)
  const transports: TransportTally = {}
  let next = 0
  const list = (): TransferRequest[] =>
    Array.from({ length: BATCH64_TASKS }, () => request(rig, 'write', (next++ % slots) * bytes, bytes))
  /** One batch; its timed µs and submit µs. */
  const one = (): [number, number] => {
    const reqs = list()
    const t0 = nowNs()
    const batch = engine.allocateBatch(BATCH64_TASKS)
    let t1 = 0
    let t2 = 0
    try {
      const s0 = nowNs()
      engine.submitTransfer(batch, reqs)
      const s1 = nowNs()
      const giveUp = s1 + 10e9
      let st = engine.getBatchStatus(batch)
      while (!terminal(st.status)) {
        st = engine.getBatchStatus(batch)
        if (nowNs() > giveUp) throw new Error(`batch64: a batch of ${BATCH64_TASKS} x ${bytes / 1024} KiB writes did not finish in 10 s`)
      }
      t1 = nowNs()
      // untimed: every task's status and transport
      const tasks = engine.getTransferStatusList(batch)
      if (st.status !== TransferStatus.COMPLETED) {
        const bad = tasks.find((t) => t.status !== TransferStatus.COMPLETED)
        throw new Error(`batch64: batch ended ${st.name}: ${bad?.code ?? ''} ${bad?.message ?? ''}`)
      }
      for (const t of tasks) tally(transports, t.transport)
      t2 = nowNs()
      engine.freeBatch(batch)
      const t3 = nowNs()
      return [(t1 - t0 + (t3 - t2)) / 1000, (s1 - s0) / 1000]
    } catch (err) {
      if (t2 === 0) {
        try {
          engine.freeBatch(batch)
        } catch {
          // engine closing
        }
      }
      throw err
    }
  }
  const warmEnd = Date.now() + warmupSeconds * 1000
  while (Date.now() < warmEnd) one()
  const run: Batch64Run = { batchUs: [], submitUs: [], ops: 0, seconds: 0, transports }
  const deadline = Date.now() + options.latencyMaxSeconds * 1000
  let lastYield = Date.now()
  while (run.ops < options.latencyOps && Date.now() < deadline) {
    const [us, submitUs] = one()
    run.batchUs.push(us)
    run.submitUs.push(submitUs)
    run.ops += BATCH64_TASKS
    run.seconds += us / 1e6
    if (Date.now() - lastYield > 10) {
      await yieldToLoop()
      lastYield = Date.now()
    }
  }
  return run
}

type LatencyMethod = Method | 'batch64'

interface LatencyPhase {
  engine: Record<Method, Rounds<LatencyRun>>
  batch64: Rounds<Batch64Run>
  chosen?: Method
  hostLoad: number | null
}

/**
 * `repeat` rounds of: Promise API, batch API with spin, batch-of-64 loop (odd rounds in that
 * order, even rounds reversed). No baseline. The warm-up runs in round 1 only.
 */
async function latencyPhase(rig: Rig, bytes: number): Promise<LatencyPhase> {
  const { options } = rig
  const phase: LatencyPhase = { engine: { promise: [], batch: [] }, batch64: [], hostLoad: hostLoad() }
  const phaseStart = Date.now()
  for (let r = 0; r < options.repeat; r++) {
    const roundStart = Date.now()
    const warm = r === 0 ? options.warmupSeconds : 0
    const forward = r % 2 === 0
    const tag = `shm: round ${r + 1}/${options.repeat}`
    const methods: LatencyMethod[] = [...(phase.chosen ? [phase.chosen] : METHODS), 'batch64']
    for (const m of forward ? methods : methods.reverse()) {
      const what = m === 'batch64' ? `batches of ${BATCH64_TASKS} x ${bytes / 1024} KiB writes` : `write ${bytes / 1024} KiB latency, ${m} API`
      log(`${tag}: ${what} (${options.latencyOps} ops${warm > 0 ? `, ${warm} s warm-up` : ''})`)
      if (m === 'batch64') {
        const res = await attempt(`${tag} batch64`, () => batch64Run(rig, bytes, warm))
        phase.batch64[r] = res
        if (isResult(res)) log(`${tag}: batch64 ${(res.ops / res.seconds).toFixed(0)} ops/s, ${((res.seconds * 1e6) / res.ops).toFixed(2)} us/op`)
      } else {
        const res = await attempt(`${tag} latency ${m}`, () =>
          m === 'promise' ? latencyPromise(rig, bytes, warm, 'write') : latencyBatch(rig, bytes, warm, 'write'),
        )
        phase.engine[m][r] = res
        if (isResult(res)) log(`${tag}: latency ${m} p50 ${summarize(res.samples).p50.toFixed(1)} us (n ${res.samples.length})`)
      }
    }
    if (r === 0 && options.repeat > 1 && !bothFit(options, phaseStart, Date.now() - roundStart)) {
      const fig = (x: LatencyRun | Error | undefined) => (isResult(x) && x.samples.length ? summarize(x.samples).p50 : null)
      phase.chosen = betterByMedian({ promise: [fig(phase.engine.promise[0])], batch: [fig(phase.engine.batch[0])] }, false)
      log(`shm: both latency methods every round would exceed --budget ${options.budgetSeconds} s; using ${phase.chosen} from round 2`)
    }
  }
  return phase
}

function latencyRecord(phase: LatencyPhase, bytes: number, rig: Rig): CaseRecord {
  const { options } = rig
  const p50s = (runs: Array<number[] | undefined>) =>
    Array.from({ length: options.repeat }, (_, r) => {
      const s = runs[r]
      return s && s.length ? round(summarize(s).p50, 1) : null
    })
  const samplesOf = (m: Method) => phase.engine[m].map((x) => (isResult(x) ? x.samples : undefined))
  const perMethod: Record<Method, Array<number | null>> = { promise: p50s(samplesOf('promise')), batch: p50s(samplesOf('batch')) }
  const method = phase.chosen ?? betterByMedian(perMethod, false)
  const rounds = perMethod[method]
  const value = round(median(rounds), 1)
  const pooled = (runs: Array<number[] | undefined>) => {
    const all = runs.flatMap((s) => s ?? [])
    if (all.length === 0) return null
    const r = summarize(all)
    return { n: r.n, p50: round(r.p50, 1), p90: round(r.p90, 1), p99: round(r.p99, 1), p999: round(r.p999, 1), mean: round(r.mean, 1) }
  }
  const cpus = (m: Method) => phase.engine[m].filter(isResult).map((x) => x.cpu)

  // The batch-of-64 loop: ops/s per round (ops over the timed seconds), medians over rounds.
  const b64 = phase.batch64.map((x) => (isResult(x) ? x : undefined))
  const opsPerS = Array.from({ length: options.repeat }, (_, r) => {
    const x = b64[r]
    return x && x.seconds > 0 ? round(x.ops / x.seconds, 0) : null
  })
  const submitPerOp = b64.map((x) => (x && x.ops > 0 ? x.submitUs.reduce((a, v) => a + v, 0) / x.ops : null))
  const b64OpsPerS = round(median(opsPerS), 0)
  const b64PerOpUs = b64OpsPerS ? round(1e6 / b64OpsPerS, 3) : null
  const batchTimes = pooled(b64.map((x) => x?.batchUs))

  const seen = mergeTallies([
    ...METHODS.flatMap((m) => phase.engine[m].filter(isResult).map((x) => x.transports)),
    ...b64.filter((x): x is Batch64Run => x !== undefined).map((x) => x.transports),
  ])
  const record: CaseRecord = {
    suite: SUITE,
    case: `write-${bytes / 1024}KiB-p50`,
    value,
    unit: 'us',
    baseline: 'none',
    baseline_value: null,
    ratio: null,
    note: 'aim: single-digit µs natively',
    method: latencyMethodLabel(method, 'write'),
    lower_is_better: true,
    transport: TRANSPORT,
    tasks_by_transport: seen,
    rounds,
    method_choice: phase.chosen
      ? 'picked in round 1 and used after (both methods every round would exceed --budget)'
      : 'both methods measured every round; the better median',
    promise_p50_us: round(median(perMethod.promise), 1),
    batch_p50_us: round(median(perMethod.batch), 1),
    promise_rounds: perMethod.promise,
    batch_rounds: perMethod.batch,
    promise_us: pooled(samplesOf('promise')),
    batch_us: pooled(samplesOf('batch')),
    pooled_note: 'promise_us, batch_us pool the samples of all rounds',
    batch64_ops_per_s: b64OpsPerS,
    batch64_per_op_us: b64PerOpUs,
    batch64: {
      tasks_per_batch: BATCH64_TASKS,
      bytes_per_task: bytes,
      ops_per_s: b64OpsPerS,
      per_op_us: b64PerOpUs,
      ops_per_s_rounds: opsPerS,
      submit_us_per_op: round(median(submitPerOp), 3),
      batch_us: batchTimes,
      loop: `allocateBatch(${BATCH64_TASKS}) + submitTransfer(${BATCH64_TASKS} x ${bytes / 1024} KiB WRITE) + spin on getBatchStatus until terminal + freeBatch, one batch at a time; per-task status and transport checks between the timed parts; ops/s = ops / timed seconds, median over rounds`,
    },
    cpu_pct: { promise: medianCpu(cpus('promise')), batch: medianCpu(cpus('batch')) },
    ops_per_round: options.latencyOps,
    working_set_MiB: rig.regionBytes / MiB,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: 'rounds alternate the order: odd rounds promise, batch, batch64; even rounds reversed',
    host_load: phase.hostLoad,
  }
  const errors = [...METHODS.flatMap((m) => roundErrors(phase.engine[m], m)), ...roundErrors(phase.batch64, 'batch64')]
  const wrong = transportError(seen)
  if (wrong) errors.unshift(wrong)
  if (errors.length) record.error = errors.join('; ')
  return record
}

export async function shmSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  const chunk = MiB
  const latBytes = 4096
  const regionBytes = options.shmWorkingSetBytes
  const target = await startTarget(regionBytes)
  let engine: Engine | undefined
  let memcpy: MemcpySession | undefined
  try {
    // Default transports (['shm', 'tcp']): same-host transfers should go over shm.
    engine = await Engine.create({ listen: '127.0.0.1:0' })
    const local = engine.allocate(regionBytes)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(target.segment)
    const offered = remote.buffers.find((b) => b.id === target.buffer)?.transports ?? []
    log(`shm: target buffer ${target.buffer} offers ${JSON.stringify(offered)}`)
    const rig: Rig = { engine, local, regionBytes, remote, remoteBuffer: target.buffer, target, options }
    memcpy = await startMemcpyBaseline(regionBytes, chunk)

    log(`shm: throughput, ${options.repeat} rounds of ${CASES.map((c) => c.name).join(' + ')} + memcpy, ${options.durationSeconds} s each`)
    const tput = await throughputPhase(rig, chunk, memcpy)
    for (const c of CASES) {
      const rec = throughputRecord(c, tput, memcpy, rig)
      rec.remote_transports = offered
      records.push(rec)
    }
    await memcpy.close()

    log(`shm: latency, ${options.repeat} rounds of promise + batch + batch64, ${options.latencyOps} ops each`)
    const lat = await latencyPhase(rig, latBytes)
    const rec = latencyRecord(lat, latBytes, rig)
    rec.remote_transports = offered
    records.push(rec)
  } finally {
    await memcpy?.close()
    await engine?.close()
    await target.stop()
  }
  return records
}
