/**
 * The `blocks` suite's tebench cases: tebench's native loop (ferry-bench's workers: allocate →
 * submit → poll with backoff → free, one batch at a time, of one block but in the batch8 case,
 * 1 thread) against a target engine in a child process (bench/target.ts), each case with a
 * baseline measured in the same run, in interleaved rounds (odd rounds engine first, even
 * rounds baseline first).
 *
 *   tebench-shm-write-4KiB   shm, 4 KiB WRITEs, GB/s and Avg Tx   vs memcpy of 4 KiB blocks
 *   tebench-shm-write-1MiB   shm, 1 MiB WRITEs, GB/s and Avg Tx   vs memcpy of 1 MiB blocks
 *   tebench-shm-write-16KiB … -16MiB   the rest of tebench's sweep (16, 64, 256, 512 KiB, 4 and
 *                            16 MiB), each vs memcpy of its block size: the ratio row by row
 *                            shows where the per-op cost stops mattering and that it does not
 *                            dip where copies start to be shared with the copy threads
 *   tebench-shm-write-1MiB-batch8   shm, batches of 8 × 1 MiB WRITEs (one submission each), GB/s
 *                            vs memcpy of 1 MiB blocks over the same 8 MiB: a batch's large copies
 *                            shared between the submitting thread and the copy threads
 *   tebench-tcp-write-1MiB   tcp, 1 MiB WRITEs, GB/s              vs iperf3 -l 1M
 *   tebench-tcp-read-1MiB    tcp, 1 MiB READs, GB/s               vs iperf3 -l 1M
 *
 * Addressing is tebench's default, Mooncake's (`fixed`): the worker re-uses one batch of blocks
 * at the start of its stripe, so the working set is one batch (one block but in the batch8
 * case) on each side; the memcpy baseline (bench/baselines/memcpy_bench.c) copies blocks of
 * the same size over the same working set (source and destination one batch each). `ratio` =
 * engine / baseline; targets: 0.9 for shm at 1 MiB, 0.7 for tcp at 1 MiB; at 4 KiB the figure
 * to watch is `avg_tx_us` (aim ≤ 1.0).
 */
import { Engine, type Bench, type BenchResult, type Segment } from '../../index'
import { startIperf3Loopback, type Iperf3Session } from '../baselines/iperf3'
import { startMemcpyBaseline, type MemcpySession } from '../baselines/memcpy'
import { log } from '../lib/log'
import { MiB, startTarget } from '../lib/rig'
import { hostLoad, ORDER_NOTE } from '../lib/rounds'
import { STEAL_NOTE, withSteal } from '../lib/steal'
import { median, round } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'blocks'
const KiB = 1024

interface LoopCase {
  name: string
  transport: 'shm' | 'tcp'
  opcode: 'read' | 'write'
  block: number
  /** Blocks per batch (one submission). */
  batch: number
  /** The ratio to reach; null where the case is reported only. */
  targetRatio: number | null
}

/** tebench's shm sweep, block by block; 4 KiB and 1 MiB are the cases with targets. */
const SHM_BLOCKS = [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 512 * KiB, MiB, 4 * MiB, 16 * MiB]

const sizeName = (block: number) => (block >= MiB ? `${block / MiB}MiB` : `${block / KiB}KiB`)

const CASES: LoopCase[] = [
  ...SHM_BLOCKS.map(
    (block): LoopCase => ({
      name: `tebench-shm-write-${sizeName(block)}`,
      transport: 'shm',
      opcode: 'write',
      block,
      batch: 1,
      targetRatio: block === MiB ? 0.9 : null,
    }),
  ),
  { name: 'tebench-shm-write-1MiB-batch8', transport: 'shm', opcode: 'write', block: MiB, batch: 8, targetRatio: null },
  { name: 'tebench-tcp-write-1MiB', transport: 'tcp', opcode: 'write', block: MiB, batch: 1, targetRatio: 0.7 },
  { name: 'tebench-tcp-read-1MiB', transport: 'tcp', opcode: 'read', block: MiB, batch: 1, targetRatio: 0.7 },
]

/** What one round measured of a case. */
interface Round {
  gbps: number | null
  avgTxUs: number | null
  baseline: number | null
  load: number | null
  /** CPU time the hypervisor took during the engine's and the baseline's run, percent. */
  engineSteal: number | null
  baselineSteal: number | null
  error?: string
}

/** A baseline: GB/s of one run, or null with a note. */
type Baseline = (seconds: number, warmup: number) => Promise<{ gbps: number | null; note?: string }>

interface Rig {
  engine: Engine
  bench: Bench
  remote: Segment
  remoteBuffer: number
  options: SuiteOptions
}

/** Bytes of one batch: the working set on each side. */
const batchBytes = (c: LoopCase) => c.block * c.batch

async function engineRun(rig: Rig, c: LoopCase, warmupSeconds: number): Promise<BenchResult> {
  const local = rig.engine.allocate(batchBytes(c))
  local.buffer.fill(0x3c)
  try {
    return await rig.bench.runCase({
      opcode: c.opcode,
      blockSize: c.block,
      batchSize: c.batch,
      local,
      remote: rig.remote,
      remoteBuffer: rig.remoteBuffer,
      stripeBase: 0,
      stripeLen: batchBytes(c),
      addressing: 'fixed',
      transport: c.transport,
      durationMs: Math.round(rig.options.durationSeconds * 1000),
      warmupMs: Math.round(warmupSeconds * 1000),
      requestIntervalUs: 0,
    })
  } finally {
    local.release()
  }
}

async function measureCase(rig: Rig, c: LoopCase, baseline: Baseline): Promise<Round[]> {
  const { options } = rig
  const rounds: Round[] = []
  for (let r = 0; r < options.repeat; r++) {
    const warm = r === 0 ? options.warmupSeconds : 0
    const tag = `${SUITE}: round ${r + 1}/${options.repeat} ${c.name}`
    const round: Round = { gbps: null, avgTxUs: null, baseline: null, load: hostLoad(), engineSteal: null, baselineSteal: null }
    const errors: string[] = []
    const engineStep = async () => {
      const { result: res, stealPct } = await withSteal(() => engineRun(rig, c, warm).catch((e: Error) => e))
      round.engineSteal = stealPct
      if (res instanceof Error) return void errors.push(`engine: ${res.message}`)
      if (res.outcome !== 'ok' || !res.row) return void errors.push(`engine: ${res.outcome} ${res.failure?.reason ?? ''}`.trim())
      if (res.servedLabel !== `${c.transport} (100 %)`) errors.push(`transport: expected ${c.transport}, served ${res.servedLabel}`)
      round.gbps = res.row.bwGbps
      round.avgTxUs = res.row.avgTxUs
      log(`${tag}: engine ${res.row.bwGbps.toFixed(3)} GB/s, Avg Tx ${res.row.avgTxUs.toFixed(2)} us, steal ${stealPct ?? 'n/a'} %`)
    }
    const baselineStep = async () => {
      const { result: b, stealPct } = await withSteal(() => baseline(options.durationSeconds, warm))
      round.baseline = b.gbps
      round.baselineSteal = stealPct
      if (b.note) errors.push(`baseline: ${b.note}`)
      log(`${tag}: baseline ${b.gbps ?? 'n/a'} GB/s, steal ${stealPct ?? 'n/a'} %`)
    }
    const steps = r % 2 === 0 ? [engineStep, baselineStep] : [baselineStep, engineStep]
    for (const step of steps) await step()
    if (errors.length) round.error = errors.join('; ')
    rounds.push(round)
  }
  return rounds
}

function record(c: LoopCase, rounds: Round[], baselineLabel: string, options: SuiteOptions): CaseRecord {
  const value = round(median(rounds.map((r) => r.gbps)), 3)
  const base = round(median(rounds.map((r) => r.baseline)), 3)
  const perRound = rounds.map((r) => (r.gbps !== null && r.baseline ? r.gbps / r.baseline : null))
  const ratio = round(median(perRound), 3)
  const rec: CaseRecord = {
    suite: SUITE,
    case: c.name,
    value,
    unit: 'GB/s',
    baseline: baselineLabel,
    baseline_value: base,
    ratio,
    ratio_note: 'median over rounds of engine / baseline of the same round',
    target_ratio: c.targetRatio,
    meets_target: c.targetRatio === null || ratio === null ? null : ratio >= c.targetRatio,
    avg_tx_us: round(median(rounds.map((r) => r.avgTxUs)), 3),
    method: `native tebench loop (ferry-bench workers), 1 thread, batch ${c.batch}, addressing fixed (Mooncake's)`,
    transport: c.transport,
    opcode: c.opcode,
    block_bytes: c.block,
    batch_size: c.batch,
    working_set_bytes: batchBytes(c),
    rounds: rounds.map((r) => ({
      gbps: r.gbps,
      avg_tx_us: r.avgTxUs,
      baseline_gbps: r.baseline,
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
  const errors = rounds.flatMap((r, i) => (r.error ? [`round ${i + 1}: ${r.error}`] : []))
  if (errors.length) rec.error = errors.join('; ')
  return rec
}

/** The names of these cases. */
export const LOOP_CASE_NAMES: string[] = CASES.map((c) => c.name)

/** Whether `--case` asks for the case `name` (every case when it names none). */
export function wanted(options: SuiteOptions, name: string): boolean {
  return options.cases.length === 0 || options.cases.includes(name)
}

export async function tebenchLoopCases(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  const cases = CASES.filter((c) => wanted(options, c.name))
  if (cases.length === 0) return records
  const target = await startTarget(Math.max(...cases.map(batchBytes)))
  let engine: Engine | undefined
  let bench: Bench | undefined
  let iperf3: Iperf3Session | undefined
  try {
    // Default transports (['shm', 'tcp']); each case pins its own.
    engine = await Engine.create({ listen: '127.0.0.1:0' })
    const remote = await engine.openSegment(target.segment)
    bench = engine.bench(1)
    const rig: Rig = { engine, bench, remote, remoteBuffer: target.buffer, options }
    for (const c of cases) {
      if (c.transport === 'shm') {
        let memcpy: MemcpySession | undefined
        try {
          memcpy = await startMemcpyBaseline(batchBytes(c), c.block)
          const session = memcpy
          const rounds = await measureCase(rig, c, (s, w) => session.run(s, w))
          records.push(record(c, rounds, memcpy.label, options))
        } finally {
          await memcpy?.close()
        }
      } else {
        iperf3 ??= startIperf3Loopback('1M')
        const session = iperf3
        const rounds = await measureCase(rig, c, async (s, w) => {
          const r = await session.run(Math.max(1, Math.round(s)), Math.round(w))
          return { gbps: r.gbps, note: r.note }
        })
        records.push(record(c, rounds, 'iperf3 -l 1M, loopback', options))
      }
    }
  } finally {
    bench?.stop()
    await iperf3?.close()
    await engine?.close()
    await target.stop()
  }
  return records
}
