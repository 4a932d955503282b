/**
 * The engine's events: their payloads, and how the binding's events reach listeners — the
 * `transportDisabled` events nobody heard yet kept for the first listener, and `peerLost`
 * emitted once per loss, before any failure it explains.
 */
import type { EventEmitter } from 'node:events'
import type * as Native from './native'
import type { TransportName } from './status'
import { ERROR_CODE_NUMBERS, LOSS_REASON_NAMES, TRANSPORT_NAMES, type LossReasonName } from './tables'

export type { LossReasonName } from './tables'

/** A transport's name from the binding's number (events always name one). */
const transportName = (n: number | null | undefined): TransportName => TRANSPORT_NAMES[n ?? 0] as TransportName

/** A loss reason's name from the binding's number (`'crashed'` for one this layer does not know). */
const lossReason = (n: number | null | undefined): LossReasonName => LOSS_REASON_NAMES[n ?? 0] ?? 'crashed'

/**
 * A peer was declared lost; its in-flight work failed. `reason` says why: `'closed'` (it
 * said goodbye: its engine closed), `'crashed'` (its connection was reset or closed without
 * a goodbye, or its process is gone), `'timeout'` (silent for `peerTimeoutMs`, or its etcd
 * lease expired) or `'restarted'` (a new incarnation answered under its name); `message`
 * says what was seen.
 */
export interface PeerLostEvent {
  /** The event's name. */
  kind: 'peerLost'
  /** The lost peer's segment name. */
  segment: string
  /** Why it was declared lost. */
  reason: LossReasonName
  /** What was seen, in words. */
  message: string
}

/** A lost peer answers again; new transfers to it may succeed. */
export interface PeerRecoveredEvent {
  /** The event's name. */
  kind: 'peerRecovered'
  /** The peer's segment name. */
  segment: string
}

/** A task's attempt failed and it moved to another attempt. */
export interface FailoverEvent {
  /** The event's name. */
  kind: 'failover'
  /** The peer's segment name. */
  segment: string
  /** The transport whose attempt failed. */
  from: TransportName
  /** The transport of the next attempt. */
  to: TransportName
  /** Switches this task has made, this one included. */
  attempt: number
  /** Why the attempt failed. */
  reason: string
}

/**
 * A transport was taken out of use: towards one peer by the rail monitor (`segment` and
 * `untilMs` set: the pause ends at that time, ms since the epoch), or on this engine at
 * start because it failed to install (no `segment`).
 */
export interface TransportDisabledEvent {
  /** The event's name. */
  kind: 'transportDisabled'
  /** The transport taken out of use. */
  transport: TransportName
  /** The peer it was paused towards; absent when it failed to install at start. */
  segment?: string
  /** Why, in words. */
  reason: string
  /** When the pause ends (ms since the epoch); absent when it failed to install. */
  untilMs?: number
}

/** A notification that arrived: its data landed here before it was sent. */
export interface Notification {
  /** The sender's segment name (as it named itself on its authenticated connection). */
  from: string
  /** The sender's engine id. */
  engineId: string
  /** The payload. */
  data: Buffer
  /** Bytes of the transfer it rode on (0 for `engine.notify`). */
  bytes: number
}

/** The receive queue (`notifyQueueSize`) was full: notifications were dropped and counted. Once per run of drops. */
export interface NotificationsDroppedEvent {
  /** The event's name. */
  kind: 'notificationsDropped'
  /** The sender of the first dropped notification of this run. */
  from: string
  /** Notifications this engine dropped so far (`ferry_notifications_dropped_total`). */
  total: number
}

/** Event name → payload. */
export interface EngineEvents {
  /** A peer was declared lost; emitted before the failures it explains. */
  peerLost: PeerLostEvent
  /** A lost peer, or a new incarnation of it, answers again. */
  peerRecovered: PeerRecoveredEvent
  /** A task moved to another attempt. */
  failover: FailoverEvent
  /** A transport was paused towards a peer, or failed to install at start. */
  transportDisabled: TransportDisabledEvent
  /** A notification arrived. */
  notification: Notification
  /** The receive queue was full: notifications were dropped. */
  notificationsDropped: NotificationsDroppedEvent
}

/** Any engine event about peers and transports (the notification events are typed apart). */
export type EngineEvent = Exclude<EngineEvents[keyof EngineEvents], Notification | NotificationsDroppedEvent>

/** Emits an event on the engine (its EventEmitter's own `emit`). */
export type Emit = (name: keyof EngineEvents, payload: EngineEvents[keyof EngineEvents]) => boolean

function toEvent(e: Native.EngineEventJs): EngineEvent | undefined {
  const segment = e.segment ?? undefined
  switch (e.kind) {
    case 'peerLost':
      return { kind: 'peerLost', segment: segment ?? '', reason: lossReason(e.lossReason), message: e.reason ?? '' }
    case 'peerRecovered':
      return { kind: 'peerRecovered', segment: segment ?? '' }
    case 'failover':
      return {
        kind: 'failover',
        segment: segment ?? '',
        from: transportName(e.from),
        to: transportName(e.to),
        attempt: e.attempt ?? 0,
        reason: e.reason ?? '',
      }
    case 'transportDisabled':
      return {
        kind: 'transportDisabled',
        transport: transportName(e.transport),
        segment,
        reason: e.reason ?? '',
        untilMs: e.untilMs ?? undefined,
      }
    default:
      return undefined
  }
}

/** The binding's peer and transport events, relayed to the engine's listeners. */
export class EventRelay {
  #unheard: TransportDisabledEvent[] = []
  /** Segments whose `peerLost` was emitted and that have not recovered since. */
  readonly #lost = new Set<string>()

  constructor(
    private readonly emitter: EventEmitter,
    private readonly emit: Emit,
  ) {}

  /** A listener is being added (`newListener`): kept `transportDisabled` events go to it. */
  listenerAdded(name: string | symbol): void {
    if (name !== 'transportDisabled' || this.#unheard.length === 0) return
    // After the listener is in place (newListener runs before it is added).
    process.nextTick(() => {
      for (const e of this.#unheard.splice(0)) this.emit('transportDisabled', e)
    })
  }

  /** One event from the binding. */
  deliver(raw: Native.EngineEventJs): void {
    const event = toEvent(raw)
    if (!event) return
    if (event.kind === 'transportDisabled' && this.emitter.listenerCount('transportDisabled') === 0) {
      if (this.#unheard.length < 64) this.#unheard.push(event)
      return
    }
    if (event.kind === 'peerLost') {
      this.#announceLoss(event)
      return
    }
    if (event.kind === 'peerRecovered') this.#lost.delete(event.segment)
    this.emit(event.kind, event)
  }

  /** Emits `peerLost` for its segment unless it was emitted for this loss already. */
  #announceLoss(event: PeerLostEvent): void {
    if (this.#lost.has(event.segment)) return
    this.#lost.add(event.segment)
    this.emit('peerLost', event)
  }

  /**
   * The core emits `peerLost` before it fails the work the loss explains, but the event and
   * a Promise's settlement reach JS through different native queues, in either order. So a
   * status that shows such a failure emits the event first if it has not arrived yet (the
   * native one is then not emitted again). A peer-loss failure names the peer and why in
   * fields of its own (`lostPeer`, `lossReason`, `lossMessage`), never read out of its
   * message. Only a peer-loss failure counts: a closed segment's (`closeSegment`) is none.
   */
  explainLosses(failures: Iterable<Native.FailureJs | null | undefined>): void {
    for (const f of failures) {
      if (f?.code !== ERROR_CODE_NUMBERS.ERR_FERRY_PEER_LOST || f.lostPeer == null) continue
      this.#announceLoss({ kind: 'peerLost', segment: f.lostPeer, reason: lossReason(f.lossReason), message: f.lossMessage ?? '' })
    }
  }
}
