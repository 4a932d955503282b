/**
 * The JS side of notification delivery (lib/notifications.ts), against a stand-in for the
 * binding: how much one turn of the event loop hands to listeners, and that the rest
 * follows on later turns, so a listener slower than the arrivals never starves the process.
 */
import test from 'ava'
import { EventEmitter } from 'node:events'
import { DRAIN_BATCH, DRAIN_TURN_MS, DRAIN_TURN_NOTES, NotificationRelay } from '../lib/notifications'
import type { Emit } from '../lib/events'
import type * as Native from '../lib/native'

/** A binding whose queue holds `count` notifications (a flood already arrived). */
function flood(count: number) {
  let left = count
  let takes = 0
  const native = {
    closed: false,
    takeNotifications(max: number) {
      takes++
      const n = Math.min(max, left)
      left -= n
      return Array.from({ length: n }, (_, i) => ({ from: 'sender', engineId: '1', data: Buffer.from(String(count - left - n + i)), bytes: 0 }))
    },
  }
  return { native: native as unknown as Native.NativeEngine, left: () => left, takes: () => takes }
}

function relayOver(native: Native.NativeEngine) {
  const emitter = new EventEmitter()
  const emit: Emit = (name, payload) => emitter.emit(name, payload)
  return { emitter, relay: new NotificationRelay(native, 1024, emitter, emit) }
}

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))

test('one turn hands out a bounded share of a flood; the rest follows turn by turn, in order, with I/O turns between', async (t) => {
  t.timeout(20_000)
  const total = 10_000
  const q = flood(total)
  const { emitter, relay } = relayOver(q.native)
  const seen: number[] = []
  emitter.on('notification', (n: { data: Buffer }) => seen.push(Number(n.data.toString())))
  relay.drain()
  t.true(seen.length > 0 && seen.length <= DRAIN_TURN_NOTES, `first turn delivered ${seen.length}`)
  let turns = 0
  while (seen.length < total && turns < 10 * total) {
    await nextTurn()
    turns++
  }
  t.is(seen.length, total)
  t.deepEqual(seen.slice(0, 5), [0, 1, 2, 3, 4])
  t.true(seen.every((v, i) => v === i), 'oldest first, none lost or repeated')
  t.true(turns >= Math.floor(total / DRAIN_TURN_NOTES) - 1, `${turns} turns`)
  // Drained: a turn that finds the queue empty schedules nothing more.
  const takes = q.takes()
  for (let i = 0; i < 5; i++) await nextTurn()
  t.true(q.takes() <= takes + 1)
})

test('a listener slower than the arrivals: a turn stops once it has run its time, and a timer still fires meanwhile', async (t) => {
  t.timeout(20_000)
  const q = flood(400)
  const { emitter, relay } = relayOver(q.native)
  const busy = 5 // ms per notification: 2 s for all of them
  let seen = 0
  emitter.on('notification', () => {
    const until = performance.now() + busy
    while (performance.now() < until) {
      // a listener that hashes a megabyte per notification, say
    }
    seen++
  })
  relay.drain()
  // Draining to the end took every one of them (2 s) before anything else could run. The
  // first batch alone outlasts the turn's time, whatever the load (the listener's wait is
  // by the clock), so the turn ends after it.
  t.true(busy * DRAIN_BATCH > DRAIN_TURN_MS)
  t.is(seen, DRAIN_BATCH, `first turn delivered ${seen} of 400`)
  let fired = false
  setTimeout(() => (fired = true), 1)
  const deadline = Date.now() + 15_000
  while (!fired && Date.now() < deadline) await new Promise<void>((resolve) => setTimeout(resolve, 1))
  t.true(fired, 'a timer fired while notifications were still waiting')
  t.true(q.left() > 0 || seen === 400)
})

test('with nobody listening nothing is taken; an iterator without room takes nothing until it has some', async (t) => {
  const q = flood(100)
  const { relay } = relayOver(q.native)
  relay.drain()
  t.is(q.takes(), 0)
  t.is(q.left(), 100)
  const it = relay.iterator({})
  await nextTurn()
  t.true(q.left() < 100, 'an iterator takes what waits')
  const first = await it.next()
  t.false(first.done)
  await it.return?.()
})
