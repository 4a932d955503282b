/**
 * The shm sweep's dip judgment (scripts/shm-sweep-ab.mjs): a size is a dip where the engine
 * falls more than the tolerance below the next smaller size AND more than that below what
 * memcpy of the same sizes, on as many threads, did in the same run. The rule ("no
 * size more than 10 % slower than the next smaller one, until memory bandwidth bounds it")
 * is then measured rather than asserted: where the caches or the memory make memcpy itself
 * fall from one size to the next, the engine may fall as much, and no more; and wherever it
 * still copies as fast as memcpy on every core at that size (the memory's limit), it may
 * fall at all. The second matters where the engine spreads one thread's copy over idle
 * cores: their caches hold twice the block, so its cliff comes a size after one-thread
 * memcpy's.
 */

/** One size of a sweep: the engine's and memcpy's rate there (any unit, the same for all). */
export interface SweepPoint {
  size: number
  engine: number
  /** memcpy of `size`-byte blocks on as many threads; null where it was not measured. */
  memcpy: number | null
  /** memcpy of `size`-byte blocks on every core: the memory's limit; absent where not measured. */
  memoryLimit?: number | null
}

/** How the step from the next smaller size was judged. */
export interface SweepStep {
  size: number
  /** engine here / engine at the next smaller size; null for the first size. */
  engineStep: number | null
  /** memcpy here / memcpy at the next smaller size; null where either is not measured. */
  memcpyStep: number | null
  /**
   * The engine fell more than the tolerance from the next smaller size, and more than
   * that below memcpy's step (a step of memcpy above 1 counts as 1: the engine need not
   * rise as memcpy does, only not fall). Without memcpy's step, the plain rule. Never
   * where the engine is at the memory's limit there (within `LIMIT_TOLERANCE` of it).
   */
  dip: boolean
}

/** The fall from one size to the next that counts as a dip: 10 %. */
export const DIP_TOLERANCE = 0.1

/**
 * How far below memcpy on every core the engine may copy and still count as at the
 * memory's limit: 5 %. Two measurements of one limit in one run differ by their noise (on
 * a 2-core VM whose memory gives both cores 29 GB/s, the engine's one-thread 4 MiB WRITE
 * measured 28.6); a fall to 95 % of it is the memory's, not the engine's.
 */
export const LIMIT_TOLERANCE = 0.05

/** Judges each step of `points` (ascending sizes, as the sweep runs them). */
export function sweepSteps(points: readonly SweepPoint[], tolerance = DIP_TOLERANCE): SweepStep[] {
  const valid = (x: number | null | undefined): x is number => typeof x === 'number' && Number.isFinite(x) && x > 0
  return points.map((p, i) => {
    const prev = i > 0 ? points[i - 1] : undefined
    const engineStep = prev && valid(prev.engine) && valid(p.engine) ? p.engine / prev.engine : null
    const memcpyStep = prev && valid(prev.memcpy) && valid(p.memcpy) ? p.memcpy / prev.memcpy : null
    const bound = Math.min(1, memcpyStep ?? 1)
    const atLimit = valid(p.memoryLimit) && valid(p.engine) && p.engine >= (1 - LIMIT_TOLERANCE) * p.memoryLimit
    const dip = !atLimit && engineStep !== null && engineStep < 1 - tolerance && engineStep < (1 - tolerance) * bound
    return { size: p.size, engineStep, memcpyStep, dip }
  })
}
