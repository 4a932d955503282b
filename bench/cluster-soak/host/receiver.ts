/**
 * A host's notification listener: each notification is judged against the slot of this
 * host's target region that it names (block.ts's `judge`) the moment it arrives, and
 * counted; the first misdeliveries of an incarnation are reported one by one.
 */
import type { Notification, Region } from '../../../index'
import { decodePayload, judge } from '../block'
import { hostName, type Counters, type Emit, type HostSettings } from '../protocol'

/** Misdeliveries reported one by one per incarnation; the rest are only counted. */
const REPORTED = 50

export function receiver(
  target: Region,
  settings: HostSettings,
  counters: Counters,
  emit: Emit,
): (n: Notification) => void {
  const { slots, blockMax, hosts } = settings
  const misdelivered = (n: Notification, why: string) => {
    counters.misdelivered++
    counters.misdeliveredBy[why] = (counters.misdeliveredBy[why] ?? 0) + 1
    if (counters.misdelivered <= REPORTED) emit({ ev: 'misdelivered', from: n.from, why, payload: n.data.toString('utf8').slice(0, 200) })
  }
  return (n) => {
    counters.notifications++
    const p = decodePayload(n.data)
    if (!p || p.writer >= hosts || p.slot >= slots) return misdelivered(n, 'bad-payload')
    if (n.from !== hostName(p.writer)) return misdelivered(n, 'wrong-sender')
    const at = (p.writer * slots + p.slot) * blockMax
    const v = judge(p, target.buffer.subarray(at, at + blockMax))
    if (v.kind === 'verified') {
      counters.notifyVerified++
      counters.notifyVerifiedBytes += p.length
    } else if (v.kind === 'superseded') counters.notifySuperseded++
    else misdelivered(n, v.why)
  }
}
