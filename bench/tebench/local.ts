/**
 * --local: a target child of this same script on 127.0.0.1, in its own process group, that
 * the initiator benches against and stops at its end (SIGTERM; SIGKILL after 3 s, or at
 * once when --inject stopped it). The child prints JSON records: its engine's line joins
 * this run's header (`LocalTarget.engine`), and its notification count, printed at its
 * end, is written here in this run's format.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import * as readline from 'node:readline'
import type { Config } from './config'
import type { FaultTarget, Injection } from './fault'
import { interrupt } from './interrupt'
import type { NotifyRecord, Output, SpreadRecord } from './output'

export interface LocalTarget extends FaultTarget {
  segment: string
  /** The target engine's line of the run header, when the child printed it. */
  engine: SpreadRecord | undefined
  stop(): Promise<void>
  killNow(): void
}

/**
 * Starts `script` (tebench's entry) as a target child and resolves once it printed the
 * command line to run against it, or rejects when it exits or does not start in time.
 */
export function startLocalTarget(script: string, cfg: Config, out: Output, timeoutMs = 30_000): Promise<LocalTarget> {
  const args = [...process.execArgv, script, '--rpc_server_port=0', `--total_buffer_size=${cfg.totalBufferSize}`]
  if (cfg.authSecretFile) args.push(`--auth_secret_file=${cfg.authSecretFile}`)
  if (cfg.notifi) args.push('--notifi')
  if (cfg.encrypt !== 'auto') args.push(cfg.encrypt ? '--encrypt' : '--noencrypt')
  args.push(`--tcp_lanes=${cfg.tcpLanes}`, '--format=json')
  const child: ChildProcess = spawn(process.execPath, args, {
    env: { ...process.env, FERRY_TEBENCH_CHILD: '1' },
    stdio: ['pipe', 'pipe', 'pipe'],
    detached: true, // own process group: a terminal Ctrl-C reaches only the initiator
  })
  let stderr = ''
  child.stderr?.on('data', (d) => (stderr += d))
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const alive = () => child.exitCode === null && child.signalCode === null
  // A target stopped by --inject=stop cannot handle SIGTERM: it is killed at once.
  let stopped = false
  const killNow = () => {
    if (alive() && child.pid) {
      try {
        process.kill(child.pid, 'SIGKILL')
      } catch {
        // gone
      }
    }
  }
  const signal = (sig: Injection['signal']) => {
    if (!alive() || !child.pid) return
    if (sig === 'SIGSTOP') stopped = true
    try {
      process.kill(child.pid, sig)
    } catch {
      // gone
    }
  }
  const stop = async () => {
    if (!alive()) return
    if (stopped) killNow()
    else child.kill('SIGTERM')
    let timer: NodeJS.Timeout | undefined
    await Promise.race([exited, new Promise<void>((r) => (timer = setTimeout(r, 3000)))])
    clearTimeout(timer)
    if (alive()) {
      killNow()
      await exited
    }
  }
  interrupt.onForce.add(killNow)
  return new Promise((resolve, reject) => {
    const lines = readline.createInterface({ input: child.stdout! })
    const timer = setTimeout(() => {
      void stop().then(() => reject(new Error(`target child did not start in ${timeoutMs} ms: ${stderr.trim()}`)))
    }, timeoutMs)
    child.once('exit', (code, sig) => {
      clearTimeout(timer)
      reject(new Error(`target child exited early (${sig ?? code}): ${stderr.trim()}`))
    })
    let engine: SpreadRecord | undefined
    lines.on('line', (line) => {
      // Its records: the engine's line of the header, kept for this run's header; the
      // --notifi count, printed at its end, part of this run's output.
      if (line.startsWith('{')) {
        let r: { record?: string }
        try {
          r = JSON.parse(line)
        } catch {
          return
        }
        if (r.record === 'engine') engine = r as SpreadRecord
        if (r.record === 'notifications') out.notifications(r as NotifyRecord)
        return
      }
      const m = /--target_seg_name=([^\s']+)/.exec(line)
      if (!m) return
      clearTimeout(timer)
      resolve({ segment: m[1], engine, pid: child.pid ?? 0, signal, stop, killNow })
    })
  })
}
