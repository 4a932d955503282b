/**
 * Engine-side machinery shared by the suites of bench/perf.ts: the target engine in a child
 * process (bench/target.ts), CPU metering, the throughput runs (Promise API with a window of
 * outstanding calls; batch API polled with backoff) and the latency runs (Promise API; batch
 * API with a spin on getTransferStatus). The rounds they run in are bench/lib/rounds.ts's.
 *
 * Every run also counts, per transport, the tasks it saw complete (`transports`), so that a
 * suite can check which transport really served it (TaskStatus.transport).
 */
import * as path from 'node:path'
import { Engine, TransferStatus, type EngineOptions, type IoRequest, type Region, type Segment, type TransferRequest } from '../../index'
import { jsonLines, startTsx, stopChild, tailStderr } from './children'
import { log } from './log'
import { blockFor, median, nowNs, round } from './stats'
import type { SuiteOptions } from '../suites/types'
import type { Method } from './rounds'

export const MiB = 1 << 20

export type Opcode = 'read' | 'write'

/** CPU time of this process and of the target over a measured phase, as % of one CPU. */
export interface CpuShare {
  local: number | null
  target: number | null
}

/** Tasks completed per transport that served them (TaskStatus.transport; '?' when unset). */
export type TransportTally = Record<string, number>

/** Adds one task's transport to a tally. */
export function tally(t: TransportTally, transport: string | undefined, n = 1): void {
  const key = transport ?? '?'
  t[key] = (t[key] ?? 0) + n
}

/** Sums tallies. */
export function mergeTallies(tallies: Iterable<TransportTally>): TransportTally {
  const out: TransportTally = {}
  for (const t of tallies) for (const [k, n] of Object.entries(t)) tally(out, k, n)
  return out
}

/** Transports other than `expected` in a tally, as "tcp 3, ? 1"; '' when there are none. */
export function unexpectedTransports(t: TransportTally, expected: string): string {
  return Object.entries(t)
    .filter(([k, n]) => k !== expected && n > 0)
    .map(([k, n]) => `${k} ${n}`)
    .join(', ')
}

export interface ThroughputResult {
  gbps: number
  bytes: number
  seconds: number
  cpu: CpuShare
  /** Every task of the run (warm-up, measurement and drain), by the transport that served it. */
  transports: TransportTally
  /** The same tasks by `transport@attempts` (e.g. `tcp@2`: served by tcp at the second attempt). */
  attempts: TransportTally
}

/** The target process and what this engine needs to reach it. */
export interface Target {
  ask(cmd: string): Promise<Record<string, unknown>>
  stop(): Promise<void>
  segment: string
  buffer: number
  /** The target's process id (signals go to it, by pid). */
  pid: number
}

/** Where and how the target runs (defaults: loopback, this host's identity, no prefix). */
export interface TargetPlacement {
  /** Listen address (`FERRY_BENCH_LISTEN`). */
  listen?: string
  /** Machine identity, so that shm is never chosen towards a "different host". */
  machineId?: string
  /** A command that execs the target, e.g. `ip netns exec NS`. */
  prefix?: string[]
  /** More environment for the target (e.g. FERRY_AUTH_SECRET_FILE). */
  env?: Record<string, string>
}

export async function startTarget(bytes: number, placement: TargetPlacement = {}): Promise<Target> {
  // 30 s for the hello covers tsx start-up and pre-touching a large region.
  const env: Record<string, string> = { ...placement.env, FERRY_BENCH_BYTES: String(bytes) }
  if (placement.listen) env.FERRY_BENCH_LISTEN = placement.listen
  if (placement.machineId) env.FERRY_BENCH_MACHINE_ID = placement.machineId
  const proc = startTsx('target engine', path.join(__dirname, '..', 'target.ts'), [], env, placement.prefix)
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
      pid: proc.pid!,
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
export function cpuMeter(target: Target) {
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

export interface Rig {
  engine: Engine
  local: Region
  /** Bytes of `local` and of the target's buffer (both pre-touched). */
  regionBytes: number
  remote: Segment
  remoteBuffer: number
  target: Target
  options: SuiteOptions
}

/** An initiator engine (`extra` options) with a pre-touched region and `target` opened. */
export async function openRig(target: Target, regionBytes: number, options: SuiteOptions, extra: EngineOptions): Promise<Rig> {
  const engine = await Engine.create({ listen: '127.0.0.1:0', ...extra })
  try {
    const local = engine.allocate(regionBytes)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(target.segment)
    return { engine, local, regionBytes, remote, remoteBuffer: target.buffer, target, options }
  } catch (err) {
    await engine.close()
    throw err
  }
}

export function request(rig: Rig, opcode: Opcode, offset: number, length: number): TransferRequest {
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
export function ioRequest(rig: Rig, offset: number, length: number): IoRequest {
  return { local: rig.local, localOffset: offset, remote: rig.remote, remoteBuffer: rig.remoteBuffer, remoteOffset: offset, length }
}

export function timeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no completion within ${ms} ms`)), ms)
    }),
  ]).finally(() => clearTimeout(timer))
}

export const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve))

/**
 * Promise API: `window` lanes, each awaiting one 1 MiB call after another over the first
 * `workingSet` bytes of each side. Bytes completed between the end of the warm-up and the
 * end of the measurement, over that time.
 */
export async function throughputPromise(rig: Rig, opcode: Opcode, chunk: number, workingSet: number, warmupSeconds: number): Promise<ThroughputResult> {
  const { engine, options } = rig
  const slots = Math.floor(workingSet / chunk)
  const meter = cpuMeter(rig.target)
  let next = 0
  let completed = 0
  let stop = false
  let startBytes = 0
  let startNs = 0
  let endBytes = 0
  let endNs = 0
  let cpu: Promise<CpuShare> | undefined
  const transports: TransportTally = {}
  const attempts: TransportTally = {}
  const requests = Array.from({ length: slots }, (_, i) => ioRequest(rig, i * chunk, chunk))
  const lane = async () => {
    while (!stop) {
      const io = requests[next++ % slots]
      const r = opcode === 'write' ? await engine.write(io) : await engine.read(io)
      for (const t of r.tasks) {
        tally(transports, t.transport)
        tally(attempts, `${t.transport ?? '?'}@${t.attempts}`)
      }
      completed += chunk
    }
  }
  const warm = setTimeout(() => {
    startBytes = completed
    startNs = nowNs()
    meter.begin()
  }, warmupSeconds * 1000)
  const finish = setTimeout(
    () => {
      endBytes = completed
      endNs = nowNs()
      cpu = meter.end()
      stop = true
    },
    (warmupSeconds + options.durationSeconds) * 1000,
  )
  try {
    const lanes = Array.from({ length: options.window }, lane)
    await timeout(Promise.all(lanes), (warmupSeconds + options.durationSeconds + 15) * 1000, `${opcode} (promise)`)
  } finally {
    clearTimeout(warm)
    clearTimeout(finish)
    stop = true
  }
  const seconds = (endNs - startNs) / 1e9
  return { gbps: (endBytes - startBytes) / seconds / 1e9, bytes: endBytes - startBytes, seconds, cpu: await cpu!, transports, attempts }
}

export const terminal = (s: TransferStatus) => s !== TransferStatus.WAITING && s !== TransferStatus.PENDING

/**
 * Batch API: `batchesInFlight` batches of `batchTasks` 1 MiB tasks outstanding, over the
 * first `workingSet` bytes of each side; the batches are polled with getBatchStatus, backing
 * off (Atomics.wait, 10 µs doubling to 1 ms) while none has finished, and a finished one is
 * freed and replaced at once.
 */
export async function throughputBatch(rig: Rig, opcode: Opcode, chunk: number, workingSet: number, warmupSeconds: number): Promise<ThroughputResult> {
  const { engine, options } = rig
  const slots = Math.floor(workingSet / chunk)
  const perBatch = options.batchTasks
  const meter = cpuMeter(rig.target)
  const requests = Array.from({ length: slots }, (_, i) => request(rig, opcode, i * chunk, chunk))
  const inflight: number[] = []
  const transports: TransportTally = {}
  const attempts: TransportTally = {}
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
      const tasks = engine.getTransferStatusList(batch)
      if (st.status !== TransferStatus.COMPLETED) {
        const bad = tasks.find((t) => t.status !== TransferStatus.COMPLETED)
        throw new Error(`batch ${opcode} ended ${st.name}: ${bad?.code ?? ''} ${bad?.message ?? ''}`)
      }
      for (const t of tasks) {
        tally(transports, t.transport)
        tally(attempts, `${t.transport ?? '?'}@${t.attempts}`)
      }
      completed += st.transferredBytes
      engine.freeBatch(batch)
      inflight.splice(i, 1)
      finished++
    }
    return finished
  }

  const t0 = nowNs()
  const warmEnd = t0 + warmupSeconds * 1e9
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
    return { gbps: (endBytes - startBytes) / seconds / 1e9, bytes: endBytes - startBytes, seconds, cpu: await cpu, transports, attempts }
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
/** Median CPU share over the runs that measured one. */
export function medianCpu(cpus: CpuShare[]): CpuShare | null {
  if (cpus.length === 0) return null
  return { local: round(median(cpus.map((c) => c.local)), 0), target: round(median(cpus.map((c) => c.target)), 0) }
}

export const throughputMethodLabel = (m: Method, options: SuiteOptions) =>
  m === 'promise'
    ? `promise (window ${options.window})`
    : `batch (${options.batchesInFlight} x ${options.batchTasks} tasks, polled with backoff)`

export interface LatencyRun {
  samples: number[]
  cpu: CpuShare
  /** Every task of the run (warm-up included), by the transport that served it. */
  transports: TransportTally
}

/** Promise API: `await engine.read` (or `.write`) of `bytes`, one at a time; µs per call. */
export async function latencyPromise(rig: Rig, bytes: number, warmupSeconds: number, opcode: Opcode = 'read'): Promise<LatencyRun> {
  const { engine, options } = rig
  const slots = Math.floor(rig.regionBytes / bytes)
  const call = (io: IoRequest) => (opcode === 'write' ? engine.write(io) : engine.read(io))
  const transports: TransportTally = {}
  const samples: number[] = []
  const warmEnd = Date.now() + warmupSeconds * 1000
  let i = 0
  while (Date.now() < warmEnd) {
    const r = await timeout(call(ioRequest(rig, (i++ % slots) * bytes, bytes)), 10_000, `latency warm-up ${opcode}`)
    for (const t of r.tasks) tally(transports, t.transport)
  }
  const meter = cpuMeter(rig.target)
  meter.begin()
  const deadline = Date.now() + options.latencyMaxSeconds * 1000
  while (samples.length < options.latencyOps && Date.now() < deadline) {
    const io = ioRequest(rig, (i++ % slots) * bytes, bytes)
    const t0 = nowNs()
    const r = await call(io)
    samples.push((nowNs() - t0) / 1000)
    for (const t of r.tasks) tally(transports, t.transport)
  }
  return { samples, cpu: await meter.end(), transports }
}

/**
 * Batch API: submitTransfer of one `bytes` READ (or WRITE), then spin on getTransferStatus
 * until the task is terminal; µs per op. Batches of 1024 tasks are reused and replaced
 * (untimed).
 */
export async function latencyBatch(rig: Rig, bytes: number, warmupSeconds: number, opcode: Opcode = 'read'): Promise<LatencyRun> {
  const { engine, options } = rig
  const slots = Math.floor(rig.regionBytes / bytes)
  const capacity = 1024
  let batch = engine.allocateBatch(capacity)
  let used = 0
  const transports: TransportTally = {}
  const samples: number[] = []
  let i = 0
  const one = (): number => {
    if (used === capacity) {
      engine.freeBatch(batch)
      batch = engine.allocateBatch(capacity)
      used = 0
    }
    const list = [request(rig, opcode, (i++ % slots) * bytes, bytes)]
    const t0 = nowNs()
    const task = engine.submitTransfer(batch, list)
    used++
    const giveUp = t0 + 10e9
    let st = engine.getTransferStatus(batch, task)
    while (!terminal(st.status)) {
      st = engine.getTransferStatus(batch, task)
      if (nowNs() > giveUp) throw new Error(`batch latency: a ${bytes / 1024} KiB ${opcode} did not finish in 10 s`)
    }
    const t1 = nowNs()
    if (st.status !== TransferStatus.COMPLETED) throw new Error(`batch latency: ${opcode} ended ${st.name}: ${st.code ?? ''} ${st.message ?? ''}`)
    tally(transports, st.transport)
    return (t1 - t0) / 1000
  }
  try {
    const warmEnd = Date.now() + warmupSeconds * 1000
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
    return { samples, cpu: await meter.end(), transports }
  } finally {
    try {
      engine.freeBatch(batch)
    } catch {
      // engine closing
    }
  }
}

export const latencyMethodLabel = (m: Method, opcode: Opcode = 'read') =>
  m === 'promise' ? `promise (await engine.${opcode})` : 'batch (submitTransfer + spin on getTransferStatus)'

