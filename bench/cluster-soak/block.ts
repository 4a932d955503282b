/**
 * What a soak write carries and how its receiver judges a notification. Pure.
 *
 * A block starts with a 32-byte header — magic, writer, the writer's incarnation (its start
 * time in ms, so a later incarnation has a larger one), sequence number, length — followed
 * by random bytes. Its notification payload names the same fields, the slot and a hash of
 * the whole block. The receiver reads the slot when the notification arrives:
 *
 *   verified      the slot holds exactly that block;
 *   superseded    it holds a later block of the same writer (a newer write reused the slot
 *                 before this notification was read): nothing to judge;
 *   misdelivered  anything else — zeros (memory that never received it: a restarted
 *                 instance), an older or foreign block, or the right header over other bytes.
 */
import { createHash } from 'node:crypto'

export const HEADER_BYTES = 32
const MAGIC = 0xfe77a50c

export interface BlockId {
  /** Writer host index. */
  writer: number
  /** The writer's incarnation: its start time, ms since the epoch. */
  incarnation: number
  /** Per (writer incarnation, target) sequence number, from 1. */
  seq: number
}

/** The notification's payload, as sent. */
export interface Payload extends BlockId {
  /** Slot in the writer's stripe at the target. */
  slot: number
  /** Bytes written. */
  length: number
  /** Hash of the block (hex). */
  hash: string
}

export interface Header extends BlockId {
  length: number
}

export type Verdict =
  | { kind: 'verified' }
  | { kind: 'superseded' }
  | { kind: 'misdelivered'; why: 'zeros' | 'older' | 'foreign' | 'corrupt' | 'bad-payload' }

/** Hash of a block as the payload carries it. */
export function blockHash(block: Uint8Array): string {
  return createHash('sha1').update(block).digest('hex').slice(0, 24)
}

/** Writes `id`'s header at the start of `block` (whose length is the block's). */
export function writeHeader(block: Buffer, id: BlockId): void {
  if (block.length < HEADER_BYTES) throw new RangeError(`a block holds at least ${HEADER_BYTES} bytes, got ${block.length}`)
  block.writeUInt32LE(MAGIC, 0)
  block.writeUInt32LE(id.writer, 4)
  block.writeDoubleLE(id.incarnation, 8)
  block.writeUInt32LE(id.seq, 16)
  block.writeUInt32LE(block.length, 20)
  block.fill(0, 24, HEADER_BYTES)
}

/** The header at the start of `bytes`, or null when there is none (no magic). */
export function readHeader(bytes: Buffer): Header | null {
  if (bytes.length < HEADER_BYTES || bytes.readUInt32LE(0) !== MAGIC) return null
  return { writer: bytes.readUInt32LE(4), incarnation: bytes.readDoubleLE(8), seq: bytes.readUInt32LE(16), length: bytes.readUInt32LE(20) }
}

export function encodePayload(p: Payload): string {
  return JSON.stringify({ w: p.writer, i: p.incarnation, s: p.seq, k: p.slot, n: p.length, h: p.hash })
}

/** The payload from a notification's bytes, or null when they are not one. */
export function decodePayload(data: Uint8Array): Payload | null {
  let v: unknown
  try {
    v = JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString('utf8'))
  } catch {
    return null
  }
  if (typeof v !== 'object' || v === null) return null
  const o = v as Record<string, unknown>
  const ints = [o.w, o.s, o.k, o.n]
  if (!ints.every((x) => Number.isSafeInteger(x) && (x as number) >= 0)) return null
  if (typeof o.i !== 'number' || !Number.isFinite(o.i) || typeof o.h !== 'string') return null
  return { writer: o.w as number, incarnation: o.i, seq: o.s as number, slot: o.k as number, length: o.n as number, hash: o.h }
}

/** Whether `a` was written after `b` by the same writer. */
function later(a: BlockId, b: BlockId): boolean {
  return a.incarnation > b.incarnation || (a.incarnation === b.incarnation && a.seq > b.seq)
}

/**
 * Judges a notification against the slot it names. `slot` is the whole slot as the
 * receiver's memory holds it now (at least `p.length` bytes, or the notification is bad).
 */
export function judge(p: Payload, slot: Buffer): Verdict {
  if (p.length < HEADER_BYTES || p.length > slot.length) return { kind: 'misdelivered', why: 'bad-payload' }
  const h = readHeader(slot)
  if (h === null) return { kind: 'misdelivered', why: isZero(slot.subarray(0, HEADER_BYTES)) ? 'zeros' : 'corrupt' }
  if (h.writer !== p.writer) return { kind: 'misdelivered', why: 'foreign' }
  if (later(h, p)) return { kind: 'superseded' }
  if (later(p, h)) return { kind: 'misdelivered', why: 'older' }
  if (h.length !== p.length || blockHash(slot.subarray(0, p.length)) !== p.hash) {
    // A newer write of the slot may have begun while the bytes were hashed (memory is
    // written by the engine's threads): its header lands first.
    const now = readHeader(slot)
    return now !== null && now.writer === p.writer && later(now, p) ? { kind: 'superseded' } : { kind: 'misdelivered', why: 'corrupt' }
  }
  return { kind: 'verified' }
}

export function isZero(bytes: Uint8Array): boolean {
  for (let i = 0; i < bytes.length; i++) if (bytes[i] !== 0) return false
  return true
}
