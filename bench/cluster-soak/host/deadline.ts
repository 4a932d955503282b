/**
 * A lane's bound on each call (`hangMs`): one AbortSignal kept across calls until it fires,
 * and one timer per call, cleared when the call ends.
 *
 * `AbortSignal.timeout(ms)` would do the same, but its timer and signal live for the whole
 * `ms` whatever the call does: at hundreds of calls a second and a 30 s bound, a host would
 * carry tens of thousands of them, tens of MB of its heap that V8 promotes and then grows
 * its reserved heap for. The soak judges a host's memory, so its own must stay bounded.
 */
export class CallDeadline {
  #controller = new AbortController()
  #timer: NodeJS.Timeout | undefined

  /** The signal for one call, aborted with ABORT_ERR after `ms` unless `disarm` comes first. */
  arm(ms: number): AbortSignal {
    clearTimeout(this.#timer)
    // A fired signal stays aborted: the next call gets a fresh one.
    if (this.#controller.signal.aborted) this.#controller = new AbortController()
    const controller = this.#controller
    this.#timer = setTimeout(() => controller.abort(Object.assign(new Error(`no answer in ${ms} ms`), { code: 'ABORT_ERR', name: 'AbortError' })), ms)
    return controller.signal
  }

  /** The call ended. */
  disarm(): void {
    clearTimeout(this.#timer)
    this.#timer = undefined
  }
}
