/**
 * N iperf3 streams side by side, the `scale` suite's tcp baseline: N client processes, each
 * against a server process of its own on its own port, started together; GB/s = the sum of
 * the clients' received rates (end.sum_received). Not `iperf3 -P N`: iperf3 3.12 runs every
 * stream of one process on one thread, so -P measures one core's ceiling whatever N is.
 *
 * The servers (bench/baselines/iperf3.ts sessions) are kept between runs and grow with the
 * largest N asked; they start one after another, so each picks its free port in turn.
 */
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
 * `cross-core`: stream i's client pinned to core i, its server to the next core (`-A`), so
 * every byte is received on another core than the one that sent it, as between hosts
 * (where the receiving copy never finds the sender's cache).
 */
export type Iperf3Placement = 'free' | 'cross-core'

/** The cores of stream `i` of a cross-core group on a host of `cores` cores (at least 2). */
export function crossCoreAffinity(i: number, cores: number): Iperf3Affinity {
  return { client: i % cores, server: (i + 1) % cores }
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
      (placement === 'cross-core' ? `; stream i's client pinned to core i and its server to core i+1 (iperf3 -A), mod ${os.availableParallelism()} cores` : ''),
    async run(n, seconds, warmupSeconds, placement = 'free') {
      while (sessions.length < n) sessions.push(startIperf3Loopback(length))
      const used = sessions.slice(0, n)
      for (const s of used) await s.prepare()
      const cores = os.availableParallelism()
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
