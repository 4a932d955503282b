/**
 * --inject: a fault the initiator lands on the target that --local started, to measure how
 * soon the run sees it (the time to the first FAILED and to the last request's end).
 */
import { UsageError } from '../options'

export interface Injection {
  signal: 'SIGKILL' | 'SIGSTOP'
  /** ms into the first measured case. */
  afterMs: number
}

/** The local target of --local, as the initiator needs it for --inject. */
export interface FaultTarget {
  pid: number
  signal(sig: Injection['signal']): void
}

/** `kill|stop[:AFTER_MS]` → the injection; '' → none. Throws UsageError on bad usage. */
export function parseInjection(text: string, durationS: number): Injection | undefined {
  if (text === '') return undefined
  const m = /^(kill|stop)(?::(\d+))?$/.exec(text.trim())
  if (!m) throw new UsageError(`--inject: expected kill or stop, optionally :AFTER_MS, got "${text}"`)
  const afterMs = m[2] === undefined ? 500 : Number(m[2])
  if (afterMs >= durationS * 1000) {
    throw new UsageError(`--inject: ${afterMs} ms is past the measured case (--duration=${durationS})`)
  }
  return { signal: m[1] === 'kill' ? 'SIGKILL' : 'SIGSTOP', afterMs }
}
