/**
 * Round-trip baseline of the `tcp` suite's write-4KiB-rtt case: bench/baselines/tcp_rtt.c,
 * a bare 4 KiB request / 16-byte answer over loopback TCP between two processes, compiled at
 * run time with `cc -O2` into a temporary directory (removed on close and at exit; prebuilt
 * when FERRY_PERF_BIN_DIR is set, see c_program.ts). Each run is a fresh pair of processes
 * (fork), time-bounded, in one of two forms: the client waits in a blocking read, or
 * busy-polls a non-blocking socket. A failed build or run throws, with the reason.
 */
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { running, startChild, stopChild } from '../lib/children'
import { buildCProgram } from './c_program'

export type RttMode = 'blocking' | 'polling'
export const RTT_MODES: readonly RttMode[] = ['blocking', 'polling']

/** One run's figures, in µs per round trip. */
export interface RttResult {
  ops: number
  avgUs: number
  p50Us: number
  p99Us: number
}

export interface TcpRttSession {
  /** What a form measures, for the record. */
  label(mode: RttMode): string
  /** One run: `warmupSeconds` of untimed round trips, then `seconds` timed. */
  run(mode: RttMode, seconds: number, warmupSeconds: number): Promise<RttResult>
  /** Removes the temporary directory. Safe to call more than once. */
  close(): void
}

const MODE_TEXT: Record<RttMode, string> = {
  blocking: 'client waits in a blocking read',
  polling: 'client busy-polls recv(MSG_DONTWAIT) on a non-blocking socket',
}

/** Builds tcp_rtt; its runs take `requestBytes` requests and `answerBytes` answers. */
export function startTcpRttBaseline(requestBytes: number, answerBytes: number): TcpRttSession {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-perf-rtt-'))
  const atExit = () => fs.rmSync(dir, { recursive: true, force: true })
  process.once('exit', atExit)
  const built = buildCProgram('tcp_rtt', dir, 'cc', ['-O2'])
  const how = 'note' in built ? '' : built.prebuilt ? `prebuilt: ${built.binary}` : 'cc -O2'
  return {
    label: (mode) =>
      `C loopback TCP round trip, ${requestBytes} B request / ${answerBytes} B answer, TCP_NODELAY, two processes (fork), ${MODE_TEXT[mode]}; server blocking (bench/baselines/tcp_rtt.c, ${how})`,
    async run(mode, seconds, warmupSeconds) {
      if ('note' in built) throw new Error(built.note)
      const args = [...(mode === 'polling' ? ['--poll'] : []), String(seconds), String(warmupSeconds), String(requestBytes), String(answerBytes)]
      const proc = startChild(`tcp_rtt ${mode}`, built.binary, args, { stdio: ['ignore', 'pipe', 'pipe'] })
      let out = ''
      let err = ''
      proc.stdout?.setEncoding('utf8')
      proc.stderr?.setEncoding('utf8')
      proc.stdout?.on('data', (d: string) => (out += d))
      proc.stderr?.on('data', (d: string) => (err += d))
      const limitMs = (seconds + warmupSeconds + 30) * 1000
      const code = await new Promise<number | null>((resolve, reject) => {
        const timer = setTimeout(() => {
          if (running(proc)) void stopChild(proc)
          reject(new Error(`tcp_rtt ${mode} did not finish in ${limitMs} ms`))
        }, limitMs)
        proc.once('error', (e) => {
          clearTimeout(timer)
          reject(e)
        })
        proc.once('close', (c) => {
          clearTimeout(timer)
          resolve(c)
        })
      })
      let r: Record<string, unknown>
      try {
        r = JSON.parse(out.trim().split('\n').pop() ?? '') as Record<string, unknown>
      } catch {
        throw new Error(`tcp_rtt ${mode} exit ${code}, output not JSON: ${(out + err).trim().slice(0, 400)}`)
      }
      if (typeof r.error === 'string') throw new Error(`tcp_rtt ${mode}: ${r.error}`)
      const result = { ops: Number(r.ops), avgUs: Number(r.avg_us), p50Us: Number(r.p50_us), p99Us: Number(r.p99_us) }
      if (!Object.values(result).every(Number.isFinite) || result.ops <= 0) throw new Error(`tcp_rtt ${mode}: unexpected output ${out.trim()}`)
      return result
    },
    close() {
      process.off('exit', atExit)
      atExit()
    },
  }
}
