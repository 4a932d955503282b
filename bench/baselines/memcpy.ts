/**
 * memcpy baseline of the `shm` suite: bench/baselines/memcpy_bench.c, compiled at run time
 * with `gcc -O2` into a temporary directory (removed on close and at exit; prebuilt when
 * FERRY_PERF_BIN_DIR is set, see c_program.ts), run as one child
 * process that pre-touches its source and destination once and then serves one timed run
 * per round (`run SECONDS WARMUP` on stdin, one JSON line back), as one target engine
 * serves every round of the engine. A missing gcc, a failed compile or a failed run gives
 * `gbps: null` and a note, never an exception. The child is tracked by lib/children and
 * killed by pid on exit, error and signals.
 */
import type { ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { jsonLines, running, startChild, stopChild, tailStderr } from '../lib/children'
import { log } from '../lib/log'
import { buildCProgram } from './c_program'

export interface MemcpyResult {
  gbps: number | null
  note?: string
  /** With `threads`: the slowest and the fastest thread's own GB/s. */
  threadGbps?: { min: number; max: number }
}

export interface MemcpySession {
  /** Description for the record. */
  label: string
  /** One time-bounded run of `seconds` after `warmupSeconds` of untimed copying. */
  run(seconds: number, warmupSeconds: number): Promise<MemcpyResult>
  /** Kills the child and removes the temporary directory. Safe to call more than once. */
  close(): Promise<void>
}

/** Seeds of the pages' shuffles on the source and the destination side (`--shuffle`). */
export interface Shuffle {
  local: number
  remote: number
}

/**
 * Starts the baseline: one thread copying `blockBytes` blocks through a source and a
 * destination of `workingSetBytes` each (the pages in `shuffle`'s order if given), or with
 * `threads`, that many threads side by side, each through buffers of its own (the `scale`
 * suite's form: its loop reads the clock once per 64 KiB, see memcpy_bench.c).
 */
export async function startMemcpyBaseline(workingSetBytes: number, blockBytes: number, shuffle?: Shuffle, threads?: number): Promise<MemcpySession> {
  const order = shuffle === undefined ? '' : `, pages in seeded shuffles (${shuffle.local}, ${shuffle.remote}) on the two sides as the engine's stream`
  const who = threads === undefined ? '1 thread' : `${threads} thread(s) side by side, each with its own`
  const describe = (how: string) =>
    `memcpy, ${who}, ${workingSetBytes / (1 << 20)} MiB working set (src and dst each, pre-touched), ${blockBytes / 1024} KiB blocks${order} (bench/baselines/memcpy_bench.c, ${how})`
  let label = describe('gcc -O2')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-perf-memcpy-'))
  const atExit = () => fs.rmSync(dir, { recursive: true, force: true })
  const removeDir = () => {
    process.off('exit', atExit)
    atExit()
  }
  process.once('exit', atExit)
  const unavailable = (note: string): MemcpySession => ({
    label,
    run: async () => ({ gbps: null, note }),
    async close() {
      removeDir()
    },
  })

  const built = buildCProgram('memcpy_bench', dir, 'gcc', ['-O2', '-pthread'])
  if ('note' in built) {
    log(`memcpy baseline unavailable: ${built.note}`)
    return unavailable(built.note)
  }
  if (built.prebuilt) label = describe(`prebuilt: ${built.binary}`)
  let proc: ChildProcess | undefined
  let lines: ReturnType<typeof jsonLines> | undefined
  try {
    const shuffleArgs = shuffle === undefined ? [] : ['--shuffle', `${shuffle.local},${shuffle.remote}`]
    const threadArgs = threads === undefined ? [] : ['--threads', String(threads)]
    proc = startChild('memcpy baseline', built.binary, [...threadArgs, ...shuffleArgs, String(workingSetBytes), String(blockBytes)])
    const stderr = tailStderr(proc)
    lines = jsonLines(proc, () => stderr())
    const hello = await lines.next(60_000)
    if (hello.ready !== true) throw new Error(`unexpected hello ${JSON.stringify(hello)}`)
    log(`memcpy baseline pid ${proc.pid} ready: ${workingSetBytes / (1 << 20)} MiB src + dst pre-touched`)
  } catch (err) {
    lines?.close()
    if (proc) await stopChild(proc)
    const note = `memcpy baseline failed to start: ${(err as Error).message}`
    log(note)
    return unavailable(note)
  }
  const child = proc
  const out = lines
  let failed: string | undefined
  return {
    label,
    async run(seconds, warmupSeconds) {
      if (failed !== undefined) return { gbps: null, note: failed }
      try {
        child.stdin!.write(`run ${seconds} ${warmupSeconds}\n`)
        const r = await out.next((seconds + warmupSeconds + 30) * 1000)
        const gbps = Number(r.gbps)
        if (!Number.isFinite(gbps)) throw new Error(`unexpected reply ${JSON.stringify(r)}`)
        if (r.threads === undefined) return { gbps }
        return { gbps, threadGbps: { min: Number(r.thread_gbps_min), max: Number(r.thread_gbps_max) } }
      } catch (err) {
        // A lost or confused child serves no later round either.
        failed = `memcpy baseline run failed: ${(err as Error).message}`
        log(failed)
        await stopChild(child)
        return { gbps: null, note: failed }
      }
    },
    async close() {
      out.close()
      if (running(child)) child.stdin?.end()
      await stopChild(child)
      removeDir()
    },
  }
}
