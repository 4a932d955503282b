/**
 * The `blocks` suite: many small blocks per call through the vectorized API
 * (`writeBlocks` / `readBlocks`, and the batch form `submitBlocks` + `getBlockStatusInto`),
 * between this process and a target engine in a child process (bench/target.ts).
 *
 *   write-4KiB-vector   shm   blocks/s   vs memcpy of the same 4 KiB block stream, 1 thread (target ≥ 1,000,000 blocks/s)
 *   read-4KiB-vector    shm   blocks/s   vs memcpy of the same 4 KiB block stream, 1 thread
 *   write-64KiB-vector  shm   GB/s       vs memcpy of the same 64 KiB block stream, 1 thread
 *   write-4KiB-vector   tcp   blocks/s   vs pure Node over loopback TCP, the same block stream
 *   read-4KiB-vector    tcp   blocks/s   vs pure Node over loopback TCP, the same block stream
 *   tebench-*           the native tebench loop's cases, after these (bench/suites/tebench-loop.ts)
 *
 * The block stream: calls of BLOCKS_PER_CALL blocks; the local and the remote pages of the
 * working set (WORKING_SET per side, pre-touched) each in a seeded shuffle, so that no two
 * neighbours are contiguous on both sides and nothing merges: the per-block cost, not the
 * merge, is what is measured. The engine gathers each call's scattered pages into tasks of
 * many spans (`requests_per_call` is the tasks per call it saw). The memcpy baseline copies
 * the same stream (the same shuffles, `memcpy_bench --shuffle`). A second figure,
 * `contiguous_blocks_per_s`, runs the same calls with both sides in order (every call
 * merges into one request). One call in flight at a time, engine and baseline.
 * The two API methods are measured every round; the better median is `value`.
 * `sync_us_per_block` is the time inside the synchronous part of the call (argument
 * checks, the binding, merging, submission and, over shm, the copies themselves), per block.
 */
import { Engine, TransferStatus } from '../../index'
import { startMemcpyBaseline, type MemcpySession } from '../baselines/memcpy'
import { startNodeBlocks, type BlockCall, type NodeBlocksSession } from '../baselines/node_blocks'
import { log } from '../lib/log'
import { MiB, startTarget, type Target } from '../lib/rig'
import { attempt, compare, hostLoad, isResult, perMethod, roundErrors, runRounds, type Method, type Rounds } from '../lib/rounds'
import { median, nowNs, round } from '../lib/stats'
import { LOOP_CASE_NAMES, tebenchLoopCases, wanted } from './tebench-loop'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'blocks'
const KiB = 1024
const BLOCKS_PER_CALL = 256
const WORKING_SET = 64 * MiB
/** Distinct calls generated ahead (the stream cycles through them). */
const CALLS = 64
const TARGET_BLOCKS_PER_S = 1_000_000
/** Seeds of the scattered stream's page shuffles; the memcpy baseline copies the same stream. */
const SEEDS = { local: 7, remote: 11 }

type Opcode = 'read' | 'write'

interface VectorCase {
  name: string
  opcode: Opcode
  transport: 'shm' | 'tcp'
  blockBytes: number
  unit: 'blocks/s' | 'GB/s'
}

const CASES: VectorCase[] = [
  { name: 'write-4KiB-vector', opcode: 'write', transport: 'shm', blockBytes: 4 * KiB, unit: 'blocks/s' },
  { name: 'read-4KiB-vector', opcode: 'read', transport: 'shm', blockBytes: 4 * KiB, unit: 'blocks/s' },
  { name: 'write-64KiB-vector', opcode: 'write', transport: 'shm', blockBytes: 64 * KiB, unit: 'GB/s' },
  { name: 'write-4KiB-vector', opcode: 'write', transport: 'tcp', blockBytes: 4 * KiB, unit: 'blocks/s' },
  { name: 'read-4KiB-vector', opcode: 'read', transport: 'tcp', blockBytes: 4 * KiB, unit: 'blocks/s' },
]

/** A seeded shuffle of 0..n-1. */
function shuffle(n: number, seed: number): Uint32Array {
  const a = Uint32Array.from({ length: n }, (_, i) => i)
  let x = seed >>> 0 || 1
  for (let i = n - 1; i > 0; i--) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    const j = x % (i + 1)
    const t = a[i]
    a[i] = a[j]
    a[j] = t
  }
  return a
}

/** CALLS calls of BLOCKS_PER_CALL blocks of `bs`: shuffled pages on both sides, or in order. */
function stream(bs: number, scattered: boolean): BlockCall[] {
  const pages = WORKING_SET / bs
  const perCall = Math.min(BLOCKS_PER_CALL, pages)
  const local = scattered ? shuffle(pages, SEEDS.local) : Uint32Array.from({ length: pages }, (_, i) => i)
  const remote = scattered ? shuffle(pages, SEEDS.remote) : local
  return Array.from({ length: CALLS }, (_, c) => {
    const localOffsets = new Float64Array(perCall)
    const remoteOffsets = new Float64Array(perCall)
    for (let b = 0; b < perCall; b++) {
      const p = (c * perCall + b) % pages
      localOffsets[b] = local[p] * bs
      remoteOffsets[b] = remote[p] * bs
    }
    return { localOffsets, remoteOffsets }
  })
}

interface Rig {
  engine: Engine
  target: Target
  local: ReturnType<Engine['allocate']>
  remote: Awaited<ReturnType<Engine['openSegment']>>
}

interface VectorRun {
  blocks: number
  seconds: number
  /** Requests the blocks were merged into. */
  requests: number
  calls: number
  /** Seconds inside the synchronous part of the calls. */
  syncSeconds: number
}

const bad = (s: Uint8Array) => s.findIndex((v) => v !== TransferStatus.COMPLETED)

/** Calls for `seconds` (after `warm` untimed), one in flight, with method `m`. */
async function vectorRun(rig: Rig, c: VectorCase, calls: BlockCall[], m: Method, seconds: number, warm: number): Promise<VectorRun> {
  const { engine, local, remote, target } = rig
  const base = { local, remote, remoteBuffer: target.buffer, lengths: c.blockBytes, requireTransport: c.transport }
  const status = new Uint8Array(BLOCKS_PER_CALL)
  let batch = m === 'batch' ? engine.allocateBatch(CALLS * BLOCKS_PER_CALL) : -1
  let used = 0
  /** One call; its requests and synchronous ns. */
  const one = async (call: BlockCall): Promise<[number, number]> => {
    if (m === 'promise') {
      const t0 = nowNs()
      const p = c.opcode === 'write' ? engine.writeBlocks({ ...base, ...call }) : engine.readBlocks({ ...base, ...call })
      const t1 = nowNs()
      const res = await p
      const i = bad(res.status)
      if (i >= 0) throw new Error(`block ${i} ended ${res.status[i]}: ${res.failed[0]?.code} ${res.failed[0]?.message}`)
      return [res.requests, t1 - t0]
    }
    if (used + call.localOffsets.length > CALLS * BLOCKS_PER_CALL) {
      engine.freeBatch(batch)
      batch = engine.allocateBatch(CALLS * BLOCKS_PER_CALL)
      used = 0
    }
    const b = batch
    const t0 = nowNs()
    const sub = engine.submitBlocks(b, { opcode: c.opcode, ...base, ...call })
    const t1 = nowNs()
    used += sub.tasks
    const giveUp = Date.now() + 10_000
    while (engine.getBlockStatusInto(b, sub, status) > 0) {
      if (Date.now() > giveUp) throw new Error('a batch of blocks did not finish in 10 s')
      await new Promise((r) => setImmediate(r))
    }
    const i = bad(status.subarray(0, sub.blocks))
    if (i >= 0) throw new Error(`block ${i} ended ${status[i]}`)
    return [sub.tasks, t1 - t0]
  }
  let k = 0
  const warmEnd = Date.now() + warm * 1000
  while (Date.now() < warmEnd) await one(calls[k++ % calls.length])
  const run: VectorRun = { blocks: 0, seconds: 0, requests: 0, calls: 0, syncSeconds: 0 }
  const t0 = nowNs()
  const end = Date.now() + seconds * 1000
  while (Date.now() < end) {
    const call = calls[k++ % calls.length]
    const [requests, syncNs] = await one(call)
    run.blocks += call.localOffsets.length
    run.requests += requests
    run.calls++
    run.syncSeconds += syncNs / 1e9
  }
  run.seconds = (nowNs() - t0) / 1e9
  if (m === 'batch') engine.freeBatch(batch)
  return run
}

const perSecond = (x: VectorRun) => (x.seconds > 0 ? x.blocks / x.seconds : null)

async function openRig(transport: 'shm' | 'tcp'): Promise<Rig> {
  const target = await startTarget(WORKING_SET)
  try {
    const engine = await Engine.create({ listen: '127.0.0.1:0', transports: transport === 'shm' ? ['shm', 'tcp'] : ['tcp'] })
    const local = engine.allocate(WORKING_SET)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(target.segment)
    return { engine, target, local, remote }
  } catch (err) {
    await target.stop()
    throw err
  }
}

interface Baseline {
  label: string
  /** Blocks/s of one run. */
  run(c: VectorCase, seconds: number, warm: number): Promise<{ value: number | null; note?: string }>
  close(): Promise<void>
}

function memcpyBaseline(session: MemcpySession, bs: number): Baseline {
  return {
    label: session.label,
    async run(_c, seconds, warm) {
      const r = await session.run(seconds, warm)
      return { value: r.gbps === null ? null : (r.gbps * 1e9) / bs, note: r.note }
    },
    close: () => session.close(),
  }
}

function nodeBaseline(session: NodeBlocksSession, calls: BlockCall[]): Baseline {
  return {
    label: session.label,
    async run(c, seconds, warm) {
      const r = await session.run(c.opcode, calls, c.blockBytes, seconds, warm)
      return { value: r.seconds > 0 ? r.blocks / r.seconds : null }
    },
    close: () => session.close(),
  }
}

async function measureCase(c: VectorCase, options: SuiteOptions): Promise<CaseRecord> {
  const scattered = stream(c.blockBytes, true)
  const contiguous = stream(c.blockBytes, false)
  const rig = await openRig(c.transport)
  let baseline: Baseline | undefined
  try {
    baseline =
      c.transport === 'shm'
        ? memcpyBaseline(await startMemcpyBaseline(WORKING_SET, c.blockBytes, SEEDS), c.blockBytes)
        : nodeBaseline(await startNodeBlocks(WORKING_SET), scattered)
    const base: Rounds<{ value: number | null; note?: string }> = []
    const merged: Rounds<VectorRun> = []
    const loads: Array<number | null> = []
    const b = baseline
    const outcome = await runRounds<string, VectorRun>({
      suite: SUITE,
      options,
      entries: [c.name],
      measure: (_e, m, ctx) => vectorRun(rig, c, scattered, m, options.durationSeconds, ctx.warm),
      starting: (_e, m, ctx) => `${ctx.tag}: ${c.name} over ${c.transport}, ${m}`,
      finished: (_e, m, r, ctx) => `${ctx.tag}: ${c.name} ${m} ${Math.round(perSecond(r) ?? 0)} blocks/s, ${(r.requests / r.calls).toFixed(1)} requests per call`,
      onEntry: () => void loads.push(hostLoad()),
      others: [
        async (ctx) => {
          base[ctx.round] = await attempt(`${ctx.tag} baseline`, () => b.run(c, options.durationSeconds, ctx.warm))
        },
        async (ctx) => {
          merged[ctx.round] = await attempt(`${ctx.tag} contiguous`, () => vectorRun(rig, c, contiguous, 'promise', options.durationSeconds, 0))
        },
      ],
      figure: perSecond,
      higherIsBetter: true,
    })
    const series = outcome.engine[c.name]
    const toUnit = (v: number | null) => (v === null ? null : c.unit === 'GB/s' ? (v * c.blockBytes) / 1e9 : v)
    const digits = c.unit === 'GB/s' ? 3 : 0
    const byMethod = perMethod(series, options.repeat, (x) => toUnit(perSecond(x)), digits)
    const baseRounds = Array.from({ length: options.repeat }, (_, r) => {
      const x = base[r]
      return isResult(x) && x.value !== null ? round(toUnit(x.value)!, digits) : null
    })
    const cmp = compare(byMethod, outcome.chosen?.[c.name], true, () => baseRounds, digits)
    const runs = series[cmp.method].filter(isResult)
    const blocks = runs.reduce((a, x) => a + x.blocks, 0)
    const blocksPerS = median(runs.map(perSecond))
    const record: CaseRecord = {
      suite: SUITE,
      case: c.name,
      transport: c.transport,
      value: cmp.value,
      unit: c.unit,
      baseline: b.label,
      baseline_value: cmp.baselineValue,
      ratio: cmp.ratio,
      method: cmp.method === 'promise' ? `${c.opcode}Blocks (Promise), one call in flight` : 'submitBlocks + getBlockStatusInto (batch, polled), one call in flight',
      rounds: cmp.rounds,
      baseline_rounds: cmp.baselineRounds,
      by_method: byMethod,
      blocks_per_s: round(blocksPerS, 0),
      block_bytes: c.blockBytes,
      blocks_per_call: BLOCKS_PER_CALL,
      requests_per_call: runs.length ? round(runs.reduce((a, x) => a + x.requests, 0) / runs.reduce((a, x) => a + x.calls, 0), 2) : null,
      sync_us_per_block: blocks ? round((runs.reduce((a, x) => a + x.syncSeconds, 0) * 1e6) / blocks, 3) : null,
      us_per_block: Number.isFinite(blocksPerS) ? round(1e6 / blocksPerS, 3) : null,
      contiguous_blocks_per_s: round(median(merged.map((x) => (isResult(x) ? perSecond(x) : null))), 0),
      working_set_MiB: WORKING_SET / MiB,
      stream: `${CALLS} calls of ${BLOCKS_PER_CALL} blocks cycled; local and remote pages each a seeded shuffle of the working set (nothing merges; the engine gathers the scattered pages into tasks of many spans, the baseline copies the same shuffled pages); contiguous_blocks_per_s: the same calls with pages in order on both sides (one request per call)`,
      seconds: options.durationSeconds,
      repeat: options.repeat,
      warmup_s_round1: options.warmupSeconds,
      order: 'rounds alternate the order: odd rounds engine (both methods), baseline, contiguous; even rounds reversed',
      host_load: loads,
    }
    if (c.unit === 'blocks/s' && c.transport === 'shm') {
      record.target_blocks_per_s = TARGET_BLOCKS_PER_S
      record.meets_target = Number.isFinite(blocksPerS) ? blocksPerS >= TARGET_BLOCKS_PER_S : null
    }
    const errors = [...roundErrors(series.promise, 'promise'), ...roundErrors(series.batch, 'batch'), ...roundErrors(base, 'baseline'), ...roundErrors(merged, 'contiguous')]
    if (errors.length) record.error = errors.join('; ')
    const notes = [...new Set(base.filter(isResult).map((x) => x.note).filter((n): n is string => !!n))]
    if (notes.length) record.note = notes.join('; ')
    return record
  } finally {
    await baseline?.close()
    await rig.engine.close()
    await rig.target.stop()
  }
}

/** Every case name of the suite, for `--case`. */
export const BLOCKS_CASES: string[] = [...new Set([...CASES.map((c) => c.name), ...LOOP_CASE_NAMES])]

export async function blocksSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  for (const c of CASES.filter((c) => wanted(options, c.name))) {
    log(`${SUITE}: ${c.name} over ${c.transport}: ${options.repeat} rounds, ${options.durationSeconds} s each`)
    records.push(await measureCase(c, options))
  }
  // The native tebench loop's per-op figures (bench/suites/tebench-loop.ts).
  records.push(...(await tebenchLoopCases(options)))
  return records
}
