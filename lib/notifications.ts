/**
 * Notifications: the payload a call carries, and the arriving side — the engine's bounded
 * queue drained to `notification` listeners and `notifications()` iterators, each iterator
 * bounded too.
 */
import type { EventEmitter } from 'node:events'
import type * as Native from './native'
import { checkOptions, checkSignal, describe, invalid } from './checks'
import { abortError } from './errors'
import type { Emit, Notification } from './events'

/** A notification's payload: bytes, or a string (sent as UTF-8). At most `notifyMaxBytes` (4 KiB by default). */
export type NotifyData = string | ArrayBufferView

/** Options of `transfer` and `submitTransfer`. */
export interface NotifyOptions {
  /** Sent to the target once every byte of the call is in its memory; never for a call that did not complete. */
  notify?: NotifyData
}

/** A notification payload as bytes; a string is UTF-8. */
export function notifyBytes(what: string, v: unknown): Buffer {
  if (typeof v === 'string') return Buffer.from(v, 'utf8')
  if (ArrayBuffer.isView(v)) return Buffer.from(v.buffer, v.byteOffset, v.byteLength)
  throw invalid(`${what} must be a string, Buffer or TypedArray, got ${describe(v)}`)
}

/** The most notifications one turn of the event loop hands to listeners and iterators. */
export const DRAIN_TURN_NOTES = 256
/** A turn stops handing out notifications once it has taken this long (ms). */
export const DRAIN_TURN_MS = 10
/**
 * Notifications taken from the engine at a time: what is taken is handed out, so this is
 * how far past `DRAIN_TURN_MS` a turn with slow listeners may run.
 */
export const DRAIN_BATCH = 16

/** The notifications that arrive at one engine, taken from its queue for listeners and iterators. */
export class NotificationRelay {
  /** Open `notifications()` iterators. */
  readonly #inboxes = new Set<NotificationQueue>()
  /** A drain waits for the next turn of the event loop. */
  #scheduled = false

  constructor(
    private readonly native: Native.NativeEngine,
    private readonly queueSize: number,
    private readonly emitter: EventEmitter,
    private readonly emit: Emit,
  ) {}

  /** A listener is being added (`newListener`). */
  listenerAdded(name: string | symbol): void {
    // Notifications that waited for a listener go to it once it is in place.
    if (name === 'notification') process.nextTick(() => this.drain())
  }

  /** The binding's signal: notifications are ready, or some were dropped. */
  signal(s: Native.NotifySignalJs): void {
    if (s.kind === 'ready') this.drain()
    else if (s.kind === 'dropped') {
      this.emit('notificationsDropped', { kind: 'notificationsDropped', from: s.from ?? '', total: s.total ?? 0 })
    }
  }

  /** A new `notifications()` iterator (see `Engine.notifications`). */
  iterator(options: unknown): AsyncIterableIterator<Notification> {
    const o = checkOptions('notifications', options, ['signal'])
    const signal = checkSignal(o.signal)
    const queue = new NotificationQueue(this.queueSize, () => this.drain())
    if (signal?.aborted) queue.abort(signal.reason)
    else {
      const onAbort = () => queue.abort(signal?.reason)
      signal?.addEventListener('abort', onAbort, { once: true })
      queue.onEnd = () => {
        signal?.removeEventListener('abort', onAbort)
        this.#inboxes.delete(queue)
      }
      this.#inboxes.add(queue)
      process.nextTick(() => this.drain())
    }
    return queue
  }

  /**
   * Takes waiting notifications to listeners and iterators, while someone listens and every
   * iterator has room; otherwise they stay in the engine's bounded queue.
   *
   * One call hands out at most `DRAIN_TURN_NOTES`, and stops once it has run
   * `DRAIN_TURN_MS`; if more may wait it comes back on the next turn of the event loop
   * (`setImmediate`), after I/O and timers had theirs. Draining until the queue is empty
   * instead never returned while notifications arrived faster than listeners took them,
   * and the process then answered nothing else. The engine signals only when its queue
   * goes from empty to not, so a turn that stops early must come back itself.
   */
  drain(): void {
    if (this.native.closed) return
    const started = performance.now()
    let left = DRAIN_TURN_NOTES
    for (;;) {
      if (this.emitter.listenerCount('notification') === 0 && this.#inboxes.size === 0) return
      // This turn's share is used up: the rest on the next turn.
      if (left <= 0 || performance.now() - started >= DRAIN_TURN_MS) break
      let room = Math.min(DRAIN_BATCH, left)
      for (const q of this.#inboxes) room = Math.min(room, q.room())
      // An iterator is full: its `next` pulls again once it has room.
      if (room <= 0) return
      const batch = this.native.takeNotifications(room)
      if (batch.length === 0) return
      left -= batch.length
      for (const raw of batch) {
        const n: Notification = { from: raw.from, engineId: raw.engineId, data: raw.data, bytes: raw.bytes }
        this.emit('notification', n)
        for (const q of this.#inboxes) q.push(n)
      }
    }
    if (this.#scheduled) return
    this.#scheduled = true
    setImmediate(() => {
      this.#scheduled = false
      this.drain()
    })
  }

  /** Ends every iterator (the engine closed). */
  end(): void {
    for (const q of this.#inboxes) q.end()
  }
}

/** One `notifications()` iterator: what was taken for it and not yet consumed (bounded). */
class NotificationQueue implements AsyncIterableIterator<Notification> {
  readonly #items: Notification[] = []
  readonly #waiting: Array<{ resolve: (r: IteratorResult<Notification>) => void; reject: (e: unknown) => void }> = []
  #done = false
  #error: unknown
  onEnd?: () => void

  constructor(
    private readonly capacity: number,
    private readonly pull: () => void,
  ) {}

  /** How many more it may hold. */
  room(): number {
    return this.capacity - this.#items.length
  }

  push(n: Notification): void {
    const w = this.#waiting.shift()
    if (w) w.resolve({ value: n, done: false })
    else this.#items.push(n)
  }

  end(): void {
    this.#finish(undefined)
  }

  abort(reason: unknown): void {
    this.#finish(abortError(reason))
  }

  #finish(error: unknown): void {
    if (this.#done) return
    this.#done = true
    this.#error = error
    this.onEnd?.()
    for (const w of this.#waiting.splice(0)) {
      if (error === undefined) w.resolve({ value: undefined, done: true })
      else w.reject(error)
    }
  }

  next(): Promise<IteratorResult<Notification>> {
    const n = this.#items.shift()
    if (n) {
      // Room again: what waits in the engine may come now.
      if (this.#items.length === this.capacity - 1) this.pull()
      return Promise.resolve({ value: n, done: false })
    }
    if (this.#done) {
      const error = this.#error
      this.#error = undefined
      return error === undefined ? Promise.resolve({ value: undefined, done: true }) : Promise.reject(error)
    }
    return new Promise((resolve, reject) => this.#waiting.push({ resolve, reject }))
  }

  return(): Promise<IteratorResult<Notification>> {
    this.end()
    return Promise.resolve({ value: undefined, done: true })
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Notification> {
    return this
  }
}
