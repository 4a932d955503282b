/**
 * The `storm` suite: a handshake storm. `--engines` engines spread over `--procs` processes
 * (bench/storm.ts) on loopback, all opening each other at once; then every opened pair
 * makes one verified 64 KiB WRITE.
 *
 *   npm run perf -- --suite storm --engines 128 --procs 8
 *
 * The record's value is the storm's length: from the moment every process was told to
 * open to the moment the last one had all its segments opened (or failed), in seconds.
 * It also reports the writes' length, the descriptors and resident memory of each process
 * after the opens and after the writes, and per opened pair, and the errors seen (typed:
 * their code and message). Every process is bounded by `--storm-timeout`; one that does
 * not answer in time is the record's error (the storm hung), and is killed by pid.
 *
 * The engines use tcp only (`--storm-transports` changes it): engines in one process are
 * one host to shm, and shm's mappings would dominate what is measured.
 * `--storm-nofile N` runs each process under `prlimit --nofile=N`; `--io-threads N` gives
 * every engine N I/O threads, `--peer-timeout-ms` its peerTimeoutMs.
 */
import { jsonLines, startTsx, stopChild, tailStderr } from '../lib/children'
import { log } from '../lib/log'
import { round } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'storm'
const WRITE_BYTES = 64 << 10
/** The storm's goal at 128 engines in 8 processes, in seconds. */
const GOAL_S = 8

type Reply = Record<string, unknown>

const num = (r: Reply, k: string) => Number(r[k] ?? 0)

/** Adds up each process's error summary. */
function mergeErrors(replies: Reply[]): Record<string, number> {
  const out: Record<string, number> = {}
  for (const r of replies) {
    for (const [k, v] of Object.entries((r.errors as Record<string, number>) ?? {})) out[k] = (out[k] ?? 0) + v
  }
  return out
}

export async function stormSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const { stormEngines: engines, stormProcs: procs, stormTimeoutSeconds: timeoutS } = options
  const limitMs = timeoutS * 1000
  const perProc = Array.from({ length: procs }, (_, p) => Math.floor(engines / procs) + (p < engines % procs ? 1 : 0))
  const name = `open-all-${engines}x${procs}`
  const record: CaseRecord = {
    suite: SUITE,
    case: name,
    value: null,
    unit: 's (every engine opens every other)',
    baseline: `goal: <= ${GOAL_S} s at 128 engines in 8 processes`,
    baseline_value: null,
    ratio: null,
    engines,
    procs,
    transports: options.stormTransports,
    io_threads: options.ioThreads || 'default',
    peer_timeout_ms: options.peerTimeoutMs,
    nofile: options.stormNofile || 'inherited',
  }
  const children = perProc.map((n, p) => {
    const env = {
      FERRY_STORM_ENGINES: String(n),
      FERRY_STORM_SLOTS: String(engines),
      FERRY_STORM_BYTES: String(WRITE_BYTES),
      FERRY_STORM_TRANSPORTS: options.stormTransports,
      FERRY_STORM_IO_THREADS: String(options.ioThreads),
      FERRY_STORM_PEER_TIMEOUT_MS: String(options.peerTimeoutMs),
    }
    const prefix = options.stormNofile ? ['prlimit', `--nofile=${options.stormNofile}`, '--'] : []
    const proc = startTsx(`storm process ${p}`, 'bench/storm.ts', [], env, prefix)
    const stderr = tailStderr(proc)
    return { proc, lines: jsonLines(proc, () => stderr().slice(-2000)) }
  })
  const send = (cmd: object) => {
    for (const c of children) c.proc.stdin?.write(JSON.stringify(cmd) + '\n')
  }
  const all = (cmd: (p: number) => object) =>
    Promise.all(
      children.map((c, p) => {
        c.proc.stdin?.write(JSON.stringify(cmd(p)) + '\n')
        return c.lines.next(limitMs)
      }),
    )
  try {
    const ready = await Promise.all(children.map((c) => c.lines.next(limitMs)))
    const names = ready.flatMap((r) => r.names as string[])
    const first = perProc.map((_, p) => perProc.slice(0, p).reduce((a, b) => a + b, 0))
    log(`storm: ${engines} engines in ${procs} processes listening; opening ${engines * (engines - 1)} segments at once`)
    let t0 = performance.now()
    const opened = await all((p) => ({ cmd: 'open', names, first: first[p] }))
    const openS = (performance.now() - t0) / 1000
    const pairs = opened.reduce((n, r) => n + num(r, 'opened'), 0)
    log(`storm: ${pairs} opened, ${opened.reduce((n, r) => n + num(r, 'failed'), 0)} failed in ${openS.toFixed(2)} s`)
    t0 = performance.now()
    const wrote = await all(() => ({ cmd: 'write' }))
    const writeS = (performance.now() - t0) / 1000
    const checked = await all(() => ({ cmd: 'verify' }))
    // Per opened segment and side: what each process holds beyond what it held before the
    // storm, over the segments it opened and was opened by (2 x its engines' opens). After
    // the writes, the region pages they filled are taken out of the memory.
    const sides = Math.max(1, 2 * pairs)
    const total = (replies: Reply[], k: string) => replies.reduce((n, r) => n + num(r, k), 0)
    const perPairFds = (replies: Reply[]) => round((total(replies, 'fds') - total(ready, 'fds')) / sides, 2)
    const perPairKiB = (replies: Reply[], filled: number) => round((total(replies, 'rss') - total(ready, 'rss') - filled) / sides / 1024, 1)
    const mib = (r: Reply) => num(r, 'rss') / (1 << 20)
    Object.assign(record, {
      value: round(openS, 3),
      ratio: engines === 128 && procs === 8 ? round(openS / GOAL_S, 3) : null,
      opened: pairs,
      open_failed: opened.reduce((n, r) => n + num(r, 'failed'), 0),
      open_errors: mergeErrors(opened),
      write_s: round(writeS, 3),
      written: wrote.reduce((n, r) => n + num(r, 'written'), 0),
      write_failed: wrote.reduce((n, r) => n + num(r, 'failed'), 0),
      write_errors: mergeErrors(wrote),
      verified: checked.reduce((n, r) => n + num(r, 'matching'), 0),
      mismatches: checked.reduce((n, r) => n + num(r, 'mismatches'), 0),
      fds_after_open: opened.map((r) => num(r, 'fds')),
      fds_after_write: wrote.map((r) => num(r, 'fds')),
      fds_per_pair_side_after_open: perPairFds(opened),
      fds_per_pair_side_after_write: perPairFds(wrote),
      rss_mib_after_write: wrote.map((r) => round(mib(r), 1)),
      rss_kib_per_pair_side_after_open: perPairKiB(opened, 0),
      rss_kib_per_pair_side_after_write: perPairKiB(wrote, total(wrote, 'written') * WRITE_BYTES),
    })
    const errors: string[] = []
    if (num(record, 'mismatches') > 0) errors.push(`${record.mismatches} slots hold wrong bytes`)
    if (num(record, 'verified') !== num(record, 'written')) errors.push(`${record.written} writes resolved but ${record.verified} slots verified`)
    if (errors.length) record.error = errors.join('; ')
  } catch (err) {
    record.error = `the storm did not finish within ${timeoutS} s: ${(err as Error).message.slice(0, 1500)}`
  } finally {
    send({ cmd: 'exit' })
    await Promise.all(children.map((c) => stopChild(c.proc, 'SIGKILL', 5_000)))
  }
  log(`storm: ${JSON.stringify(record)}`)
  return [record]
}
