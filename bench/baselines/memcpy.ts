/**
 * memcpy baseline of the `shm` suite: bench/baselines/memcpy_bench.c, compiled at run time
 * with `gcc -O2` into a temporary directory (removed on close and at exit), run as one child
 * process that pre-touches its source and destination once and then serves one timed run
 * per round (`run SECONDS WARMUP` on stdin, one JSON line back), as one target engine
 * serves every round of the engine. A missing gcc, a failed compile or a failed run gives
 * `gbps: null` and a note, never an exception. The child is tracked by lib/children and
 * killed by pid on exit, error and signals.
 */
import { spawnSync, type ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { jsonLines, running, startChild, stopChild, tailStderr } from '../lib/children'
import { log } from '../lib/log'

export interface MemcpyResult {
  gbps: number | null
  note?: string
}

export interface MemcpySession {
  /** Description for the record. */
  label: string
  /** One time-bounded run of `seconds` after `warmupSeconds` of untimed copying. */
  run(seconds: number, warmupSeconds: number): Promise<MemcpyResult>
  /** Kills the child and removes the temporary directory. Safe to call more than once. */
  close(): Promise<void>
}

const SOURCE = path.join(__dirname, 'memcpy_bench.c')

/** Compiles memcpy_bench.c; the binary's path, or a note saying why there is none. */
function compile(dir: string): { binary: string } | { note: string } {
  const version = spawnSync('gcc', ['--version'], { stdio: 'ignore', timeout: 10_000 })
  if (version.error !== undefined || version.status !== 0) {
    return { note: 'gcc not found: the memcpy baseline (bench/baselines/memcpy_bench.c) was not measured' }
  }
  const binary = path.join(dir, 'memcpy_bench')
  const r = spawnSync('gcc', ['-O2', '-o', binary, SOURCE], { encoding: 'utf8', timeout: 60_000 })
  if (r.error !== undefined || r.status !== 0) {
    const why = r.error?.message ?? `${r.stderr ?? ''}`.trim().slice(-500)
    return { note: `gcc -O2 memcpy_bench.c failed: ${why}` }
  }
  return { binary }
}

/** Seeds of the pages' shuffles on the source and the destination side (`--shuffle`). */
export interface Shuffle {
  local: number
  remote: number
}

export async function startMemcpyBaseline(workingSetBytes: number, blockBytes: number, shuffle?: Shuffle): Promise<MemcpySession> {
  const order = shuffle === undefined ? '' : `, pages in seeded shuffles (${shuffle.local}, ${shuffle.remote}) on the two sides as the engine's stream`
  const label = `memcpy, 1 thread, ${workingSetBytes / (1 << 20)} MiB working set (src and dst each, pre-touched), ${blockBytes / 1024} KiB blocks${order} (bench/baselines/memcpy_bench.c, gcc -O2)`
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-perf-memcpy-'))
  const removeDir = () => fs.rmSync(dir, { recursive: true, force: true })
  process.once('exit', removeDir)
  const unavailable = (note: string): MemcpySession => ({
    label,
    run: async () => ({ gbps: null, note }),
    async close() {
      removeDir()
    },
  })

  const built = compile(dir)
  if ('note' in built) {
    log(`memcpy baseline unavailable: ${built.note}`)
    return unavailable(built.note)
  }
  let proc: ChildProcess | undefined
  let lines: ReturnType<typeof jsonLines> | undefined
  try {
    const shuffleArgs = shuffle === undefined ? [] : ['--shuffle', `${shuffle.local},${shuffle.remote}`]
    proc = startChild('memcpy baseline', built.binary, [...shuffleArgs, String(workingSetBytes), String(blockBytes)])
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
        return { gbps }
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
