/**
 * The `scale` suite: how Ferry's throughput grows with the threads submitting, against
 * baselines that grow as well as this host allows, measured in the same run.
 *
 * For each transport (`--transports`, tcp and shm), block size (`--sizes`: 4 KiB, 64 KiB,
 * 1 MiB, 16 MiB), op (`--ops`: write; read too if asked) and thread count (`--threads`: 1,
 * 2, 4, … up to the cores), one point:
 *
 *   engine    tebench's native loop (ferry-bench's workers, the path `npx tebench` measures):
 *             N threads, batch 1, addressing fixed (each thread re-uses one block at the
 *             start of a stripe of its own), the transport pinned, against a target engine
 *             in a child process (bench/target.ts); this engine enables that transport alone,
 *             as tebench --xport_type does. GB/s = tebench's BW column.
 *   tcp       N iperf3 clients side by side, each against a server of its own (N processes
 *   baseline  each side, bench/baselines/iperf3_group.ts; not -P, which iperf3 3.12 runs on
 *             one thread), -l = the block size up to iperf3's largest, 1 MiB (16 MiB blocks
 *             are compared with -l 1M): the kernel streaming writes of the engine's payload
 *             size, the ceiling of one core per stream at that granularity. A READ point has
 *             the same baseline (loopback is symmetric). With 2 cores or more, a companion
 *             run of the same pairs pinned cross-core follows it (`crossCoreCompanion`):
 *             context, not a target.
 *   shm       memcpy on N threads side by side (bench/baselines/memcpy_bench.c --threads),
 *   baseline  each copying the block size through a source and a destination of that size
 *             of its own: the one copy per byte that shm makes, with the same working set.
 *
 * Each point runs `--repeat` rounds, engine and baseline back to back (odd rounds engine
 * first), the warm-up in round 1 only; the record reports medians, `ratio` = engine /
 * baseline (median of the per-round ratios), and each figure's speed-up over the same series
 * at its fewest threads. A readable table of every point follows on stderr. `--io-threads`
 * sets both engines' I/O threads and `--lanes` their tcp lanes (default: the engine's defaults). An engine failure is the
 * record's `error` (perf exits 1); a baseline without a figure (no iperf3, no compiler) is
 * its `baseline_error`, with a null ratio.
 */
import * as os from 'node:os'
import { Engine, type Bench, type Region, type Segment } from '../../index'
import { startIperf3Group, type Iperf3Group } from '../baselines/iperf3_group'
import { startMemcpyBaseline } from '../baselines/memcpy'
import { log } from '../lib/log'
import { MiB, startTarget, type Opcode } from '../lib/rig'
import { hostLoad, ORDER_NOTE } from '../lib/rounds'
import { addSpeedups, scaleTable, sizeLabel, type ScalePoint } from '../lib/scale-report'
import { median, round } from '../lib/stats'
import { STEAL_NOTE, withSteal } from '../lib/steal'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'scale'
const KiB = 1024

export type ScaleTransport = 'tcp' | 'shm'
export const SCALE_TRANSPORTS: readonly ScaleTransport[] = ['tcp', 'shm']
export const SCALE_SIZES: readonly number[] = [4 * KiB, 64 * KiB, MiB, 16 * MiB]

/** 1, 2, 4, … while below `cores`, then `cores` itself. */
export function threadSweep(cores: number): number[] {
  const out: number[] = []
  for (let t = 1; t < cores; t *= 2) out.push(t)
  out.push(Math.max(1, cores))
  return out
}

/** iperf3's `-l` for a block: the block size, at most iperf3's largest (1 MiB). */
export function iperf3Length(block: number): string {
  const len = Math.min(block, MiB)
  return len % MiB === 0 ? `${len / MiB}M` : len % KiB === 0 ? `${len / KiB}K` : String(len)
}

interface Point {
  transport: ScaleTransport
  opcode: Opcode
  block: number
  threads: number
}

/** One round of a point. */
interface PointRound {
  gbps: number | null
  avgTxUs: number | null
  p99TxUs: number | null
  baseline: number | null
  /** The companion baseline's figure (tcp: iperf3 pinned cross-core), when it has one. */
  companion?: number | null
  /** Per-stream (tcp) or slowest/fastest thread (shm) figures of the baseline. */
  baselineDetail?: unknown
  load: number | null
  engineSteal: number | null
  baselineSteal: number | null
  /** What went wrong on the engine's side (the record's `error`: perf then exits 1). */
  error?: string
  /** Why the baseline has no figure (the record's `baseline_error`: its ratio is null). */
  baselineError?: string
}

/** A point's baseline: one run of `seconds` after `warmup` seconds. */
interface PointBaseline {
  label: string
  run(seconds: number, warmup: number): Promise<{ gbps: number | null; note?: string; detail?: unknown }>
  /**
   * A second baseline measured right after the first in each round, for context (it sets no
   * target): tcp's is the same iperf3 group pinned cross-core (`crossCoreCompanion`).
   */
  companion?: { label: string; run(seconds: number, warmup: number): Promise<{ gbps: number | null; note?: string }> }
  close(): Promise<void>
}

/** What the engine side of a transport's points shares. */
interface Rig {
  engine: Engine
  bench: Bench
  local: Region
  remote: Segment
  remoteBuffer: number
  options: SuiteOptions
}

/** A scale record: what every suite's record has and what the report reads. */
type ScaleRecord = CaseRecord & ScalePoint

const pointName = (p: Point) => `${p.transport}-${p.opcode}-${sizeLabel(p.block).replace(' ', '')}-${p.threads}t`

async function engineRound(rig: Rig, p: Point, warm: number, rd: PointRound, errors: string[], tag: string): Promise<void> {
  const { result: res, stealPct } = await withSteal(() =>
    rig.bench
      .runCase({
        opcode: p.opcode,
        blockSize: p.block,
        batchSize: 1,
        local: rig.local,
        remote: rig.remote,
        remoteBuffer: rig.remoteBuffer,
        stripeBase: 0,
        stripeLen: p.block,
        addressing: 'fixed',
        transport: p.transport,
        durationMs: Math.round(rig.options.durationSeconds * 1000),
        warmupMs: Math.round(warm * 1000),
        requestIntervalUs: 0,
      })
      .catch((e: Error) => e),
  )
  rd.engineSteal = stealPct
  if (res instanceof Error) return void errors.push(`engine: ${res.message}`)
  if (res.outcome !== 'ok' || !res.row) {
    // A failure stops the workers' gate: later cases on it would return it again.
    rig.bench.stop()
    rig.bench = rig.engine.bench(p.threads)
    return void errors.push(`engine: ${res.outcome} ${res.failure?.reason ?? ''}`.trim())
  }
  if (res.servedLabel !== `${p.transport} (100 %)`) errors.push(`transport: expected ${p.transport}, served ${res.servedLabel}`)
  rd.gbps = res.row.bwGbps
  rd.avgTxUs = res.row.avgTxUs
  rd.p99TxUs = res.row.p99TxUs
  log(`${tag}: engine ${res.row.bwGbps.toFixed(3)} GB/s, Avg Tx ${res.row.avgTxUs.toFixed(1)} us, steal ${stealPct ?? 'n/a'} %`)
}

/**
 * A record's companion fields: the companion baseline's median, and the engine's ratio to
 * it (median of the per-round ratios, as `ratio`); null where no round has both figures.
 */
export function companionFigures(
  rounds: Array<Pick<PointRound, 'gbps' | 'companion'>>,
  label: string,
): { companion_baseline: string; companion_value: number | null; companion_ratio: number | null } {
  const ratios = rounds.map((r) => (r.gbps !== null && r.companion ? r.gbps / r.companion : null))
  return {
    companion_baseline: label,
    companion_value: round(median(rounds.map((r) => r.companion)), 3),
    companion_ratio: round(median(ratios), 3),
  }
}

async function measurePoint(rig: Rig, p: Point, baseline: PointBaseline): Promise<PointRound[]> {
  const { options } = rig
  const rounds: PointRound[] = []
  for (let r = 0; r < options.repeat; r++) {
    const warm = r === 0 ? options.warmupSeconds : 0
    const tag = `${SUITE}: round ${r + 1}/${options.repeat} ${pointName(p)}`
    const rd: PointRound = { gbps: null, avgTxUs: null, p99TxUs: null, baseline: null, load: hostLoad(), engineSteal: null, baselineSteal: null }
    const errors: string[] = []
    const baselineStep = async () => {
      const { result: b, stealPct } = await withSteal(() => baseline.run(options.durationSeconds, warm))
      rd.baseline = b.gbps
      rd.baselineDetail = b.detail
      rd.baselineSteal = stealPct
      if (b.note) rd.baselineError = b.note
      log(`${tag}: baseline ${b.gbps === null ? 'n/a' : b.gbps.toFixed(3)} GB/s, steal ${stealPct ?? 'n/a'} %`)
      if (baseline.companion) {
        const c = await baseline.companion.run(options.durationSeconds, 0)
        rd.companion = c.gbps
        log(`${tag}: companion baseline ${c.gbps === null ? `n/a (${c.note ?? 'no figure'})` : `${c.gbps.toFixed(3)} GB/s`}`)
      }
    }
    const steps = [() => engineRound(rig, p, warm, rd, errors, tag), baselineStep]
    for (const step of r % 2 === 0 ? steps : steps.reverse()) await step()
    if (errors.length) rd.error = errors.join('; ')
    rounds.push(rd)
  }
  return rounds
}

/** The tcp baselines: one iperf3 group per `-l`, kept across points. */
function tcpBaselines(companion: boolean): { at(p: Point): PointBaseline; close(): Promise<void> } {
  const groups = new Map<string, Iperf3Group>()
  return {
    at(p) {
      const length = iperf3Length(p.block)
      let group = groups.get(length)
      if (!group) groups.set(length, (group = startIperf3Group(length)))
      const g = group
      return {
        label: g.label(p.threads),
        run: async (seconds, warm) => {
          const r = await g.run(p.threads, seconds, warm)
          return { gbps: r.gbps, note: r.note, detail: { stream_gbps: r.streams.map((x) => (x === null ? null : round(x, 3))) } }
        },
        companion: companion ? crossCoreCompanion(g, p.threads, os.availableParallelism()) : undefined,
        close: async () => undefined,
      }
    },
    close: () => Promise.all([...groups.values()].map((g) => g.close())).then(() => undefined),
  }
}

/**
 * tcp's companion baseline: the same iperf3 streams with each client pinned to another core
 * than its server's (`Iperf3Placement`), on a host of at least 2 cores. On loopback the
 * scheduler tends to run each free iperf3 client on its server's core, so both copies of a
 * byte stay in one core's cache; the engine's target is another process whose I/O threads
 * receive wherever they run. Pinned apart, iperf3 shows what the socket gives when the
 * receiving copy does not find the sender's cache, as between hosts.
 */
export function crossCoreCompanion(group: Pick<Iperf3Group, 'label' | 'run'>, threads: number, cores: number): PointBaseline['companion'] {
  if (cores < 2) return undefined
  return {
    label: group.label(threads, 'cross-core'),
    run: (seconds, warm) => group.run(threads, seconds, warm, 'cross-core'),
  }
}

/**
 * What a large block's memcpy does that the engine's copy may not: glibc copies a block above
 * its non-temporal threshold (set at start-up from the machine's cache sizes) with stores
 * that bypass the cache, while the engine cuts a large copy into 512 KiB jobs and shares
 * them with its copy threads (cores beyond the N submitting), which may stay in the L3.
 */
const MEMCPY_NOTE =
  "one memcpy call per block: above glibc's non-temporal threshold (set from the machine's cache sizes) its stores bypass the cache, while the engine copies a large block in 512 KiB jobs shared with its copy threads, so a ratio above 1 at large blocks is possible"

/** The shm baseline of a point: memcpy on its threads at its block size (a child per point). */
async function shmBaseline(p: Point): Promise<PointBaseline> {
  const memcpy = await startMemcpyBaseline(p.block, p.block, undefined, p.threads)
  return {
    label: `${memcpy.label}; ${MEMCPY_NOTE}`,
    run: async (seconds, warm) => {
      const r = await memcpy.run(seconds, warm)
      return { gbps: r.gbps, note: r.note, detail: r.threadGbps ? { thread_gbps: r.threadGbps } : undefined }
    },
    close: () => memcpy.close(),
  }
}

function record(p: Point, rounds: PointRound[], baseline: Pick<PointBaseline, 'label' | 'companion'>, options: SuiteOptions): ScaleRecord {
  const value = round(median(rounds.map((r) => r.gbps)), 3)
  const base = round(median(rounds.map((r) => r.baseline)), 3)
  const perRound = rounds.map((r) => (r.gbps !== null && r.baseline ? r.gbps / r.baseline : null))
  const rec: ScaleRecord = {
    suite: SUITE,
    case: pointName(p),
    value,
    unit: 'GB/s',
    baseline: baseline.label,
    baseline_value: base,
    ratio: round(median(perRound), 3),
    ratio_note: 'median over rounds of engine / baseline of the same round',
    transport: p.transport,
    opcode: p.opcode,
    block_bytes: p.block,
    threads: p.threads,
    cores: os.availableParallelism(),
    io_threads: options.ioThreads > 0 ? options.ioThreads : 'engine default',
    lanes: options.lanes > 0 ? options.lanes : 'engine default',
    avg_tx_us: round(median(rounds.map((r) => r.avgTxUs)), 3),
    p99_tx_us: round(median(rounds.map((r) => r.p99TxUs)), 3),
    method: `native tebench loop (ferry-bench workers), ${p.threads} thread(s), batch 1, addressing fixed (each thread re-uses one block of a stripe of its own), transport ${p.transport} pinned`,
    working_set_bytes: p.threads * p.block,
    rounds: rounds.map((r) => ({
      gbps: r.gbps === null ? null : round(r.gbps, 4),
      avg_tx_us: r.avgTxUs === null ? null : round(r.avgTxUs, 3),
      baseline_gbps: r.baseline === null ? null : round(r.baseline, 4),
      ...(r.companion === undefined ? {} : { companion_gbps: r.companion === null ? null : round(r.companion, 4) }),
      baseline_detail: r.baselineDetail ?? null,
      host_load: r.load,
      engine_steal_pct: r.engineSteal,
      baseline_steal_pct: r.baselineSteal,
    })),
    steal_note: STEAL_NOTE,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: median(rounds.map((r) => r.load)),
  }
  if (baseline.companion) Object.assign(rec, companionFigures(rounds, baseline.companion.label))
  const errors = rounds.flatMap((r, i) => (r.error ? [`round ${i + 1}: ${r.error}`] : []))
  if (errors.length) rec.error = errors.join('; ')
  const baselineErrors = rounds.flatMap((r, i) => (r.baselineError ? [`round ${i + 1}: ${r.baselineError}`] : []))
  if (baselineErrors.length) rec.baseline_error = baselineErrors.join('; ')
  return rec
}

/** Every point of one transport, against `target`. */
async function transportPoints(transport: ScaleTransport, threads: number[], targetAt: { segment: string; buffer: number }, options: SuiteOptions) {
  const records: ScaleRecord[] = []
  const sizes = options.scaleSizes
  const regionBytes = Math.max(...threads) * Math.max(...sizes)
  const engine = await Engine.create({
    listen: '127.0.0.1:0',
    transports: [transport],
    ioThreads: options.ioThreads || undefined,
    connectionsPerPeer: options.lanes || undefined,
  })
  const tcp = transport === 'tcp' ? tcpBaselines(options.scaleCompanion) : undefined
  let rig: Rig | undefined
  try {
    const local = engine.allocate(regionBytes)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(targetAt.segment)
    for (const n of threads) {
      rig = { engine, bench: engine.bench(n), local, remote, remoteBuffer: targetAt.buffer, options }
      for (const block of sizes) {
        for (const opcode of options.scaleOps) {
          const p: Point = { transport, opcode, block, threads: n }
          const baseline = tcp ? tcp.at(p) : await shmBaseline(p)
          try {
            records.push(record(p, await measurePoint(rig, p, baseline), baseline, options))
          } finally {
            await baseline.close()
          }
        }
      }
      rig.bench.stop()
      rig = undefined
    }
  } finally {
    rig?.bench.stop()
    await tcp?.close()
    await engine.close()
  }
  return records
}

export async function scaleSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const threads = options.scaleThreads.length ? options.scaleThreads : threadSweep(os.availableParallelism())
  const regionBytes = Math.max(...threads) * Math.max(...options.scaleSizes)
  log(
    `${SUITE}: ${options.scaleTransports.join(', ')} × ${options.scaleSizes.map(sizeLabel).join(', ')} × ${options.scaleOps.join(', ')} × threads ${threads.join(', ')}; ${options.repeat} round(s) of ${options.durationSeconds} s each side; ${regionBytes / MiB} MiB per side`,
  )
  const env: Record<string, string> = {}
  if (options.ioThreads > 0) env.FERRY_BENCH_IO_THREADS = String(options.ioThreads)
  if (options.lanes > 0) env.FERRY_BENCH_LANES = String(options.lanes)
  const target = await startTarget(regionBytes, { env })
  const records: ScaleRecord[] = []
  try {
    for (const transport of options.scaleTransports) records.push(...(await transportPoints(transport, threads, target, options)))
  } finally {
    await target.stop()
  }
  addSpeedups(records)
  log(`${SUITE}: engine = tebench's native loop on N threads; baseline = N iperf3 pairs (tcp) / memcpy on N threads (shm); x fewest = over the same row at the fewest threads`)
  for (const line of scaleTable(records)) log(line)
  return records
}
