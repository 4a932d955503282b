/**
 * N iperf3 streams side by side, the `scale` suite's tcp baseline: N client processes, each
 * against a server process of its own on its own port, started together; GB/s = the sum of
 * the clients' received rates (end.sum_received). Not `iperf3 -P N`: iperf3 3.12 runs every
 * stream of one process on one thread, so -P measures one core's ceiling whatever N is.
 *
 * The servers (bench/baselines/iperf3.ts sessions) are kept between runs and grow with the
 * largest N asked; they start one after another, so each picks its free port in turn.
 */
import * as fs from 'node:fs'
import * as os from 'node:os'
import { startIperf3Loopback, type Iperf3Affinity, type Iperf3Session } from './iperf3'

export interface Iperf3GroupResult {
  /** The streams' rates summed; null when any stream has none. */
  gbps: number | null
  /** Each stream's GB/s. */
  streams: Array<number | null>
  note?: string
}

/**
 * Where a group's processes run. `free`: where the scheduler puts them — on loopback it
 * tends to run each client on its server's core (the client sleeps when its socket fills,
 * the server is woken there), so both copies of a byte stay in one core's cache.
 * `cross-core`: stream i's client pinned to the i-th core this process may use, its server
 * to the next (`-A`, `crossCoreAffinity`), so every byte is received on another core than
 * the one that sent it, as between hosts (where the receiving copy never finds the
 * sender's cache).
 */
export type Iperf3Placement = 'free' | 'cross-core'

/**
 * The cores of stream `i` of a cross-core group, among `cores` (the CPU numbers this
 * process may run on, at least 2): the i-th for the client, the next for its server.
 */
export function crossCoreAffinity(i: number, cores: readonly number[]): Iperf3Affinity {
  return { client: cores[i % cores.length], server: cores[(i + 1) % cores.length] }
}

/** A Linux CPU list (`0-3,8,10-11`) as CPU numbers, ascending; null if it is not one. */
export function parseCpuList(text: string): number[] | null {
  const out = new Set<number>()
  for (const part of text.trim().split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim())
    if (!m) return null
    const lo = Number(m[1])
    const hi = m[2] === undefined ? lo : Number(m[2])
    if (hi < lo || hi - lo > 65_536) return null
    for (let c = lo; c <= hi; c++) out.add(c)
  }
  return out.size ? [...out].sort((a, b) => a - b) : null
}

/**
 * The CPUs this process may run on: Linux's `Cpus_allowed_list` (a container or `taskset`
 * may allow 4-7 and not 0-3, where `-A 0` would fail), else 0 … availableParallelism − 1.
 */
export function allowedCores(): number[] {
  try {
    const line = /^Cpus_allowed_list:\s*(.+)$/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))
    const cores = line ? parseCpuList(line[1]) : null
    if (cores) return cores
  } catch {
    // Not Linux, or no procfs: the count alone.
  }
  return Array.from({ length: os.availableParallelism() }, (_, i) => i)
}

export interface Iperf3Group {
  /** What `run(n, …)` measures, for the record. */
  label(n: number, placement?: Iperf3Placement): string
  /**
   * One run of `n` streams side by side, `seconds` each after `warmupSeconds` omitted (whole
   * seconds), placed as `placement` says (`free` by default).
   */
  run(n: number, seconds: number, warmupSeconds: number, placement?: Iperf3Placement): Promise<Iperf3GroupResult>
  /** Kills every server. */
  close(): Promise<void>
}

/** A group whose clients send `length`-byte writes (`iperf3 -l`). */
export function startIperf3Group(length: string): Iperf3Group {
  const sessions: Iperf3Session[] = []
  return {
    label: (n, placement = 'free') =>
      `${n} x iperf3 -c 127.0.0.1 -l ${length} side by side, each its own client and server process on its own port (not -P), received rates summed` +
      (placement === 'cross-core' ? `; stream i's client pinned to the i-th allowed core and its server to the next (iperf3 -A), among cores ${allowedCores().join(',')}` : ''),
    async run(n, seconds, warmupSeconds, placement = 'free') {
      while (sessions.length < n) sessions.push(startIperf3Loopback(length))
      const used = sessions.slice(0, n)
      for (const s of used) await s.prepare()
      const cores = allowedCores()
      const affinity = (i: number) => (placement === 'cross-core' ? crossCoreAffinity(i, cores) : undefined)
      const results = await Promise.all(used.map((s, i) => s.run(seconds, warmupSeconds, affinity(i))))
      const streams = results.map((r) => r.gbps)
      const notes = [...new Set(results.map((r) => r.note).filter((x): x is string => !!x))]
      const complete = streams.every((g): g is number => g !== null)
      return {
        gbps: complete ? streams.reduce((a, g) => a + g, 0) : null,
        streams,
        note: notes.length ? notes.join('; ') : undefined,
      }
    },
    async close() {
      await Promise.all(sessions.map((s) => s.close()))
    },
  }
}
