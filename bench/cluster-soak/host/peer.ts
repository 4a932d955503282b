/**
 * A host's traffic to one peer: `lanes` loops, each writing a random block with a
 * notification into its own slots of the peer's target region, reading it back and comparing
 * it; the peer's segment opened (and, with `reopen: 'on-stale'`, reopened when the handle no
 * longer names the peer's buffer) once for all lanes. Every call is bounded by `hangMs`.
 *
 * A lane keeps nothing from one write to the next: its areas of the host's regions, its
 * request objects and its deadline (host/deadline.ts) are made once, so a host's heap holds
 * only what its calls in flight need.
 */
import { randomFillSync } from 'node:crypto'
import type { Engine, Region, Segment } from '../../../index'
import { blockHash, encodePayload, HEADER_BYTES, isZero, writeHeader } from '../block'
import { regionBytes } from '../flags'
import { hostName, type Counters, type Emit, type HostSettings } from '../protocol'
import { bounded, codeOf, delay } from '../wait'
import { CallDeadline } from './deadline'
import { PeerLink } from './link'

/** What a host's peers share. */
export interface HostContext {
  engine: Engine
  settings: HostSettings
  /** This incarnation's start time. */
  inc: number
  counters: Counters
  /** Lane areas of `blockMax` bytes each: what is written, and what is read back. */
  writeRegion: Region
  readRegion: Region
  emit: Emit
  running(): boolean
}

/** Codes that say the handle no longer names what the peer has. */
const STALE = new Set(['ERR_FERRY_UNKNOWN_BUFFER', 'ERR_FERRY_UNKNOWN_SEGMENT', 'NO_BUFFER'])
/** Between retries while the peer fails. */
const RETRY_MS = 10

export class PeerTraffic {
  readonly link = new PeerLink()
  #segment: Segment | null = null
  #buffer = 0
  #opened = false
  #opening: Promise<void> | null = null
  #seq = 0

  constructor(
    private readonly ctx: HostContext,
    readonly target: number,
  ) {}

  /** Opens the peer's segment (for all lanes); resolves whether it is usable. */
  async open(): Promise<boolean> {
    if (this.#segment) return true
    this.#opening ??= this.#open().finally(() => (this.#opening = null))
    await this.#opening
    return this.#segment !== null
  }

  async #open(): Promise<void> {
    const { engine, settings, counters } = this.ctx
    const tStart = Date.now()
    try {
      const seg = await bounded(engine.openSegment(hostName(this.target)), settings.hangMs)
      const want = regionBytes(settings)
      const buffer = seg.buffers.find((b) => b.length === want)
      if (!buffer) throw Object.assign(new Error(`no buffer of ${want} bytes`), { code: 'NO_BUFFER' })
      if (this.#opened) counters.reopens++
      this.#segment = seg
      this.#buffer = buffer.id
      this.#opened = true
    } catch (err) {
      this.#failed('open', tStart, err)
    }
  }

  #failed(op: 'write' | 'read' | 'open', tStart: number, err: unknown, seg?: Segment): void {
    const { counters, settings } = this.ctx
    const tEnd = Date.now()
    const code = codeOf(err)
    if (code === 'ABORT_ERR') counters.hung++
    counters.failures[code] = (counters.failures[code] ?? 0) + 1
    if (this.link.failed(tStart, tEnd)) this.ctx.emit({ ev: 'fail', target: this.target, op, code, tStart, tEnd, t: tEnd })
    if (seg && seg === this.#segment && STALE.has(code) && settings.reopen === 'on-stale') this.#segment = null
  }

  /** One lane's loop, until the host stops. */
  async lane(lane: number): Promise<void> {
    const { engine, settings, counters, writeRegion, readRegion } = this.ctx
    const { lanes, slots, blockMin, blockMax, hangMs } = settings
    const perLane = Math.floor(slots / lanes)
    const area = (this.target * lanes + lane) * blockMax
    const written = writeRegion.buffer.subarray(area, area + blockMax)
    const readBack = readRegion.buffer.subarray(area, area + blockMax)
    const deadline = new CallDeadline()
    // One request of each kind, its fields set per call (the engine reads them when called).
    const write = { local: writeRegion, localOffset: area, remote: null as unknown as Segment, remoteBuffer: 0, remoteOffset: 0, length: 0, notify: '', signal: deadline.arm(hangMs) }
    const read = { local: readRegion, localOffset: area, remote: null as unknown as Segment, remoteBuffer: 0, remoteOffset: 0, length: 0, signal: write.signal }
    deadline.disarm()
    for (let k = 0; this.ctx.running(); k++) {
      if (!(await this.open())) {
        await delay(RETRY_MS)
        continue
      }
      const seg = this.#segment!
      const slot = lane + (k % perLane) * lanes
      const length = Math.max(HEADER_BYTES, blockMin + Math.floor(Math.random() * (blockMax - blockMin + 1)))
      const block = written.subarray(0, length)
      randomFillSync(block, HEADER_BYTES)
      writeHeader(block, { writer: settings.index, incarnation: this.ctx.inc, seq: ++this.#seq })
      write.notify = encodePayload({ writer: settings.index, incarnation: this.ctx.inc, seq: this.#seq, slot, length, hash: blockHash(block) })
      write.remote = read.remote = seg
      write.remoteBuffer = read.remoteBuffer = this.#buffer
      write.remoteOffset = read.remoteOffset = (settings.index * slots + slot) * blockMax
      write.length = read.length = length
      const tStart = Date.now()
      let op: 'write' | 'read' = 'write'
      try {
        write.signal = deadline.arm(hangMs)
        await engine.write(write)
        deadline.disarm()
        op = 'read'
        read.signal = deadline.arm(hangMs)
        await engine.read(read)
        deadline.disarm()
      } catch (err) {
        deadline.disarm()
        this.#failed(op, tStart, err, seg)
        await delay(RETRY_MS)
        continue
      }
      const tEnd = Date.now()
      counters.writesOk++
      counters.bytesWritten += length
      if (readBack.compare(written, 0, length, 0, length) === 0) {
        counters.bytesVerified += length
        const up = this.link.succeeded(tStart, tEnd)
        if (up) this.ctx.emit({ ev: 'up', target: this.target, ...up, t: tEnd })
      } else {
        counters.readbackMismatches++
        const zero = isZero(readBack.subarray(0, length))
        if (zero) counters.readbackZero++
        this.ctx.emit({ ev: 'mismatch', target: this.target, tStart, tEnd, zero, t: tEnd })
      }
      if (settings.gapMs > 0) await delay(settings.gapMs)
    }
  }
}
