/**
 * The soak's memory verdict: whether each host's memory is flat after warm-up. Pure: it
 * takes per-round samples and returns figures; tested alone.
 *
 * Each host samples its memory at the end of every round right after a full garbage
 * collection (host.ts), so three series say different things:
 *
 *   rss          what the process holds, V8's reserved heap included;
 *   native       RSS less V8's reserved heap (`heapTotal`): the engine's own memory (its
 *                threads, connections, queues, registered regions) and Node's;
 *   heap         V8's live heap after that collection (`heapUsed`): objects still
 *                referenced, the library's and the soak host's own.
 *
 * A leak in the engine shows in `native` (or in `heap`, for the library's objects); a heap
 * that V8 reserved during a burst of garbage shows only in `rss`. None of them is excused:
 * the verdict names each.
 *
 * The rule: over the rounds from `fromRound` on (the later of the warm-up's end and the
 * run's middle), within one incarnation of a host (a restarted host starts afresh; the round
 * it restarted in is partial, so its sample there is left out), the least-squares slope of
 * the samples in MB per round must be at most the bound. A run of fewer than `minSamples`
 * samples is not judged (too short to tell a trend from noise); a host none of whose runs is
 * judged is not judged.
 */

/** One host's series (MB per round), null where it was down or did not answer. */
export type MemorySeries = Array<number | null>

/**
 * Runs at least this many samples long are judged. A host's RSS after a full collection
 * still wanders by a MB or two from round to round (malloc's arenas, the engine's buffers
 * in use at that instant): over 4 rounds the slope's standard error is about a third of
 * that, over the 6 of a default run's second half about a fifth, well below the bound.
 */
export const MIN_SAMPLES = 4

/**
 * The round after which memory is judged: the later of the warm-up's end and the run's
 * middle (memory that grows while a process warms up — V8's code and heap sizing, pages of
 * its regions touched for the first time — takes several rounds to settle; a leak goes on
 * growing).
 */
export function rssBaselineRound(rounds: number, warmupRounds: number): number {
  return Math.max(0, Math.min(rounds - 1, Math.max(warmupRounds, Math.floor(rounds / 2)) - 1))
}

/** Least-squares slope of `y` over `x`; null with fewer than two distinct `x`. */
export function slope(points: ReadonlyArray<readonly [x: number, y: number]>): number | null {
  const n = points.length
  if (n < 2) return null
  let sx = 0
  let sy = 0
  for (const [x, y] of points) {
    sx += x
    sy += y
  }
  const mx = sx / n
  const my = sy / n
  let sxx = 0
  let sxy = 0
  for (const [x, y] of points) {
    sxx += (x - mx) ** 2
    sxy += (x - mx) * (y - my)
  }
  return sxx === 0 ? null : sxy / sxx
}

export interface HostMemory {
  host: number
  /** The last judged run's first and last sample, and the growth between (MB). */
  fromMb: number | null
  endMb: number | null
  growthMb: number | null
  /** The steepest judged run's slope (MB per round), one decimal. */
  slopeMbPerRound: number | null
  /** Samples in judged runs. */
  samples: number
  flat: boolean | null
}

export interface MemoryFigures {
  fromRound: number
  boundMbPerRound: number
  hosts: HostMemory[]
  /** Every judged host flat; null when none is judged. */
  flat: boolean | null
  maxSlopeMbPerRound: number | null
}

const tenth = (v: number) => Math.round(v * 10) / 10

/** Runs of rounds `>= fromRound` of one incarnation each, as [round, MB] samples. */
function runs(series: MemorySeries, incarnations: ReadonlyArray<number | null>, fromRound: number): Array<Array<[number, number]>> {
  const out: Array<Array<[number, number]>> = []
  let current: Array<[number, number]> = []
  let inc: number | null = null
  for (let r = fromRound; r < series.length; r++) {
    const v = series[r]
    const i = incarnations[r] ?? null
    if (v === null || i === null) {
      inc = null
      continue
    }
    if (i !== inc) {
      if (current.length) out.push(current)
      current = []
      inc = i
      // Restarted during round r: its sample there is of a process still starting.
      if (r > 0 && incarnations[r - 1] !== i) continue
    }
    current.push([r, v])
  }
  if (current.length) out.push(current)
  return out
}

/**
 * Judges every host's `series` (MB after each round; `incarnations[h][r]` the incarnation
 * sampled) from round `fromRound` on: flat when every run of `minSamples` or more samples
 * grows at most `boundMbPerRound` per round.
 */
export function memoryFigures(
  series: readonly MemorySeries[],
  incarnations: ReadonlyArray<ReadonlyArray<number | null>>,
  fromRound: number,
  boundMbPerRound: number,
  minSamples = MIN_SAMPLES,
): MemoryFigures {
  const hosts = series.map((s, host): HostMemory => {
    const judged = runs(s, incarnations[host] ?? [], fromRound).filter((run) => run.length >= minSamples)
    if (judged.length === 0) return { host, fromMb: null, endMb: null, growthMb: null, slopeMbPerRound: null, samples: 0, flat: null }
    const slopes = judged.map((run) => slope(run) as number)
    const last = judged[judged.length - 1]
    const fromMb = last[0][1]
    const endMb = last[last.length - 1][1]
    const steepest = Math.max(...slopes)
    return {
      host,
      fromMb,
      endMb,
      growthMb: tenth(endMb - fromMb),
      slopeMbPerRound: tenth(steepest),
      samples: judged.reduce((n, run) => n + run.length, 0),
      flat: steepest <= boundMbPerRound,
    }
  })
  const judged = hosts.filter((h) => h.flat !== null)
  return {
    fromRound,
    boundMbPerRound,
    hosts,
    flat: judged.length ? judged.every((h) => h.flat) : null,
    maxSlopeMbPerRound: judged.length ? Math.max(...judged.map((h) => h.slopeMbPerRound as number)) : null,
  }
}

/** A host's memory as it reports it (bytes), sampled right after a full collection. */
export interface MemorySample {
  rss: number
  heapTotal: number
  heapUsed: number
  external: number
  arrayBuffers: number
}

/** Bytes in MB (10^6), one decimal. */
export const mb = (bytes: number) => Math.round(bytes / 1e5) / 10

/** The three judged quantities of one sample (MB): see the module's comment. */
export function judgedQuantities(m: MemorySample): { rss: number; native: number; heap: number } {
  return { rss: mb(m.rss), native: tenth(mb(m.rss) - mb(m.heapTotal)), heap: mb(m.heapUsed) }
}
