/**
 * How an outcome of the binding reaches the caller: as it came, Promise or value, with a
 * turn of the event loop at least every `TURN_EVERY_MS`.
 */

/** Waits one turn of the event loop. */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))
/** How long inline outcomes may follow one another without a turn of the loop. */
const TURN_EVERY_MS = 1
let lastTurn = performance.now()

/**
 * An outcome the binding returns as a Promise, or (done inline: same-host copies, no
 * Promise) as the value itself. The value is passed on at once, except that at least every
 * `TURN_EVERY_MS` it first waits for a turn of the loop: a caller's
 * `while (...) await engine.write(...)` loop then still lets timers and I/O run (delayed
 * by at most about that long) instead of spinning on microtasks for good, while most calls
 * skip the round trip through the loop (a few microseconds each).
 */
export async function settled<T>(v: Promise<T> | T): Promise<T> {
  if (v instanceof Promise) {
    const got = await v
    // A Promise the engine settled from another thread resumes from the loop.
    lastTurn = performance.now()
    return got
  }
  if (performance.now() - lastTurn >= TURN_EVERY_MS) {
    await nextTurn()
    lastTurn = performance.now()
  }
  return v
}
