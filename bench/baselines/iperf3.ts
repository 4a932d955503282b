/**
 * TCP loopback throughput ceiling: Debian's `iperf3`, one stream of 1 MiB writes.
 *   iperf3 -s -B 127.0.0.1 -p PORT -1
 *   iperf3 -c 127.0.0.1 -p PORT -t SECONDS -O WARMUP -l 1M -J
 * GB/s = end.sum_received.bits_per_second / 8 / 1e9. A missing or failing iperf3 gives
 * `gbps: null` and a note, never an exception.
 */
import { spawnSync } from 'node:child_process'
import * as net from 'node:net'
import { log } from '../lib/log'
import { running, startChild, stopChild } from '../lib/children'

export interface Iperf3Result {
  gbps: number | null
  /** Description of the command line, for the record. */
  label: string
  note?: string
  /** CPU use reported by iperf3 (percent of one CPU, whole process). */
  senderCpu?: number
  receiverCpu?: number
}

/** A port that was free a moment ago on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port
      srv.close(() => resolve(port))
    })
  })
}

/** Whether an `iperf3` binary runs here. */
export function haveIperf3(): boolean {
  const r = spawnSync('iperf3', ['--version'], { stdio: 'ignore', timeout: 5_000 })
  return r.error === undefined && r.status === 0
}

export async function iperf3Loopback(seconds: number, warmupSeconds: number, length = '1M'): Promise<Iperf3Result> {
  const label = `iperf3 -l ${length}`
  if (!haveIperf3()) {
    return { gbps: null, label, note: 'iperf3 not found on PATH (Debian: apt-get install iperf3); baseline skipped' }
  }
  try {
    return await runOnce(seconds, warmupSeconds, length, label)
  } catch (err) {
    const note = `iperf3 failed: ${(err as Error).message}`
    log(note)
    return { gbps: null, label, note }
  }
}

async function runOnce(seconds: number, warmupSeconds: number, length: string, label: string): Promise<Iperf3Result> {
  const port = await freePort()
  // --forceflush: "Server listening" reaches the pipe at once, which is how readiness is seen.
  const server = startChild('iperf3 server', 'iperf3', ['-s', '-B', '127.0.0.1', '-p', String(port), '-1', '--forceflush'])
  let serverOut = ''
  server.stdout?.setEncoding('utf8')
  server.stderr?.setEncoding('utf8')
  server.stdout?.on('data', (d: string) => (serverOut += d))
  server.stderr?.on('data', (d: string) => (serverOut += d))
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`server not listening after 10 s: ${serverOut.trim()}`)), 10_000)
      const check = () => {
        if (/listening/i.test(serverOut)) {
          clearTimeout(timer)
          resolve()
        }
      }
      server.stdout?.on('data', check)
      server.once('exit', (code) => {
        clearTimeout(timer)
        reject(new Error(`server exited (${code}): ${serverOut.trim()}`))
      })
      server.once('error', (e) => {
        clearTimeout(timer)
        reject(e)
      })
      check()
    })
    // iperf3 takes whole seconds.
    const secs = Math.max(1, Math.round(seconds))
    const args = ['-c', '127.0.0.1', '-p', String(port), '-t', String(secs), '-l', length, '-J']
    const omit = Math.round(warmupSeconds)
    if (omit > 0) args.push('-O', String(omit))
    log(`baseline: iperf3 ${args.join(' ')}`)
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
  } finally {
    if (running(server)) await stopChild(server)
  }
}
