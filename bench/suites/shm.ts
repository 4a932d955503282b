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
import { latencyFigures, latencyPhase, type LatencyPhase } from '../lib/latency'
import { log } from '../lib/log'
import {
  MiB,
  latencyMethodLabel,
  mergeTallies,
  request,
  startTarget,
  tally,
  terminal,
  throughputMethodLabel,
  unexpectedTransports,
  yieldToLoop,
  type Rig,
  type TransportTally,
} from '../lib/rig'
import { ORDER_NOTE, attempt, compare, isResult, roundErrors, type Rounds } from '../lib/rounds'
import { median, nowNs, pooledSummary, round } from '../lib/stats'
import { caseFigures, throughputPhase, type ThroughputCase, type ThroughputPhase } from '../lib/throughput'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'shm'
const TRANSPORT = 'shm'
const TARGET_RATIO = 0.85

/** write-1MiB and read-1MiB over the whole working set. */
const cases = (regionBytes: number): ThroughputCase[] => [
  { name: 'write-1MiB', opcode: 'write', workingSetBytes: regionBytes },
  { name: 'read-1MiB', opcode: 'read', workingSetBytes: regionBytes },
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

function throughputRecord(c: ThroughputCase, phase: ThroughputPhase<MemcpyResult>, memcpy: MemcpySession, rig: Rig): CaseRecord {
  const { options } = rig
  const { cmp, cpu, seen, errors, fields } = caseFigures(phase, c.name, options.repeat)
  const record: CaseRecord = {
    suite: SUITE,
    case: c.name,
    value: cmp.value,
    unit: 'GB/s',
    working_set_MiB: rig.regionBytes / MiB,
    locality: `cold (${rig.regionBytes / MiB} MiB per side, pre-touched, DRAM-bound)`,
    baseline: memcpy.label,
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    target_ratio: TARGET_RATIO,
    meets_target: cmp.ratio === null ? null : cmp.ratio >= TARGET_RATIO,
    method: throughputMethodLabel(cmp.method, options),
    transport: TRANSPORT,
    tasks_by_transport: seen,
    ...fields,
    cpu_pct: cpu,
    baseline_note: `one memcpy run per round, the baseline of ${cases(rig.regionBytes).map((x) => x.name).join(', ')} in that round; GB/s = payload bytes / s / 1e9 on both sides`,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: phase.hostLoad[c.name],
  }
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

/**
 * `repeat` rounds of: Promise API, batch API with spin, batch-of-64 loop (odd rounds in that
 * order, even rounds reversed). No baseline. The warm-up runs in round 1 only.
 */
async function latencyRounds(rig: Rig, bytes: number): Promise<{ phase: LatencyPhase; batch64: Rounds<Batch64Run> }> {
  const { options } = rig
  const batch64: Rounds<Batch64Run> = []
  const phase = await latencyPhase(SUITE, rig, bytes, 'write', [
    async ({ round: r, tag, warm }) => {
      log(`${tag}: batches of ${BATCH64_TASKS} x ${bytes / 1024} KiB writes (${options.latencyOps} ops${warm > 0 ? `, ${warm} s warm-up` : ''})`)
      const res = await attempt(`${tag} batch64`, () => batch64Run(rig, bytes, warm))
      batch64[r] = res
      if (isResult(res)) log(`${tag}: batch64 ${(res.ops / res.seconds).toFixed(0)} ops/s, ${((res.seconds * 1e6) / res.ops).toFixed(2)} us/op`)
    },
  ])
  return { phase, batch64 }
}

function latencyRecord(phase: LatencyPhase, batch64: Rounds<Batch64Run>, bytes: number, rig: Rig): CaseRecord {
  const { options } = rig
  const { byMethod, chosen, cpu, tallies, errors, fields } = latencyFigures(phase, options.repeat)
  const cmp = compare(byMethod, chosen, false, () => [], 1)

  // The batch-of-64 loop: ops/s per round (ops over the timed seconds), medians over rounds.
  const b64 = batch64.map((x) => (isResult(x) ? x : undefined))
  const opsPerS = Array.from({ length: options.repeat }, (_, r) => {
    const x = b64[r]
    return x && x.seconds > 0 ? round(x.ops / x.seconds, 0) : null
  })
  const submitPerOp = b64.map((x) => (x && x.ops > 0 ? x.submitUs.reduce((a, v) => a + v, 0) / x.ops : null))
  const b64OpsPerS = round(median(opsPerS), 0)
  const b64PerOpUs = b64OpsPerS ? round(1e6 / b64OpsPerS, 3) : null
  const batchTimes = pooledSummary(b64.map((x) => x?.batchUs))

  const seen = mergeTallies([...tallies, ...b64.filter((x): x is Batch64Run => x !== undefined).map((x) => x.transports)])
  const record: CaseRecord = {
    suite: SUITE,
    case: `write-${bytes / 1024}KiB-p50`,
    value: cmp.value,
    unit: 'us',
    baseline: 'none',
    baseline_value: null,
    ratio: null,
    note: 'aim: single-digit µs natively',
    method: latencyMethodLabel(cmp.method, 'write'),
    lower_is_better: true,
    transport: TRANSPORT,
    tasks_by_transport: seen,
    rounds: cmp.rounds,
    ...fields,
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
    cpu_pct: cpu,
    ops_per_round: options.latencyOps,
    working_set_MiB: rig.regionBytes / MiB,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: 'rounds alternate the order: odd rounds promise, batch, batch64; even rounds reversed',
    host_load: phase.hostLoad,
  }
  errors.push(...roundErrors(batch64, 'batch64'))
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

    const shmCases = cases(regionBytes)
    log(`shm: throughput, ${options.repeat} rounds of ${shmCases.map((c) => c.name).join(' + ')} + memcpy, ${options.durationSeconds} s each`)
    const session = memcpy
    const tput = await throughputPhase(SUITE, rig, chunk, shmCases, { name: 'memcpy', run: (s, warm) => session.run(s, warm) }, true)
    for (const c of shmCases) {
      const rec = throughputRecord(c, tput, memcpy, rig)
      rec.remote_transports = offered
      records.push(rec)
    }
    await memcpy.close()

    log(`shm: latency, ${options.repeat} rounds of promise + batch + batch64, ${options.latencyOps} ops each`)
    const lat = await latencyRounds(rig, latBytes)
    const rec = latencyRecord(lat.phase, lat.batch64, latBytes, rig)
    rec.remote_transports = offered
    records.push(rec)
  } finally {
    await memcpy?.close()
    await engine?.close()
    await target.stop()
  }
  return records
}
