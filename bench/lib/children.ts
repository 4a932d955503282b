/**
 * Child processes of the performance suite. Every process started here is recorded and
 * killed by pid on exit, on error and on SIGINT/SIGTERM (see `installCleanup`).
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { log } from './log'

/** Repository root (bench/lib/ -> ../..). */
export const repoRoot = path.join(__dirname, '..', '..')

interface Tracked {
  proc: ChildProcess
  label: string
}

const live = new Map<number, Tracked>()

/** Starts `command` and records it for cleanup. stdio is piped unless told otherwise. */
export function startChild(label: string, command: string, args: string[], options: SpawnOptions = {}): ChildProcess {
  const proc = spawn(command, args, { cwd: repoRoot, stdio: ['pipe', 'pipe', 'pipe'], ...options })
  const pid = proc.pid
  if (pid === undefined) {
    // spawn failed synchronously (e.g. ENOENT); the 'error' event carries the reason.
    return proc
  }
  live.set(pid, { proc, label })
  proc.once('exit', () => live.delete(pid))
  return proc
}

/** Whether this code runs compiled to JavaScript (tsc's output, plain `node`) rather than under tsx. */
const compiled = path.extname(__filename) === '.js'

/**
 * Node's arguments that run a bench script named by its TypeScript source: the source with
 * the tsx loader, or, when this code runs compiled, the compiled `.js` beside where its
 * source's output goes, with no loader (tsc keeps the folder layout).
 */
export function nodeScriptArgs(script: string): string[] {
  if (compiled && script.endsWith('.ts')) return [script.slice(0, -3) + '.js']
  return ['--import=tsx', script]
}

/**
 * Starts a bench script with this Node: its TypeScript source with the tsx loader (as `npm
 * run perf` does), or its compiled JavaScript when perf runs compiled (`nodeScriptArgs`).
 * `prefix` runs it through a command that execs it (`ip netns exec NS`), so the pid stays
 * the Node process's.
 */
export function startTsx(label: string, script: string, args: string[] = [], env: Record<string, string> = {}, prefix: string[] = []): ChildProcess {
  const argv = [...prefix, process.execPath, ...nodeScriptArgs(script), ...args]
  return startChild(label, argv[0], argv.slice(1), {
    env: { ...process.env, ...env },
  })
}

const undo = new Set<() => void>()

/** Registers a synchronous clean-up (e.g. removing a network namespace) that `killAll` runs; returns its remover. */
export function atCleanup(fn: () => void): () => void {
  undo.add(fn)
  return () => undo.delete(fn)
}

/** Whether the process has not exited yet. */
export function running(proc: ChildProcess): boolean {
  return proc.exitCode === null && proc.signalCode === null
}

/** Kills one child by pid (SIGKILL by default) and waits, at most `waitMs`, for its exit. */
export async function stopChild(proc: ChildProcess, signal: NodeJS.Signals = 'SIGKILL', waitMs = 5_000): Promise<void> {
  if (proc.pid === undefined || !running(proc)) return
  const exited = new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, waitMs)
    proc.once('exit', () => {
      clearTimeout(timer)
      resolve()
    })
  })
  try {
    process.kill(proc.pid, signal)
  } catch {
    // gone already
  }
  await exited
}

/** Synchronously kills every child still alive, by pid. Safe to call more than once. */
export function killAll(reason: string): void {
  for (const [pid, t] of live) {
    if (!running(t.proc)) continue
    try {
      process.kill(pid, 'SIGKILL')
      log(`cleanup (${reason}): killed ${t.label} pid ${pid}`)
    } catch {
      // gone already
    }
  }
  live.clear()
  for (const fn of undo) {
    try {
      fn()
    } catch (err) {
      log(`cleanup (${reason}): ${(err as Error).message}`)
    }
  }
  undo.clear()
}

let installed = false

/**
 * Kills the children on exit, on uncaught errors and on SIGINT/SIGTERM/SIGHUP; after a
 * signal or a crash it calls `exit` with the code, which the CLI main supplies.
 */
export function installCleanup(exit: (code: number) => void): void {
  if (installed) return
  installed = true
  process.on('exit', () => killAll('exit'))
  for (const [sig, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
    ['SIGHUP', 129],
  ] as const) {
    process.on(sig, () => {
      log(`received ${sig}`)
      killAll(sig)
      exit(code)
    })
  }
  process.on('uncaughtException', (err) => {
    log(`uncaught: ${err?.stack ?? String(err)}`)
    killAll('uncaughtException')
    exit(1)
  })
  process.on('unhandledRejection', (err) => {
    log(`unhandled rejection: ${(err as Error)?.stack ?? String(err)}`)
    killAll('unhandledRejection')
    exit(1)
  })
}

/** Collects a child's stderr (last 8 KiB) for error messages. */
export function tailStderr(proc: ChildProcess): () => string {
  let tail = ''
  proc.stderr?.setEncoding('utf8')
  proc.stderr?.on('data', (d: string) => {
    tail = (tail + d).slice(-8192)
  })
  return () => tail
}

/**
 * Reads JSON lines from a child's stdout. `next()` resolves with the next line, rejecting
 * after `timeoutMs` or when the child exits first.
 */
export function jsonLines(proc: ChildProcess, describe: () => string = () => '') {
  const queue: Record<string, unknown>[] = []
  const waiters: Array<{ resolve: (v: Record<string, unknown>) => void; reject: (e: Error) => void }> = []
  let ended: Error | undefined
  const rl = readline.createInterface({ input: proc.stdout! })
  rl.on('line', (line) => {
    let value: Record<string, unknown>
    try {
      value = JSON.parse(line) as Record<string, unknown>
    } catch {
      log(`child pid ${proc.pid}: ${line}`)
      return
    }
    const w = waiters.shift()
    if (w) w.resolve(value)
    else queue.push(value)
  })
  proc.once('exit', (code, signal) => {
    ended = new Error(`child pid ${proc.pid} exited (code ${code}, signal ${signal}) ${describe()}`)
    for (const w of waiters.splice(0)) w.reject(ended)
  })
  proc.once('error', (err) => {
    ended = err
    for (const w of waiters.splice(0)) w.reject(err)
  })
  return {
    next(timeoutMs: number): Promise<Record<string, unknown>> {
      const ready = queue.shift()
      if (ready) return Promise.resolve(ready)
      if (ended) return Promise.reject(ended)
      return new Promise((resolve, reject) => {
        const entry = {
          resolve: (v: Record<string, unknown>) => {
            clearTimeout(timer)
            resolve(v)
          },
          reject: (e: Error) => {
            clearTimeout(timer)
            reject(e)
          },
        }
        const timer = setTimeout(() => {
          const i = waiters.indexOf(entry)
          if (i >= 0) waiters.splice(i, 1)
          reject(new Error(`child pid ${proc.pid}: no reply in ${timeoutMs} ms ${describe()}`))
        }, timeoutMs)
        waiters.push(entry)
      })
    },
    close() {
      rl.close()
    },
  }
}
