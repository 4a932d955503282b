/** Remote segments: a peer's memory as this engine opened it. */
import { failureError } from './errors'
import type * as Native from './native'
// A type only (the segment's owner); engine.ts imports this module, not the reverse.
import type { Engine } from './engine'

/** A buffer a remote segment exposes. */
export interface RemoteBuffer extends Native.RemoteBuffer {}

/**
 * An opened remote segment. It follows its name across the peer's restarts: `engineId`
 * and `buffers` read what this engine knows of the peer now, which the engine keeps up to
 * date as it learns (a restart, a request naming a buffer not listed yet); `refresh()`
 * asks the peer itself.
 */
export class Segment {
  /** What was last read from the engine: still readable once the segment is closed. */
  #known: Native.SegmentDesc

  /** @internal */
  constructor(
    /** @internal */
    readonly engine: Engine,
    /** Handle used in requests (names its engine). */
    readonly handle: number,
    /** Segment name (`host:port`, or its name in etcd). */
    readonly name: string,
    known: Native.SegmentDesc,
  ) {
    this.#known = known
  }

  /** The peer engine's id: the incarnation this engine knows now (a restart changes it). */
  get engineId(): string {
    return this.#current().engineId
  }

  /**
   * Buffers the peer exposes, as this engine knows them now: after the peer restarted,
   * those of its new incarnation. A buffer the peer allocated since is listed once the
   * engine learned of it — a request naming it, or `refresh()`.
   */
  get buffers(): RemoteBuffer[] {
    return this.#current().buffers.map(toRemoteBuffer)
  }

  /**
   * Fetches the peer's descriptor now: a new incarnation ends the old one (its in-flight
   * requests fail, `peerLost` with reason `'restarted'`), and the buffers allocated since
   * become known. Resolves with this segment; rejects (`ERR_FERRY_CONNECT`, …) when the
   * peer does not answer, or the segment is closed.
   */
  async refresh(): Promise<this> {
    const r = await this.engine.native((n) => n.refreshSegment(this.handle))
    if (!r.segment) throw failureError(r.error, ['ERR_FERRY_CONNECT', 'refresh failed'])
    this.#known = r.segment
    return this
  }

  /** Closes the segment (as `engine.closeSegment(this)`); its in-flight work fails. */
  close(): void {
    this.engine.closeSegment(this)
  }

  /** The engine's view now; the last one read once the segment or the engine closed. */
  #current(): Native.SegmentDesc {
    try {
      this.#known = this.engine.native((n) => n.segmentInfo(this.handle))
    } catch {
      // Closed: what was known last stays readable.
    }
    return this.#known
  }
}

function toRemoteBuffer(b: Native.RemoteBuffer): RemoteBuffer {
  return { id: b.id, length: b.length, access: b.access, transports: b.transports }
}

/** A segment of `engine` from the binding's answer to `openSegment`. */
export function toSegment(engine: Engine, s: Native.SegmentDesc): Segment {
  return new Segment(engine, s.handle, s.name, s)
}
