/**
 * One host's view of one peer, as its transfers see it: up until a transfer fails, then down
 * until a transfer started after that succeeds. Pure (times passed in). It decides which
 * failures are reported one by one — the first one after the peer looked up, and those of
 * the transfers that were in flight then (time-to-FAILED) — and when the peer is back: the
 * first success after a loss, or after the driver said the peer was killed
 * (restart-to-first-success). Failures while it is known down are only counted.
 */

export interface Up {
  /** When the peer was seen down (the first failure's end), or killed. */
  downAt: number
  /** The first successful transfer started after that. */
  tStart: number
  tEnd: number
  /** Failures between. */
  failures: number
}

export class PeerLink {
  #up = true
  #downAt = 0
  #failures = 0
  /** A kill the driver reported that no success has followed yet. */
  #killedAt: number | null = null
  #lastSuccessStart = -Infinity

  get up(): boolean {
    return this.#up
  }

  /** A transfer started at `tStart` failed at `tEnd`: whether to report it on its own. */
  failed(tStart: number, tEnd: number): boolean {
    if (this.#up) {
      this.#up = false
      this.#downAt = tEnd
      this.#failures = 1
      return true
    }
    this.#failures++
    return tStart < this.#downAt
  }

  /** A transfer started at `tStart` succeeded at `tEnd`: the recovery, if this is it. */
  succeeded(tStart: number, tEnd: number): Up | null {
    this.#lastSuccessStart = Math.max(this.#lastSuccessStart, tStart)
    if (!this.#up) {
      if (tStart < this.#downAt) return null
      this.#up = true
      if (this.#killedAt !== null && tStart >= this.#killedAt) this.#killedAt = null
      return { downAt: this.#downAt, tStart, tEnd, failures: this.#failures }
    }
    if (this.#killedAt === null || tStart < this.#killedAt) return null
    // Back before any transfer saw it gone.
    const downAt = this.#killedAt
    this.#killedAt = null
    return { downAt, tStart, tEnd, failures: 0 }
  }

  /**
   * The driver says the peer was killed at `tKill`, so a recovery is reported even if no
   * transfer fails in between — unless one started after the kill already succeeded.
   */
  killed(tKill: number): void {
    if (this.#lastSuccessStart >= tKill) return
    this.#killedAt = tKill
  }
}
