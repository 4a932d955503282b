/** Test helpers: a target engine in a child process, cleaned up by pid. */
import { spawn, type ChildProcess } from 'node:child_process'
import * as path from 'node:path'
import * as readline from 'node:readline'
import type { Engine, FerryError, Region, Segment } from '../index'

export interface TargetProcess {
  proc: ChildProcess
  pid: number
  segment: string
  buffer: number
  /** Sends a command and waits for its JSON reply. */
  ask(cmd: string): Promise<Record<string, unknown>>
  /** Kills the process (SIGKILL unless told otherwise) and waits for it to exit. */
  kill(signal?: NodeJS.Signals): Promise<void>
}

const live = new Set<ChildProcess>()

/**
 * Whether this runs under CI: `CI` set to anything but empty, `false` or `0`. CI installs
 * every tool the tests need (`.ci/run`), so there a test that lacks one fails, never skips.
 */
export function onCi(): boolean {
  const ci = (process.env.CI ?? '').trim().toLowerCase()
  return ci !== '' && ci !== 'false' && ci !== '0'
}

/** Kills every child still alive (call from test.after.always). */
export function killAll(): void {
  for (const p of live) {
    if (p.exitCode === null && p.signalCode === null && p.pid) {
      try {
        process.kill(p.pid, 'SIGKILL')
      } catch {
        // already gone
      }
    }
  }
  live.clear()
}

/** How long `ended` waits, after the process exited, for its pipes to close. */
const DRAIN_MS = 5_000

/**
 * Resolves with how `proc` ended once it exited and its stdout and stderr were read to
 * their end (`close`). `exit` alone can come before the last output is read: a check of
 * what it printed, made then, may miss it on a loaded machine. Bounded: `DRAIN_MS` after
 * the exit if something else (a grandchild) still holds the pipes.
 */
export function ended(proc: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined
    proc.once('exit', (code, signal) => {
      timer = setTimeout(() => resolve({ code, signal }), DRAIN_MS)
    })
    proc.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
      clearTimeout(timer)
      resolve({ code, signal })
    })
  })
}

/**
 * Starts tsx-run `script` with the repo's loader. `prefix` runs it through another command
 * that execs it (e.g. `ip netns exec NS`), so the pid is still the Node process's.
 */
export function spawnNode(script: string, env: Record<string, string> = {}, args: string[] = [], prefix: string[] = []) {
  const argv = [...prefix, process.execPath, '--import=tsx', script, ...args]
  const proc = spawn(argv[0], argv.slice(1), {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  })
  live.add(proc)
  proc.on('exit', () => live.delete(proc))
  return proc
}

/** Starts __test__/fixtures/target.ts (or `fixture`; through `prefix`, if given) and waits for its hello. */
export async function startTarget(
  env: Record<string, string> = {},
  timeoutMs = 20_000,
  prefix: string[] = [],
  fixture = 'target.ts',
): Promise<TargetProcess> {
  const proc = spawnNode(path.join(__dirname, 'fixtures', fixture), env, [], prefix)
  let stderr = ''
  proc.stderr?.on('data', (d) => (stderr += d))
  const lines = readline.createInterface({ input: proc.stdout! })
  const waiting: Array<(v: Record<string, unknown>) => void> = []
  const first = new Promise<Record<string, unknown>>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`target did not start in ${timeoutMs} ms: ${stderr}`)), timeoutMs)
    proc.once('exit', (code) => reject(new Error(`target exited early (${code}): ${stderr}`)))
    waiting.push((v) => {
      clearTimeout(timer)
      resolve(v)
    })
  })
  lines.on('line', (line) => {
    const next = waiting.shift()
    if (!next) return
    // A target killed while it wrote a reply leaves a cut last line: that ask gets no
    // answer (its timer says so) instead of an exception that would end the whole file.
    // A waiter stays queued after its timer fired, so a late reply is still taken as its.
    let value: Record<string, unknown>
    try {
      value = JSON.parse(line) as Record<string, unknown>
    } catch {
      return
    }
    next(value)
  })
  const hello = await first
  const exited = new Promise<void>((resolve) => {
    if (proc.exitCode !== null || proc.signalCode !== null) resolve()
    else proc.once('exit', () => resolve())
  })
  return {
    proc,
    pid: proc.pid!,
    segment: String(hello.segment),
    buffer: Number(hello.buffer),
    ask(cmd: string) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no answer to ${cmd}`)), 20_000)
        waiting.push((v) => {
          clearTimeout(timer)
          resolve(v)
        })
        proc.stdin!.write(cmd + '\n')
      })
    },
    async kill(signal: NodeJS.Signals = 'SIGKILL') {
      if (proc.exitCode === null && proc.signalCode === null) process.kill(proc.pid!, signal)
      await exited
    },
  }
}

/** Resolves after `ms`. */
export const delay = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** What one writer of `startWriters` saw. */
export interface WriteOutcome {
  at: number
  ok: boolean
  code?: string
}

/**
 * `n` writers looping 1 MiB writes over a 64 MiB stripe until their first failure (peer-death
 * tests); every outcome is timestamped.
 */
export function startWriters(
  engine: Engine,
  to: { local: Region; remote: Segment; remoteBuffer: number },
  n = 8,
) {
  const MiB = 1 << 20
  let running = true
  let completed = 0
  const outcomes: WriteOutcome[] = []
  const pump = async () => {
    while (running) {
      const off = (completed % 64) * MiB
      try {
        await engine.write({ ...to, localOffset: off, remoteOffset: off, length: MiB })
        completed++
        outcomes.push({ at: Date.now(), ok: true })
      } catch (e) {
        outcomes.push({ at: Date.now(), ok: false, code: (e as FerryError).code })
        return
      }
    }
  }
  const done = Promise.all(Array.from({ length: n }, pump))
  return {
    outcomes,
    completed: () => completed,
    stop: () => void (running = false),
    done,
  }
}
