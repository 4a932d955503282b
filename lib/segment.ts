/** Remote segments: a peer's memory as this engine opened it. */
import type * as Native from './native'
// A type only (the segment's owner); engine.ts imports this module, not the reverse.
import type { Engine } from './engine'

/** A buffer a remote segment exposes. */
export interface RemoteBuffer extends Native.RemoteBuffer {}

/** An opened remote segment. */
export class Segment {
  /** @internal */
  constructor(
    /** @internal */
    readonly engine: Engine,
    /** Handle used in requests (names its engine). */
    readonly handle: number,
    /** Segment name (`host:port`, or its name in etcd). */
    readonly name: string,
    /** The peer engine's id. */
    readonly engineId: string,
    /** Buffers the peer exposes (as of the last open). */
    readonly buffers: RemoteBuffer[],
  ) {}

  /** Closes the segment (as `engine.closeSegment(this)`); its in-flight work fails. */
  close(): void {
    this.engine.closeSegment(this)
  }
}

/** A segment of `engine` from the binding's answer to `openSegment`. */
export function toSegment(engine: Engine, s: Native.SegmentDesc): Segment {
  return new Segment(
    engine,
    s.handle,
    s.name,
    s.engineId,
    s.buffers.map((b) => ({
      id: b.id,
      length: b.length,
      access: b.access,
      transports: b.transports,
    })),
  )
}
