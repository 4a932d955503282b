/** Waits that an AbortSignal ends: a call's outcome, or its `AbortError` as soon as the signal fires. */
import { abortError } from './errors'

/** What an abort does besides rejecting the call. */
export interface OnAbort<T> {
  /** Ends the work itself (the binding drops the call's future). */
  stop?: () => void
  /** Undoes what the work brings after the abort (an engine that started all the same is closed). */
  late?: (value: T) => void
}

/**
 * `work`'s outcome, or the `AbortError` of `signal` (its `cause`: the signal's reason) as
 * soon as the signal fires, if it fires first; then `on.stop` ends the work, and what it
 * brings all the same goes to `on.late` (a failure after the abort, nowhere).
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined, on: OnAbort<T> = {}): Promise<T> {
  if (!signal) return work
  const dropped = () => {
    on.stop?.()
    void work.then(on.late, () => {})
  }
  if (signal.aborted) {
    dropped()
    return Promise.reject(abortError(signal.reason))
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      reject(abortError(signal.reason))
      dropped()
    }
    signal.addEventListener('abort', onAbort, { once: true })
    work.then(
      (value) => {
        signal.removeEventListener('abort', onAbort)
        resolve(value)
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort)
        reject(err)
      },
    )
  })
}
