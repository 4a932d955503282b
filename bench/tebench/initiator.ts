/**
 * Initiator mode: opens the targets, then sweeps threads × block size × batch size (each
 * doubling) × op, one case each on the native workers (`Engine.bench`), and prints a row
 * per case. Around the cases: --check_consistency's copies and checks, --inject's fault,
 * --notifi's counts. Resolves with the exit code: 0, 1 on a failed transfer or check,
 * 2 when a target's buffer is too small, 130 when interrupted.
 */
import { Engine, type Bench, type BenchFailure, type BenchResult, type BenchRow, type Region, type Segment } from '../../index'
import type { Addressing, Config } from './config'
import { authOptions, engineTransports, metadataOptions, reportDisabled, reportHeader, tuningOptions } from './engine-setup'
import { interrupt } from './interrupt'
import type { LocalTarget } from './local'
import type { CaseRecord, FailedRecord, NotifyRecord, Output } from './output'
import { progress } from './progress'
import type { RunInfo } from './runinfo'
import { copyStripes, PATTERN, stripeLength, verify, type TargetBuffer } from './stripes'
import { summarize } from './summary'

/** start, 2 × start, … up to max: the sweep of one dimension. */
function doubling(start: number, max: number): number[] {
  const out: number[] = []
  for (let v = start; v <= max; v *= 2) out.push(v)
  return out
}

/** The cases of a sweep, in the order run: threads, block size, batch size, op. */
export function sweep(cfg: Config): Array<{ threads: number; block: number; batch: number; op: 'read' | 'write' }> {
  const ops: Array<'read' | 'write'> = cfg.opType === 'mix' ? ['write', 'read'] : [cfg.opType]
  const out = []
  for (const threads of doubling(cfg.startNumThreads, cfg.maxNumThreads)) {
    for (const block of doubling(cfg.startBlockSize, cfg.maxBlockSize)) {
      for (const batch of doubling(cfg.startBatchSize, cfg.maxBatchSize)) {
        if (block * batch > cfg.totalBufferSize / threads) continue
        for (const op of ops) out.push({ threads, block, batch, op })
      }
    }
  }
  return out
}

/**
 * Unmeasured seconds before each case (Mooncake's 1 s). FERRY_TEBENCH_WARMUP_MS is a test
 * hook: a long warm-up lets a test interrupt a case before anything was measured.
 */
const WARMUP_MS = Number(process.env.FERRY_TEBENCH_WARMUP_MS) > 0 ? Number(process.env.FERRY_TEBENCH_WARMUP_MS) : 1000

export interface InitiatorResult {
  code: number
}

/** A case's record: the native row and what served it. */
function toRecord(
  op: 'read' | 'write',
  addressing: Addressing,
  requested: string,
  result: BenchResult,
  row: BenchRow,
  partial: boolean,
): CaseRecord {
  const r: CaseRecord = {
    record: 'case',
    op,
    transport: result.served.length === 1 ? result.served[0].transport : result.servedLabel,
    requested,
    addressing,
    served: result.served,
    failovers: result.failovers,
    ...row,
  }
  if (partial) r.partial = true
  return r
}

/** The record of a failed case, as the workers reported the failure. */
function failedRecord(f: BenchFailure): FailedRecord {
  return {
    record: 'failed',
    status: f.statusName,
    code: f.code ?? undefined,
    transport: f.transport,
    peer: f.peer,
    request: f.request,
    reason: f.reason,
  }
}

/**
 * --notifi: what the initiator sent during a case's measured time, its rate, and apart
 * what it sent during the warm-up (the engine's count since the last case, less the
 * measured part), so that the target's total can be checked against the initiator's.
 */
function notified(engine: Engine, result: BenchResult, durationS: number): NotifyRecord {
  const sent = engine.metrics().notificationsSent
  const all = sent - (sentSoFar.get(engine) ?? 0)
  sentSoFar.set(engine, sent)
  const count = result.notificationsSent
  return { record: 'notifications', role: 'initiator', count, warmup: all - count, lost: result.notificationsFailed, perSecond: count / durationS }
}
const sentSoFar = new WeakMap<Engine, number>()

/**
 * Runs initiator mode against `cfg.targetSegNames`; `child` is --local's target: its
 * engine joins the header, and --inject signals it.
 */
export async function runInitiator(cfg: Config, out: Output, info: RunInfo, child?: LocalTarget): Promise<InitiatorResult> {
  const engine = await Engine.create({
    transports: engineTransports(cfg.xportType),
    peerTimeoutMs: cfg.peerTimeoutMs,
    ...tuningOptions(cfg),
    ...metadataOptions(cfg),
    ...authOptions(cfg),
  })
  reportDisabled(engine, out)
  reportHeader(engine, out, 'initiator', cfg, info, child?.engine ? [child.engine] : [])
  const rows: CaseRecord[] = []
  const total = sweep(cfg).length
  let done = 0
  let bench: Bench | undefined
  const stopBench = () => bench?.stop()
  interrupt.onStop.add(stopBench)
  const requested = cfg.xportType ?? 'auto'
  const segName = cfg.targetSegNames.join(',')
  const fail = (status: string, request: string, reason: string, code?: string, peer = segName) =>
    out.failed({ record: 'failed', status, code, transport: requested, peer, request, reason })
  try {
    // Every target of the comma list; worker i works against target i % targets.
    const targets: TargetBuffer[] = []
    for (const name of cfg.targetSegNames) {
      let segment: Segment
      try {
        segment = await engine.openSegment(name)
      } catch (err) {
        const e = err as { code?: string; message?: string }
        fail('FAILED', `openSegment ${name}`, `cannot open segment ${name}: ${e.message}`, e.code ?? 'error', name)
        return { code: 1 }
      }
      const remote = segment.buffers[0]
      if (!remote) {
        fail('FAILED', `openSegment ${name}`, `segment ${name} exposes no buffer`, undefined, name)
        return { code: 1 }
      }
      if (remote.length < cfg.totalBufferSize) {
        out.usage(`segment ${name} exposes ${remote.length} B, less than --total_buffer_size=${cfg.totalBufferSize}`)
        return { code: 2 }
      }
      targets.push({ remote: segment, remoteBuffer: remote.id })
    }
    const [first, ...extraTargets] = targets
    const local = engine.allocate(cfg.totalBufferSize)
    let readBack: Region | undefined
    if (cfg.checkConsistency) {
      local.fill(PATTERN)
      readBack = engine.allocate(cfg.totalBufferSize)
    }
    // Whether the targets hold the pattern (a read case with --check_consistency needs it).
    let primed = false
    const ops: Array<'read' | 'write'> = cfg.opType === 'mix' ? ['write', 'read'] : [cfg.opType]
    let inject = cfg.inject && child ? { ...cfg.inject, target: child } : undefined

    for (const threads of doubling(cfg.startNumThreads, cfg.maxNumThreads)) {
      if (interrupt.stopped) break
      bench = engine.bench(threads)
      let group = ''
      try {
        for (const block of doubling(cfg.startBlockSize, cfg.maxBlockSize)) {
          for (const batch of doubling(cfg.startBatchSize, cfg.maxBatchSize)) {
            if (block * batch > cfg.totalBufferSize / threads) continue
            const stripeLen = stripeLength(cfg, threads, block)
            for (const op of ops) {
              if (interrupt.stopped) return { code: 130 }
              const what = `${op} ${block} B × ${batch}, ${threads} thread(s)`
              if (op === 'read' && readBack && !primed) {
                for (const t of targets) await copyStripes(engine, 'write', local, [t], 1, cfg.totalBufferSize)
                primed = true
              }
              const target = op === 'read' && readBack ? readBack : local
              if (op === 'read' && readBack) readBack.fill(0)
              if (group !== `${op}/${threads}`) out.groupStart(op, threads, requested, cfg.addressing)
              group = `${op}/${threads}`
              const warmupMs = WARMUP_MS
              progress.caseStarts(done++, total, `${what} over ${requested}`, (warmupMs + cfg.durationS * 1000) / 1000)
              // --inject: the fault lands in the first measured case, afterMs past its warm-up.
              let faultAt: number | undefined
              let faultTimer: NodeJS.Timeout | undefined
              const fault = inject
              if (fault) {
                faultTimer = setTimeout(() => {
                  faultAt = Date.now()
                  fault.target.signal(fault.signal)
                }, warmupMs + fault.afterMs)
              }
              const result = await bench.runCase({
                opcode: op,
                blockSize: block,
                batchSize: batch,
                local: target,
                remote: first.remote,
                remoteBuffer: first.remoteBuffer,
                extraTargets,
                stripeBase: 0,
                stripeLen,
                addressing: cfg.addressing,
                transport: cfg.xportType,
                durationMs: Math.round(cfg.durationS * 1000),
                warmupMs,
                requestIntervalUs: cfg.requestIntervalUs,
                notify: cfg.notifi,
              })
              clearTimeout(faultTimer)
              progress.clear()
              if (fault) {
                inject = undefined
                const since = (t: number | null | undefined) => (t == null || faultAt === undefined ? null : Math.max(0, t - faultAt))
                out.injected({
                  record: 'inject',
                  signal: fault.signal,
                  targetPid: fault.target.pid,
                  afterMs: fault.afterMs,
                  firstFailedMs: since(result.firstFailureAtMs),
                  lastTerminalMs: result.outcome === 'failed' ? since(result.endedAtMs) : null,
                })
              }
              if (result.outcome === 'failed') {
                const f = result.failure
                if (f) out.failed(failedRecord(f))
                else fail('FAILED', what, 'the case failed')
                return { code: 1 }
              }
              if (fault) {
                // The fault did not fail the case: the promise it checks was not kept.
                fail('FAILED', what, `${fault.signal} of the target did not fail the case`)
                return { code: 1 }
              }
              if (result.row) {
                const record = toRecord(op, cfg.addressing, requested, result, result.row, result.outcome === 'stopped')
                out.row(record, result.row, result.servedLabel)
                rows.push(record)
              }
              if (cfg.notifi) out.notifications(notified(engine, result, cfg.durationS))
              if (result.outcome === 'stopped' || interrupt.stopped) return { code: 130 }
              if (readBack && op === 'write' && cfg.opType === 'write') {
                readBack.fill(0)
                await copyStripes(engine, 'read', readBack, targets, threads, stripeLen)
                primed = true
              }
              if (readBack && (op === 'read' || cfg.opType === 'write')) {
                const problem = verify(local, readBack, threads, stripeLen, cfg.startBlockSize)
                if (problem) {
                  fail('INCONSISTENT', what, `consistency check FAILED: ${problem}`, 'ERR_TEBENCH_CONSISTENCY')
                  return { code: 1 }
                }
              }
              if (op === 'write') primed = true
            }
          }
        }
      } finally {
        bench.stop()
        bench = undefined
      }
    }
    // --notifi: the last submissions' notifications are still on their way; let them land
    // before the engine closes (bounded), so that the target's count is the whole run's.
    const deadline = Date.now() + 5_000
    for (;;) {
      const m = engine.metrics()
      if (m.notificationsDelivered + m.notificationsFailed >= m.notificationsSent || Date.now() > deadline) break
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
    return { code: 0 }
  } finally {
    interrupt.onStop.delete(stopBench)
    progress.clear()
    if (done > 0) out.summary(summarize(rows))
    await engine.close()
  }
}
