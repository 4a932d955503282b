/**
 * The soak's host processes, as the driver sees them: started inside their namespaces
 * through bench/lib/children.ts (so each is killed by pid on exit, Ctrl-C or a crash),
 * their reports parsed and handed on, commands sent, SIGKILLed and restarted on the same
 * address, stopped. Every wait is bounded.
 */
import type { ChildProcess } from 'node:child_process'
import * as path from 'node:path'
import * as readline from 'node:readline'
import type { Cluster } from '../../support/netns-cluster'
import { running, startTsx, stopChild, tailStderr } from '../lib/children'
import type { SoakConfig } from './flags'
import type { Command, HostSettings, Report } from './protocol'
import { within } from './wait'

const HOST_SCRIPT = path.join(__dirname, 'host.ts')

/**
 * V8's young generation pinned near its initial size (1 MB semi-spaces). Left alone, V8
 * doubles it, in steps further and further apart, each time enough objects have survived
 * its collections, up to 16 MB semi-spaces: tens of MB of RSS that arrive as sudden steps
 * late in a run and read as growth, though they are bounded and V8's own. Pinned, a host's
 * RSS shows what its engine and its live objects hold.
 */
const HOST_NODE_OPTIONS = '--max-semi-space-size=1'

export interface Ready {
  pid: number
  inc: number
  /** When the host said ready (its clock, which is this machine's). */
  t: number
  /** When its process started, and when it began to create its engine. */
  tProcess: number
  tEngineStart: number
}

interface Running {
  proc: ChildProcess
  stderr: () => string
  exited: Promise<void>
}

export class Hosts {
  readonly #procs: Array<Running | null>

  constructor(
    private readonly config: SoakConfig,
    private readonly cluster: Cluster,
    private readonly etcdUrl: `etcd://${string}`,
    private readonly secretFile: string,
    private readonly onReport: (r: Report) => void,
    private readonly log: (line: string) => void,
  ) {
    this.#procs = Array(config.hosts).fill(null)
  }

  settings(i: number): HostSettings {
    const c = this.config
    return {
      index: i,
      hosts: c.hosts,
      listen: `${this.cluster.hosts[i].address}:${c.port}`,
      etcd: this.etcdUrl,
      peerTimeoutMs: c.peerTimeoutMs,
      leaseTtlMs: c.leaseTtlMs,
      lanes: c.lanes,
      gapMs: c.gapMs,
      blockMin: c.blockMin,
      blockMax: c.blockMax,
      slots: c.slots,
      reopen: c.reopen,
      hangMs: c.hangMs,
    }
  }

  /**
   * Starts host `i`; resolves when it is ready, rejects when it exits first, reports an
   * error or is not ready after `timeoutMs` (then it is killed).
   */
  start(i: number, timeoutMs: number): Promise<Ready> {
    const proc = startTsx(`host ${i}`, HOST_SCRIPT, [], {
        FERRY_SOAK_HOST: JSON.stringify(this.settings(i)),
        FERRY_AUTH_SECRET_FILE: this.secretFile,
        NODE_OPTIONS: [process.env.NODE_OPTIONS, HOST_NODE_OPTIONS].filter(Boolean).join(' '),
      }, this.cluster.prefix(this.cluster.hosts[i]))
    const stderr = tailStderr(proc)
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
    this.#procs[i] = { proc, stderr, exited }
    return new Promise<Ready>((resolve, reject) => {
      let settled = false
      const timer = setTimeout(() => finish(new Error(`host ${i} not ready in ${timeoutMs} ms: ${stderr().slice(-500)}`)), timeoutMs)
      const finish = (err: Error | null, ready?: Ready) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        if (!err) return resolve(ready!)
        // A host that did not come up never lingers beside its next try.
        if (running(proc) && proc.pid !== undefined) process.kill(proc.pid, 'SIGKILL')
        reject(err)
      }
      const lines = readline.createInterface({ input: proc.stdout! })
      lines.on('line', (line) => {
        let r: Report
        try {
          r = JSON.parse(line) as Report
        } catch {
          this.log(`host ${i}: ${line}`)
          return
        }
        if (r.ev === 'ready') finish(null, { pid: r.pid, inc: r.inc, t: r.t, tProcess: r.tProcess, tEngineStart: r.tEngineStart })
        else if (r.ev === 'error') finish(new Error(`host ${i}: ${r.message}`))
        this.onReport(r)
      })
      proc.once('error', (err) => finish(err))
      void exited.then(() => finish(new Error(`host ${i} exited (code ${proc.exitCode}, signal ${proc.signalCode}) before ready: ${stderr().slice(-500)}`)))
    })
  }

  alive(i: number): boolean {
    const p = this.#procs[i]
    return p !== null && running(p.proc)
  }

  pid(i: number): number | undefined {
    return this.alive(i) ? this.#procs[i]!.proc.pid : undefined
  }

  send(i: number, c: Command): void {
    const p = this.#procs[i]
    if (!p || !running(p.proc) || !p.proc.stdin?.writable) return
    p.proc.stdin.write(JSON.stringify(c) + '\n')
  }

  broadcast(c: Command, except: readonly number[] = []): void {
    for (let i = 0; i < this.config.hosts; i++) if (!except.includes(i)) this.send(i, c)
  }

  /** SIGKILLs host `i` by pid; returns the time of the kill. */
  kill(i: number): number {
    const pid = this.pid(i)
    const t = Date.now()
    if (pid !== undefined) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {
        // gone already
      }
    }
    return t
  }

  /** Waits, at most `ms`, for host `i`'s process to exit. */
  async exited(i: number, ms: number): Promise<void> {
    const p = this.#procs[i]
    if (!p || !running(p.proc)) return
    await within(p.exited, ms)
  }

  /** Asks every host to stop, waits at most `ms`, then kills whoever is left. */
  async stopAll(ms: number): Promise<void> {
    this.broadcast({ cmd: 'stop' })
    const deadline = Date.now() + ms
    for (let i = 0; i < this.config.hosts; i++) await this.exited(i, Math.max(0, deadline - Date.now()))
    for (const p of this.#procs) if (p) await stopChild(p.proc, 'SIGKILL', 5000)
  }
}
