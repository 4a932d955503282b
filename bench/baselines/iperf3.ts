/**
 * TCP loopback throughput ceiling: Debian's `iperf3`, one stream of 1 MiB writes.
 *   iperf3 -s -B 127.0.0.1 -p PORT --forceflush          (one server, several client runs)
 *   iperf3 -c 127.0.0.1 -p PORT -t SECONDS [-O WARMUP] -l 1M -J
 * GB/s = end.sum_received.bits_per_second / 8 / 1e9. A missing or failing iperf3 gives
 * `gbps: null` and a note, never an exception.
 *
 * `startIperf3Loopback` starts one server (without `-1`, so it serves client after client)
 * and returns a session whose `run` does one client run; `close` kills the server by pid
 * (it is also tracked by lib/children for exit/error/signal cleanup). If a client run fails
 * the server is killed and the next run starts a fresh one.
 */
import { spawnSync, type ChildProcess } from 'node:child_process'
import { log } from '../lib/log'
import { running, startChild, stopChild } from '../lib/children'
import { unusedPort } from '../../support/ports'

export interface Iperf3Result {
  gbps: number | null
  /** Description of the command line, for the record. */
  label: string
  note?: string
  /** CPU use reported by iperf3 (percent of one CPU, whole process). */
  senderCpu?: number
  receiverCpu?: number
}


/** Whether an `iperf3` binary runs here. */
export function haveIperf3(): boolean {
  const r = spawnSync('iperf3', ['--version'], { stdio: 'ignore', timeout: 5_000 })
  return r.error === undefined && r.status === 0
}

/** Cores to pin an iperf3 client and its server to (`iperf3 -A client,server`). */
export interface Iperf3Affinity {
  client: number
  server: number
}

export interface Iperf3Session {
  /**
   * One client run of `seconds` (whole seconds, at least 1) after `warmupSeconds` omitted;
   * with `affinity`, the client and (for this test) its server pinned to those cores.
   */
  run(seconds: number, warmupSeconds: number, affinity?: Iperf3Affinity): Promise<Iperf3Result>
  /**
   * Starts the server now (else the first run starts it) and waits until it listens; a
   * failure is logged, and the next run starts a fresh server.
   */
  prepare(): Promise<void>
  /** Kills the server. Safe to call more than once. */
  close(): Promise<void>
}

/** A running server: its port, and a wait for its n-th "Server listening" line. */
interface Server {
  proc: ChildProcess
  port: number
  /** Resolves once the server has printed "listening" at least `n` times (bounded). */
  listening(n: number, timeoutMs: number): Promise<void>
  output(): string
}

async function startServer(): Promise<Server> {
  const port = await unusedPort()
  // --forceflush: each "Server listening" reaches the pipe at once, which is how readiness
  // (first and after every test) is seen. No -1: the server serves client after client.
  const proc = startChild('iperf3 server', 'iperf3', ['-s', '-B', '127.0.0.1', '-p', String(port), '--forceflush'])
  let tail = ''
  let listens = 0
  let exited: Error | undefined
  const waiters = new Set<() => void>()
  const wake = () => {
    for (const w of [...waiters]) w()
  }
  const take = (d: string) => {
    tail = (tail + d).slice(-4096)
    listens += (d.match(/listening/gi) ?? []).length
    wake()
  }
  proc.stdout?.setEncoding('utf8')
  proc.stderr?.setEncoding('utf8')
  proc.stdout?.on('data', take)
  proc.stderr?.on('data', take)
  proc.once('exit', (code, signal) => {
    exited = new Error(`server exited (code ${code}, signal ${signal}): ${tail.trim().slice(-400)}`)
    wake()
  })
  proc.once('error', (e) => {
    exited = e
    wake()
  })
  return {
    proc,
    port,
    output: () => tail,
    listening(n, timeoutMs) {
      return new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.delete(check)
          reject(new Error(`server not listening (${listens}/${n}) after ${timeoutMs} ms: ${tail.trim().slice(-400)}`))
        }, timeoutMs)
        const check = () => {
          if (listens >= n) {
            clearTimeout(timer)
            waiters.delete(check)
            resolve()
          } else if (exited) {
            clearTimeout(timer)
            waiters.delete(check)
            reject(exited)
          }
        }
        waiters.add(check)
        check()
      })
    },
  }
}

export function startIperf3Loopback(length = '1M'): Iperf3Session {
  const label = `iperf3 -l ${length}`
  const available = haveIperf3()
  let server: Server | undefined
  /** Client runs done against the current server. */
  let runs = 0
  let closed = false

  const stopServer = async () => {
    const s = server
    server = undefined
    runs = 0
    if (s && running(s.proc)) await stopChild(s.proc)
  }

  const clientRun = async (seconds: number, warmupSeconds: number, affinity?: Iperf3Affinity): Promise<Iperf3Result> => {
    if (!server) server = await startServer()
    const s = server
    // Ready for the next test once it has said "listening" once more than tests served.
    await s.listening(runs + 1, 10_000)
    // iperf3 takes whole seconds.
    const secs = Math.max(1, Math.round(seconds))
    const args = ['-c', '127.0.0.1', '-p', String(s.port), '-t', String(secs), '-l', length, '-J']
    const omit = Math.round(warmupSeconds)
    if (omit > 0) args.push('-O', String(omit))
    if (affinity) args.push('-A', `${affinity.client},${affinity.server}`)
    log(`baseline: iperf3 ${args.join(' ')}`)
    runs++
    const client = startChild('iperf3 client', 'iperf3', args)
    let out = ''
    let err = ''
    client.stdout?.setEncoding('utf8')
    client.stderr?.setEncoding('utf8')
    client.stdout?.on('data', (d: string) => (out += d))
    client.stderr?.on('data', (d: string) => (err += d))
    const limitMs = (secs + omit + 20) * 1000
    const code = await new Promise<number | null>((resolve, reject) => {
      const timer = setTimeout(() => {
        void stopChild(client)
        reject(new Error(`client did not finish in ${limitMs} ms`))
      }, limitMs)
      client.once('error', (e) => {
        clearTimeout(timer)
        reject(e)
      })
      client.once('close', (c) => {
        clearTimeout(timer)
        resolve(c)
      })
    })
    let parsed: {
      error?: string
      end?: { sum_received?: { bits_per_second?: number }; cpu_utilization_percent?: { host_total?: number; remote_total?: number } }
    }
    try {
      parsed = JSON.parse(out)
    } catch {
      throw new Error(`client exit ${code}, output not JSON: ${(out + err).trim().slice(0, 400)}`)
    }
    if (parsed.error) throw new Error(parsed.error)
    const bps = parsed.end?.sum_received?.bits_per_second
    if (typeof bps !== 'number' || !(bps > 0)) throw new Error('no end.sum_received.bits_per_second in the output')
    return {
      gbps: bps / 8 / 1e9,
      label,
      senderCpu: parsed.end?.cpu_utilization_percent?.host_total,
      receiverCpu: parsed.end?.cpu_utilization_percent?.remote_total,
    }
  }

  return {
    async prepare() {
      if (!available || closed) return
      try {
        if (!server) server = await startServer()
        await server.listening(runs + 1, 10_000)
      } catch (err) {
        log(`iperf3 server failed to start: ${(err as Error).message}`)
        await stopServer()
      }
    },
    async run(seconds, warmupSeconds, affinity) {
      if (!available) {
        return { gbps: null, label, note: 'iperf3 not found on PATH (Debian: apt-get install iperf3); baseline skipped' }
      }
      if (closed) return { gbps: null, label, note: 'iperf3 session closed' }
      try {
        return await clientRun(seconds, warmupSeconds, affinity)
      } catch (err) {
        const note = `iperf3 failed: ${(err as Error).message}`
        log(note)
        // The server may be wedged mid-test; the next run starts a fresh one.
        await stopServer()
        return { gbps: null, label, note }
      }
    },
    async close() {
      closed = true
      await stopServer()
    },
  }
}

/** One client run against a server of its own, killed afterwards. */
export async function iperf3Loopback(seconds: number, warmupSeconds: number, length = '1M'): Promise<Iperf3Result> {
  const session = startIperf3Loopback(length)
  try {
    return await session.run(seconds, warmupSeconds)
  } finally {
    await session.close()
  }
}
