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
import * as os from 'node:os'
import * as path from 'node:path'
import { Engine, TransferStatus, type IoRequest, type Region, type Segment, type TransferRequest } from '../../index'
import { startIperf3Loopback, type Iperf3Result } from '../baselines/iperf3'
import { startNodeTcpLatency, type LatencyBaselineSession } from '../baselines/node_tcp_lat'
import { jsonLines, startTsx, stopChild, tailStderr } from '../lib/children'
import { log } from '../lib/log'
import { blockFor, median, nowNs, ratio, round, summarize } from '../lib/stats'
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
  /** Bytes of `local` and of the target's buffer (both pre-touched). */
  regionBytes: number
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
 * Promise API: `window` lanes, each awaiting one 1 MiB call after another over the first
 * `workingSet` bytes of each side. Bytes completed between the end of the warm-up and the
 * end of the measurement, over that time.
 */
async function throughputPromise(rig: Rig, opcode: Opcode, chunk: number, workingSet: number, warmupSeconds: number): Promise<ThroughputResult> {
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
  return { gbps: (endBytes - startBytes) / seconds / 1e9, bytes: endBytes - startBytes, seconds, cpu: await cpu! }
}

const terminal = (s: TransferStatus) => s !== TransferStatus.WAITING && s !== TransferStatus.PENDING

/**
 * Batch API: `batchesInFlight` batches of `batchTasks` 1 MiB tasks outstanding, over the
 * first `workingSet` bytes of each side; the batches are polled with getBatchStatus, backing
 * off (Atomics.wait, 10 µs doubling to 1 ms) while none has finished, and a finished one is
 * freed and replaced at once.
 */
async function throughputBatch(rig: Rig, opcode: Opcode, chunk: number, workingSet: number, warmupSeconds: number): Promise<ThroughputResult> {
  const { engine, options } = rig
  const slots = Math.floor(workingSet / chunk)
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


// ---------------------------------------------------------------------------------------
// Rounds: engine and baseline interleaved, medians reported.
// ---------------------------------------------------------------------------------------

type Method = 'promise' | 'batch'
const METHODS: readonly Method[] = ['promise', 'batch']

/** Per-round outcome of one series: a result, an error, or undefined when not measured. */
type Rounds<T> = Array<T | Error | undefined>

const isResult = <T>(x: T | Error | undefined): x is T => x !== undefined && !(x instanceof Error)

/** 1-min load average now, for the record. */
const hostLoad = () => round(os.loadavg()[0], 2)

/** Errors of a series as "round N method: message". */
function roundErrors<T>(rounds: Rounds<T>, label: string): string[] {
  const out: string[] = []
  rounds.forEach((x, r) => {
    if (x instanceof Error) out.push(`round ${r + 1} ${label}: ${x.message}`)
  })
  return out
}

/** The method whose figures have the better median (ties and all-missing: promise). */
function betterByMedian(figures: Record<Method, Array<number | null>>, higherIsBetter: boolean): Method {
  const p = median(figures.promise)
  const b = median(figures.batch)
  if (!Number.isFinite(b)) return 'promise'
  if (!Number.isFinite(p)) return 'batch'
  return (higherIsBetter ? b > p : b < p) ? 'batch' : 'promise'
}

/** Median CPU share over the runs that measured one. */
function medianCpu(cpus: CpuShare[]): CpuShare | null {
  if (cpus.length === 0) return null
  return { local: round(median(cpus.map((c) => c.local)), 0), target: round(median(cpus.map((c) => c.target)), 0) }
}

/**
 * Whether rounds 2.. can measure both API methods within the budget, judged from the time
 * round 1 (which always measures both, plus the warm-ups) took.
 */
function bothFit(options: SuiteOptions, phaseStart: number, round1Ms: number): boolean {
  const projected = (Date.now() - phaseStart + (options.repeat - 1) * round1Ms) / 1000
  return projected <= options.budgetSeconds
}

const throughputMethodLabel = (m: Method, options: SuiteOptions) =>
  m === 'promise'
    ? `promise (window ${options.window})`
    : `batch (${options.batchesInFlight} x ${options.batchTasks} tasks, polled with backoff)`

const ORDER_NOTE = 'rounds alternate the order: odd rounds engine first, even rounds baseline first'

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
  if (errors.length) record.error = errors.join('; ')
  const notes = [...new Set(phase.iperf.map((i) => i.note).filter((n): n is string => !!n))]
  if (notes.length) record.note = notes.join('; ')
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
async function latencyPromise(rig: Rig, bytes: number, warmupSeconds: number): Promise<LatencyRun> {
  const { engine, options } = rig
  const slots = Math.floor(rig.regionBytes / bytes)
  const requests = Array.from({ length: slots }, (_, i) => ioRequest(rig, i * bytes, bytes))
  const samples: number[] = []
  const warmEnd = Date.now() + warmupSeconds * 1000
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
async function latencyBatch(rig: Rig, bytes: number, warmupSeconds: number): Promise<LatencyRun> {
  const { engine, options } = rig
  const slots = Math.floor(rig.regionBytes / bytes)
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
    return { samples, cpu: await meter.end() }
  } finally {
    try {
      engine.freeBatch(batch)
    } catch {
      // engine closing
    }
  }
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

const latencyMethodLabel = (m: Method) =>
  m === 'promise' ? 'promise (await engine.read)' : 'batch (submitTransfer + spin on getTransferStatus)'

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
    engine = await Engine.create({ listen: '127.0.0.1:0' })
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
