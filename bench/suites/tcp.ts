/**
 * The `tcp` suite: Ferry's TCP transport over loopback, between this process and a target
 * engine in a child process (bench/target.ts).
 *
 *   write-1MiB     1 MiB WRITEs, many in flight, GB/s       vs iperf3 -l 1M (same run)
 *   read-1MiB      1 MiB READs, many in flight, GB/s        vs iperf3 -l 1M (same run)
 *   read-4KiB-p50  one 4 KiB READ at a time, p50 in µs      vs pure-Node TCP request/answer
 *
 * Throughput is measured two ways, the Promise API with a window of outstanding calls and
 * the batch API (submitTransfer, getBatchStatus polled with backoff); latency two ways, the
 * Promise API and the batch API with a spin on getTransferStatus. Each record reports the
 * better method as `value` and names it in `method`; both figures are in the record.
 */
import * as path from 'node:path'
import { Engine, TransferStatus, type IoRequest, type Region, type Segment, type TransferRequest } from '../../index'
import { iperf3Loopback, type Iperf3Result } from '../baselines/iperf3'
import { nodeTcpLatency } from '../baselines/node_tcp_lat'
import { jsonLines, startTsx, stopChild, tailStderr } from '../lib/children'
import { log } from '../lib/log'
import { blockFor, nowNs, ratio, round, summarize } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const MiB = 1 << 20
const SUITE = 'tcp'

type Opcode = 'read' | 'write'

/** CPU time of this process and of the target over a measured phase, as % of one CPU. */
interface CpuShare {
  local: number | null
  target: number | null
}

interface ThroughputResult {
  gbps: number
  bytes: number
  seconds: number
  cpu: CpuShare
}

/** The target process and what this engine needs to reach it. */
interface Target {
  ask(cmd: string): Promise<Record<string, unknown>>
  stop(): Promise<void>
  segment: string
  buffer: number
}

async function startTarget(bytes: number): Promise<Target> {
  const proc = startTsx('target engine', path.join(__dirname, '..', 'target.ts'), [], {
    FERRY_BENCH_BYTES: String(bytes),
  })
  const stderr = tailStderr(proc)
  const lines = jsonLines(proc, () => stderr())
  try {
    const hello = await lines.next(30_000)
    log(`target pid ${proc.pid} ready: segment ${String(hello.segment)}, ${bytes / MiB} MiB pre-touched`)
    // One command at a time: replies come back in order.
    let chain: Promise<unknown> = Promise.resolve()
    const ask = (cmd: string) => {
      const p = chain.then(() => {
        proc.stdin!.write(cmd + '\n')
        return lines.next(10_000)
      })
      chain = p.catch(() => undefined)
      return p
    }
    return {
      ask,
      segment: String(hello.segment),
      buffer: Number(hello.buffer),
      async stop() {
        lines.close()
        proc.stdin?.end()
        await stopChild(proc)
      },
    }
  } catch (err) {
    lines.close()
    await stopChild(proc)
    throw err
  }
}

/** Measures CPU use of both processes between `begin()` and `end()`. */
function cpuMeter(target: Target) {
  let local0: NodeJS.CpuUsage | undefined
  let t0 = 0
  let remote0: Promise<Record<string, unknown> | null> | undefined
  const remoteCpu = () => target.ask('cpu').catch(() => null)
  return {
    begin() {
      t0 = nowNs()
      local0 = process.cpuUsage()
      remote0 = remoteCpu()
    },
    async end(): Promise<CpuShare> {
      const wallUs = (nowNs() - t0) / 1000
      const local = process.cpuUsage(local0)
      const [a, b] = await Promise.all([remote0, remoteCpu()])
      const used = (r: Record<string, unknown>) => Number(r.user_us) + Number(r.system_us)
      return {
        local: round(((local.user + local.system) / wallUs) * 100, 0),
        target: a && b ? round(((used(b) - used(a)) / wallUs) * 100, 0) : null,
      }
    },
  }
}

interface Rig {
  engine: Engine
  local: Region
  remote: Segment
  remoteBuffer: number
  target: Target
  options: SuiteOptions
}

function request(rig: Rig, opcode: Opcode, offset: number, length: number): TransferRequest {
  return {
    opcode,
    local: rig.local,
    localOffset: offset,
    remote: rig.remote,
    remoteBuffer: rig.remoteBuffer,
    remoteOffset: offset,
    length,
  }
}

/** The same, for the Promise calls (`engine.read` / `engine.write`). */
function ioRequest(rig: Rig, offset: number, length: number): IoRequest {
  return { local: rig.local, localOffset: offset, remote: rig.remote, remoteBuffer: rig.remoteBuffer, remoteOffset: offset, length }
}

function timeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no completion within ${ms} ms`)), ms)
    }),
  ]).finally(() => clearTimeout(timer))
}

const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve))

/**
 * Promise API: `window` lanes, each awaiting one 1 MiB call after another over the working
 * set. Bytes completed between the end of the warm-up and the end of the measurement, over
 * that time.
 */
async function throughputPromise(rig: Rig, opcode: Opcode, chunk: number): Promise<ThroughputResult> {
  const { engine, options } = rig
  const slots = Math.floor(options.workingSetBytes / chunk)
  const meter = cpuMeter(rig.target)
  let next = 0
  let completed = 0
  let stop = false
  let startBytes = 0
  let startNs = 0
  let endBytes = 0
  let endNs = 0
  let cpu: Promise<CpuShare> | undefined
  const requests = Array.from({ length: slots }, (_, i) => ioRequest(rig, i * chunk, chunk))
  const lane = async () => {
    while (!stop) {
      const io = requests[next++ % slots]
      if (opcode === 'write') await engine.write(io)
      else await engine.read(io)
      completed += chunk
    }
  }
  const warm = setTimeout(() => {
    startBytes = completed
    startNs = nowNs()
    meter.begin()
  }, options.warmupSeconds * 1000)
  const finish = setTimeout(
    () => {
      endBytes = completed
      endNs = nowNs()
      cpu = meter.end()
      stop = true
    },
    (options.warmupSeconds + options.durationSeconds) * 1000,
  )
  try {
    const lanes = Array.from({ length: options.window }, lane)
    await timeout(Promise.all(lanes), (options.warmupSeconds + options.durationSeconds + 15) * 1000, `${opcode} (promise)`)
  } finally {
    clearTimeout(warm)
    clearTimeout(finish)
    stop = true
  }
  const seconds = (endNs - startNs) / 1e9
  return { gbps: (endBytes - startBytes) / seconds / 1e9, bytes: endBytes - startBytes, seconds, cpu: await cpu! }
}

const terminal = (s: TransferStatus) => s !== TransferStatus.WAITING && s !== TransferStatus.PENDING

/**
 * Batch API: `batchesInFlight` batches of `batchTasks` 1 MiB tasks outstanding; the batches
 * are polled with getBatchStatus, backing off (Atomics.wait, 10 µs doubling to 1 ms) while
 * none has finished, and a finished one is freed and replaced at once.
 */
async function throughputBatch(rig: Rig, opcode: Opcode, chunk: number): Promise<ThroughputResult> {
  const { engine, options } = rig
  const slots = Math.floor(options.workingSetBytes / chunk)
  const perBatch = options.batchTasks
  const meter = cpuMeter(rig.target)
  const requests = Array.from({ length: slots }, (_, i) => request(rig, opcode, i * chunk, chunk))
  const inflight: number[] = []
  let next = 0
  let completed = 0
  const submit = () => {
    const batch = engine.allocateBatch(perBatch)
    const list: TransferRequest[] = []
    for (let j = 0; j < perBatch; j++) list.push(requests[next++ % slots])
    engine.submitTransfer(batch, list)
    inflight.push(batch)
  }
  /** Polls every outstanding batch once; returns how many finished. */
  const poll = () => {
    let finished = 0
    for (let i = 0; i < inflight.length; ) {
      const batch = inflight[i]
      const st = engine.getBatchStatus(batch)
      if (!terminal(st.status)) {
        i++
        continue
      }
      if (st.status !== TransferStatus.COMPLETED) {
        const bad = engine.getTransferStatusList(batch).find((t) => t.status !== TransferStatus.COMPLETED)
        throw new Error(`batch ${opcode} ended ${st.name}: ${bad?.code ?? ''} ${bad?.message ?? ''}`)
      }
      completed += st.transferredBytes
      engine.freeBatch(batch)
      inflight.splice(i, 1)
      finished++
    }
    return finished
  }

  const t0 = nowNs()
  const warmEnd = t0 + options.warmupSeconds * 1e9
  const measureEnd = warmEnd + options.durationSeconds * 1e9
  const hardEnd = measureEnd + 15e9
  let startBytes = -1
  let startNs = 0
  let endBytes = 0
  let endNs = 0
  let backoffUs = 10
  let lastYield = nowNs()
  try {
    for (;;) {
      const now = nowNs()
      if (startBytes < 0 && now >= warmEnd) {
        startBytes = completed
        startNs = now
        meter.begin()
      }
      if (now >= measureEnd) {
        endBytes = completed
        endNs = now
        break
      }
      while (inflight.length < options.batchesInFlight) submit()
      if (poll() > 0) {
        backoffUs = 10
      } else {
        blockFor(backoffUs)
        backoffUs = Math.min(backoffUs * 2, 1000)
      }
      // Let the event loop breathe now and then (the target's CPU replies arrive there).
      if (now - lastYield > 5e6) {
        await yieldToLoop()
        lastYield = nowNs()
      }
    }
    const cpu = meter.end()
    // Drain what is still outstanding, bounded.
    while (inflight.length > 0) {
      if (nowNs() > hardEnd) throw new Error(`batch ${opcode}: ${inflight.length} batches unfinished at the deadline`)
      if (poll() === 0) blockFor(200)
    }
    const seconds = (endNs - startNs) / 1e9
    return { gbps: (endBytes - startBytes) / seconds / 1e9, bytes: endBytes - startBytes, seconds, cpu: await cpu }
  } finally {
    for (const batch of inflight.splice(0)) {
      try {
        engine.freeBatch(batch)
      } catch {
        // engine closing
      }
    }
  }
}

function throughputRecord(
  caseName: string,
  promise: ThroughputResult | Error,
  batch: ThroughputResult | Error,
  iperf: Iperf3Result,
  options: SuiteOptions,
): CaseRecord {
  const ok = (r: ThroughputResult | Error): r is ThroughputResult => !(r instanceof Error)
  const candidates = [
    { method: `promise (window ${options.window})`, r: promise },
    { method: `batch (${options.batchesInFlight} x ${options.batchTasks} tasks, polled with backoff)`, r: batch },
  ].filter((c): c is { method: string; r: ThroughputResult } => ok(c.r))
  const best = candidates.sort((a, b) => b.r.gbps - a.r.gbps)[0]
  const value = best ? round(best.r.gbps, 3) : null
  const record: CaseRecord = {
    suite: SUITE,
    case: caseName,
    value,
    unit: 'GB/s',
    baseline: iperf.label,
    baseline_value: iperf.gbps === null ? null : round(iperf.gbps, 3),
    ratio: ratio(value, iperf.gbps === null ? null : round(iperf.gbps, 3)),
    method: best?.method,
    promise_GBps: ok(promise) ? round(promise.gbps, 3) : null,
    batch_GBps: ok(batch) ? round(batch.gbps, 3) : null,
    cpu_pct: {
      promise: ok(promise) ? promise.cpu : null,
      batch: ok(batch) ? batch.cpu : null,
      iperf3: iperf.gbps === null ? null : { sender: round(iperf.senderCpu ?? NaN, 0), receiver: round(iperf.receiverCpu ?? NaN, 0) },
    },
    working_set_MiB: options.workingSetBytes / MiB,
    seconds: options.durationSeconds,
  }
  const errors = [promise, batch].filter((r): r is Error => r instanceof Error).map((e) => e.message)
  if (errors.length) record.error = errors.join('; ')
  if (iperf.note) record.note = iperf.note
  return record
}

async function attempt<T>(what: string, fn: () => Promise<T>): Promise<T | Error> {
  try {
    return await fn()
  } catch (err) {
    log(`${what} failed: ${(err as Error).stack ?? String(err)}`)
    return err instanceof Error ? err : new Error(String(err))
  }
}

interface LatencyRun {
  samples: number[]
  cpu: CpuShare
}

/** Promise API: `await engine.read` of `bytes`, one at a time; µs per call. */
async function latencyPromise(rig: Rig, bytes: number): Promise<LatencyRun> {
  const { engine, options } = rig
  const slots = Math.floor(options.workingSetBytes / bytes)
  const requests = Array.from({ length: slots }, (_, i) => ioRequest(rig, i * bytes, bytes))
  const samples: number[] = []
  const warmEnd = Date.now() + options.warmupSeconds * 1000
  let i = 0
  while (Date.now() < warmEnd) await timeout(engine.read(requests[i++ % slots]), 10_000, 'latency warm-up read')
  const meter = cpuMeter(rig.target)
  meter.begin()
  const deadline = Date.now() + options.latencyMaxSeconds * 1000
  while (samples.length < options.latencyOps && Date.now() < deadline) {
    const io = requests[i++ % slots]
    const t0 = nowNs()
    await engine.read(io)
    samples.push((nowNs() - t0) / 1000)
  }
  return { samples, cpu: await meter.end() }
}

/**
 * Batch API: submitTransfer of one `bytes` READ, then spin on getTransferStatus until the
 * task is terminal; µs per op. Batches of 1024 tasks are reused and replaced (untimed).
 */
async function latencyBatch(rig: Rig, bytes: number): Promise<LatencyRun> {
  const { engine, options } = rig
  const slots = Math.floor(options.workingSetBytes / bytes)
  const requests = Array.from({ length: slots }, (_, i) => [request(rig, 'read', i * bytes, bytes)])
  const capacity = 1024
  let batch = engine.allocateBatch(capacity)
  let used = 0
  const samples: number[] = []
  let i = 0
  const one = (): number => {
    if (used === capacity) {
      engine.freeBatch(batch)
      batch = engine.allocateBatch(capacity)
      used = 0
    }
    const list = requests[i++ % slots]
    const t0 = nowNs()
    const task = engine.submitTransfer(batch, list)
    used++
    const giveUp = t0 + 10e9
    let st = engine.getTransferStatus(batch, task)
    while (!terminal(st.status)) {
      st = engine.getTransferStatus(batch, task)
      if (nowNs() > giveUp) throw new Error('batch latency: a 4 KiB read did not finish in 10 s')
    }
    const t1 = nowNs()
    if (st.status !== TransferStatus.COMPLETED) throw new Error(`batch latency: read ended ${st.name}: ${st.code ?? ''} ${st.message ?? ''}`)
    return (t1 - t0) / 1000
  }
  try {
    const warmEnd = Date.now() + options.warmupSeconds * 1000
    let lastYield = Date.now()
    while (Date.now() < warmEnd) one()
    const meter = cpuMeter(rig.target)
    meter.begin()
    const deadline = Date.now() + options.latencyMaxSeconds * 1000
    while (samples.length < options.latencyOps && Date.now() < deadline) {
      samples.push(one())
      // Spinning blocks the event loop; give it a turn every 10 ms (outside any timed op).
      if (Date.now() - lastYield > 10) {
        await yieldToLoop()
        lastYield = Date.now()
      }
    }
    return { samples, cpu: await meter.end() }
  } finally {
    try {
      engine.freeBatch(batch)
    } catch {
      // engine closing
    }
  }
}

type Summary = ReturnType<typeof summarize> & { cpu?: CpuShare }

const summarizeRun = (run: LatencyRun): Summary => ({ ...summarize(run.samples), cpu: run.cpu })

function latencyRecord(promise: Summary | Error, batch: Summary | Error, base: Summary | Error, bytes: number): CaseRecord {
  const ok = (r: Summary | Error): r is Summary => !(r instanceof Error) && r.n > 0
  const candidates = [
    { method: 'promise (await engine.read)', r: promise },
    { method: 'batch (submitTransfer + spin on getTransferStatus)', r: batch },
  ].filter((c): c is { method: string; r: Summary } => ok(c.r))
  const best = candidates.sort((a, b) => a.r.p50 - b.r.p50)[0]
  const value = best ? round(best.r.p50, 1) : null
  const baseValue = ok(base) ? round(base.p50, 1) : null
  const brief = (r: Summary | Error) =>
    ok(r) ? { n: r.n, p50: round(r.p50, 1), p90: round(r.p90, 1), p99: round(r.p99, 1), p999: round(r.p999, 1), mean: round(r.mean, 1) } : null
  const record: CaseRecord = {
    suite: SUITE,
    case: `read-${bytes / 1024}KiB-p50`,
    value,
    unit: 'us',
    baseline: `node tcp request/answer ${bytes / 1024} KiB`,
    baseline_value: baseValue,
    ratio: ratio(value, baseValue),
    method: best?.method,
    lower_is_better: true,
    promise_p50_us: ok(promise) ? round(promise.p50, 1) : null,
    batch_p50_us: ok(batch) ? round(batch.p50, 1) : null,
    promise_us: brief(promise),
    batch_us: brief(batch),
    baseline_us: brief(base),
    cpu_pct: {
      promise: ok(promise) ? promise.cpu : null,
      batch: ok(batch) ? batch.cpu : null,
    },
  }
  const errors = [promise, batch, base].filter((r): r is Error => r instanceof Error).map((e) => e.message)
  if (errors.length) record.error = errors.join('; ')
  return record
}

export async function tcpSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  const chunk = MiB
  const latBytes = 4096

  log(`tcp: baseline iperf3 (${options.warmupSeconds} s omitted + ${options.durationSeconds} s)`)
  const iperf = await iperf3Loopback(options.durationSeconds, options.warmupSeconds, '1M')
  log(`tcp: iperf3 ${iperf.gbps === null ? `unavailable (${iperf.note})` : `${iperf.gbps.toFixed(3)} GB/s`}`)

  const target = await startTarget(options.workingSetBytes)
  const engine = await Engine.create({ listen: '127.0.0.1:0' })
  try {
    const local = engine.allocate(options.workingSetBytes)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(target.segment)
    const rig: Rig = { engine, local, remote, remoteBuffer: target.buffer, target, options }

    for (const opcode of ['write', 'read'] as const) {
      log(`tcp: ${opcode} 1 MiB, promise API, window ${options.window}`)
      const p = await attempt(`${opcode} promise`, () => throughputPromise(rig, opcode, chunk))
      if (!(p instanceof Error)) log(`tcp: ${opcode} promise ${p.gbps.toFixed(3)} GB/s, cpu ${JSON.stringify(p.cpu)}`)
      log(`tcp: ${opcode} 1 MiB, batch API, ${options.batchesInFlight} x ${options.batchTasks}`)
      const b = await attempt(`${opcode} batch`, () => throughputBatch(rig, opcode, chunk))
      if (!(b instanceof Error)) log(`tcp: ${opcode} batch ${b.gbps.toFixed(3)} GB/s, cpu ${JSON.stringify(b.cpu)}`)
      records.push(throughputRecord(`${opcode}-1MiB`, p, b, iperf, options))
    }

    log(`tcp: read 4 KiB latency, promise API (${options.latencyOps} ops)`)
    const lp = await attempt('latency promise', async () => summarizeRun(await latencyPromise(rig, latBytes)))
    log(`tcp: read 4 KiB latency, batch API with spin (${options.latencyOps} ops)`)
    const lb = await attempt('latency batch', async () => summarizeRun(await latencyBatch(rig, latBytes)))
    log(`tcp: baseline node tcp request/answer 4 KiB (${options.latencyOps} ops)`)
    const base = await attempt('latency baseline', async () =>
      summarize(
        await nodeTcpLatency({
          messageBytes: latBytes,
          ops: options.latencyOps,
          warmupSeconds: options.warmupSeconds,
          maxSeconds: options.latencyMaxSeconds,
        }),
      ),
    )
    records.push(latencyRecord(lp, lb, base, latBytes))
  } finally {
    await engine.close()
    await target.stop()
  }
  return records
}
