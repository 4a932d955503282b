/** Small numeric helpers for the performance suite. */

/** Nearest-rank percentile (q in [0, 1]) of an ascending-sorted array; NaN when empty. */
export function percentile(sorted: ArrayLike<number>, q: number): number {
  if (sorted.length === 0) return Number.NaN
  const rank = Math.ceil(q * sorted.length) - 1
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank))]
}

/** Sorts a copy of the samples ascending. */
export function sorted(samples: ArrayLike<number>): Float64Array {
  return Float64Array.from(samples).sort()
}

/** p50/p90/p99/p99.9/mean/min/max of latency samples. */
export function summarize(samples: ArrayLike<number>) {
  const s = sorted(samples)
  let sum = 0
  for (let i = 0; i < s.length; i++) sum += s[i]
  return {
    n: s.length,
    p50: percentile(s, 0.5),
    p90: percentile(s, 0.9),
    p99: percentile(s, 0.99),
    p999: percentile(s, 0.999),
    mean: s.length ? sum / s.length : Number.NaN,
    min: s.length ? s[0] : Number.NaN,
    max: s.length ? s[s.length - 1] : Number.NaN,
  }
}

/** p50/p90/p99/p99.9/mean, 1 decimal, of several runs' samples pooled (tails need the numbers); null for none. */
export function pooledSummary(runs: ReadonlyArray<number[] | undefined>) {
  const all = runs.flatMap((s) => s ?? [])
  if (all.length === 0) return null
  const r = summarize(all)
  return { n: r.n, p50: round(r.p50, 1), p90: round(r.p90, 1), p99: round(r.p99, 1), p999: round(r.p999, 1), mean: round(r.mean, 1) }
}

/** Rounds to `digits` significant decimals for printing; null for non-finite values. */
export function round(x: number, digits = 3): number | null {
  if (!Number.isFinite(x)) return null
  const f = 10 ** digits
  return Math.round(x * f) / f
}

/** engine / baseline, or null when either side is missing. */
export function ratio(value: number | null, baseline: number | null): number | null {
  if (value === null || baseline === null || !Number.isFinite(value) || !Number.isFinite(baseline) || baseline === 0) {
    return null
  }
  return round(value / baseline, 3)
}

/** Monotonic time in nanoseconds as a number (exact well past a day). */
export function nowNs(): number {
  return Number(process.hrtime.bigint())
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4))

/**
 * Blocks this thread for about `us` microseconds without spinning (Atomics.wait; allowed on
 * Node's main thread). Used to back off while polling native status, leaving the CPU to the
 * engine's I/O threads.
 */
export function blockFor(us: number): void {
  Atomics.wait(sleepCell, 0, 0, us / 1000)
}

/**
 * Median of the finite values among `values` (nulls and NaN skipped; the mean of the two
 * middle values for an even count); NaN when none is finite.
 */
export function median(values: ReadonlyArray<number | null | undefined>): number {
  const s = values.filter((v): v is number => typeof v === 'number' && Number.isFinite(v)).sort((a, b) => a - b)
  if (s.length === 0) return Number.NaN
  const mid = s.length >> 1
  return s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2
}
