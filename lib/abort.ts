/** Waits that an AbortSignal ends: a call's outcome, or its `AbortError` as soon as the signal fires. */
import { abortError } from './errors'

/**
 * `work`'s outcome, or the `AbortError` of `signal` (its `cause`: the signal's reason) as
 * soon as the signal fires, if it fires first. What `work` brings after that goes to
 * `late` (to undo it: an engine that started all the same is closed); a failure after it,
 * nowhere.
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined, late?: (value: T) => void): Promise<T> {
  if (!signal) return work
  const dropped = () => void work.then(late, () => {})
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
