/**
 * The `soak` suite: whether native memory stays bounded over millions of small transfers.
 * A benchmark, not a timed test: it prints what it measured.
 *
 * One target engine runs in a child process (bench/target.ts); each case runs its
 * initiator in a fresh process of its own (bench/soak.ts), so that its resident set holds
 * only what that case kept. Cases, each a stream of 4 KiB WRITEs pinned to one transport:
 *
 *   shm-promise  shm, Promise API (`--window` awaited writes outstanding, default 32)
 *   shm-batch    shm, batch API (`--batches` batches of `--batch-tasks` tasks, default 4 x 16)
 *   tcp-promise  tcp, Promise API
 *   tcp-batch    tcp, batch API
 *
 * Each case runs `--soak-warmup` transfers (default 200 000), then `--soak-transfers`
 * (default 2 000 000), and prints one JSON line per case:
 *   {"suite":"soak","case":"shm-promise","value":<growth MB>,"unit":"MB","rss_warm_mb":…,
 *    "rss_end_mb":…,"limit_mb":32,"within_limit":true,"samples":[…],…}
 * `value` is the initiator's RSS after the transfers minus its RSS after the warm-up (MB =
 * 10^6 bytes); `samples` the RSS every `--soak-sample-every` transfers; `target_growth_mb`
 * the target's RSS growth over the same span (the target serves every case, so its figure
 * is relative to its state when the case's warm-up ended). Target: growth <= 32 MB.
 */
import { startTsx, stopChild, tailStderr, jsonLines } from '../lib/children'
import { log } from '../lib/log'
import { MiB, startTarget, type Target } from '../lib/rig'
import { round } from '../lib/stats'
import type { ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as path from 'node:path'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'soak'
const LIMIT_MB = 32

interface SoakCase {
  name: string
  transport: 'shm' | 'tcp'
  method: 'promise' | 'batch'
}

const CASES: SoakCase[] = [
  { name: 'shm-promise', transport: 'shm', method: 'promise' },
  { name: 'shm-batch', transport: 'shm', method: 'batch' },
  { name: 'tcp-promise', transport: 'tcp', method: 'promise' },
  { name: 'tcp-batch', transport: 'tcp', method: 'batch' },
]

/** Resolves when `proc` exits or after `ms`, whichever comes first. */
function exited(proc: ChildProcess, ms: number): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve()
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms)
    proc.once('exit', () => {
      clearTimeout(timer)
      resolve()
    })
  })
}

const mb = (bytes: number) => round(bytes / 1e6, 1)

/** VmRSS of another process, in bytes (null when it cannot be read). */
function rssOf(pid: number): number | null {
  try {
    const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))
    return m ? Number(m[1]) * 1024 : null
  } catch {
    return null
  }
}

interface Phase {
  phase: string
  done: number
  ms: number
  rss: number
  heapUsed: number
  external: number
  message?: string
}

async function runCase(c: SoakCase, target: Target, options: SuiteOptions): Promise<CaseRecord> {
  const record: CaseRecord = {
    suite: SUITE,
    case: c.name,
    value: null,
    unit: 'MB',
    baseline: 'none',
    baseline_value: null,
    ratio: null,
    transport: c.transport,
    method: c.method,
    block_bytes: 4096,
    warmup_transfers: options.soakWarmup,
    transfers: options.soakTransfers,
    limit_mb: LIMIT_MB,
  }
  const proc = startTsx(`soak ${c.name}`, path.join(__dirname, '..', 'soak.ts'), [], {
    FERRY_SOAK_SEGMENT: target.segment,
    FERRY_SOAK_BUFFER: String(target.buffer),
    FERRY_SOAK_TRANSPORT: c.transport,
    FERRY_SOAK_METHOD: c.method,
    FERRY_SOAK_WARMUP: String(options.soakWarmup),
    FERRY_SOAK_TRANSFERS: String(options.soakTransfers),
    FERRY_SOAK_SAMPLE_EVERY: String(options.soakSampleEvery),
    FERRY_SOAK_WINDOW: String(options.window),
    FERRY_SOAK_BATCH_TASKS: String(options.batchTasks),
    FERRY_SOAK_BATCHES: String(options.batchesInFlight),
  })
  const stderr = tailStderr(proc)
  const lines = jsonLines(proc, () => stderr())
  // Generous: the machines are shared and slow; a stall still ends the case.
  const stepMs = 600_000
  try {
    const samples: Array<{ done: number; rss_mb: number | null }> = []
    let warm: Phase | undefined
    let targetWarm: number | null = null
    for (;;) {
      const p = (await lines.next(stepMs)) as unknown as Phase
      if (p.phase === 'error') throw new Error(p.message ?? 'soak child failed')
      if (p.phase === 'warm') {
        warm = p
        targetWarm = rssOf(target.pid)
        record.rss_warm_mb = mb(p.rss)
        record.heap_warm_mb = mb(p.heapUsed)
        log(`${c.name}: warm after ${p.done} transfers (${p.ms} ms), rss ${mb(p.rss)} MB`)
        continue
      }
      if (!warm) throw new Error(`soak child sent ${p.phase} before warm`)
      samples.push({ done: p.done - warm.done, rss_mb: mb(p.rss) })
      if (p.phase === 'sample') {
        log(`${c.name}: ${p.done - warm.done} transfers, rss ${mb(p.rss)} MB`)
        continue
      }
      const targetEnd = rssOf(target.pid)
      const growth = p.rss - warm.rss
      record.value = mb(growth)
      record.rss_end_mb = mb(p.rss)
      record.heap_end_mb = mb(p.heapUsed)
      record.external_growth_mb = mb(p.external - warm.external)
      record.bytes_per_transfer = round(growth / (p.done - warm.done), 1)
      record.transfers_per_s = Math.round((p.done - warm.done) / (p.ms / 1000))
      record.target_growth_mb = targetWarm !== null && targetEnd !== null ? mb(targetEnd - targetWarm) : null
      record.within_limit = growth <= LIMIT_MB * 1e6
      record.samples = samples
      log(`${c.name}: rss ${mb(warm.rss)} -> ${mb(p.rss)} MB (${mb(growth)} MB) over ${p.done - warm.done} transfers`)
      // The child closes its engine and exits by itself; it is killed if it does not.
      await exited(proc, 30_000)
      return record
    }
  } catch (err) {
    record.error = (err as Error)?.message ?? String(err)
    return record
  } finally {
    lines.close()
    await stopChild(proc, 'SIGKILL', 30_000)
  }
}

export async function soakSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const target = await startTarget(16 * MiB)
  try {
    const records: CaseRecord[] = []
    for (const c of CASES) records.push(await runCase(c, target, options))
    return records
  } finally {
    await target.stop()
  }
}
