/**
 * The workers' stripes: how long each thread's stripe is, and --check_consistency's
 * unmeasured copies over them and the check of what was read back.
 */
import type { Engine, Region, Segment } from '../../index'
import type { Config } from './config'

/** A target's buffer, as the workers and the unmeasured copies address it. */
export interface TargetBuffer {
  remote: Segment
  remoteBuffer: number
}

/**
 * Bytes of each thread's stripe. `walk`: the buffer split between the threads. `fixed`:
 * Mooncake's stride, max_block_size × max_batch_size (thread t at t × stride), or the
 * split when that stride does not fit `threads` times; always whole blocks.
 */
export function stripeLength(cfg: Pick<Config, 'addressing' | 'totalBufferSize' | 'maxBlockSize' | 'maxBatchSize'>, threads: number, block: number): number {
  const split = Math.floor(cfg.totalBufferSize / threads / block) * block
  if (cfg.addressing === 'walk') return split
  return Math.min(split, Math.floor((cfg.maxBlockSize * cfg.maxBatchSize) / block) * block)
}

/** What --check_consistency writes: never 0 (untouched bytes read 0), period 255. */
export const PATTERN = Buffer.from(Array.from({ length: 255 }, (_, i) => i + 1))

/**
 * Checks the read-back region against the pattern: every unit of `block` bytes of every
 * stripe is either untouched (all zero: not reached) or equal to the pattern. Called with
 * the sweep's first block size: every block of every case is made of whole such units
 * (block sizes double from it, stripes are whole blocks), so a unit is never half written
 * by cases of different block sizes. Returns an error message, or undefined when consistent.
 */
export function verify(expect: Region, got: Region, threads: number, stripeLen: number, block: number): string | undefined {
  const zero = Buffer.alloc(block)
  // Compared through windows of whole blocks: a region over MAX_VIEW_BYTES (4 GiB on Node 20)
  // has no single Buffer.
  const windowBlocks = Math.max(1, Math.floor((256 << 20) / block))
  let checked = 0
  for (let t = 0; t < threads; t++) {
    const end = (t + 1) * stripeLen
    for (let base = t * stripeLen; base + block <= end; base += windowBlocks * block) {
      const len = Math.min(windowBlocks, Math.floor((end - base) / block)) * block
      const g = got.view(base, len)
      const e = expect.view(base, len)
      for (let off = 0; off + block <= len; off += block) {
        const gb = g.subarray(off, off + block)
        if (gb.equals(zero)) continue
        if (!gb.equals(e.subarray(off, off + block))) {
          let i = 0
          while (gb[i] === e[off + i]) i++
          return `mismatch at offset ${base + off + i}: read ${gb[i]}, wrote ${e[off + i]}`
        }
        checked++
      }
    }
  }
  return checked === 0 ? 'nothing was read back' : undefined
}

/** Bytes one unmeasured copy (priming a target, reading one back) moves per request. */
const COPY_CHUNK = 16 << 20

/**
 * Unmeasured copies for --check_consistency: `op` the first `threads` stripes of `local` to
 * or from the targets, worker i's stripe to or from target i % targets, as the bench moved them.
 */
export async function copyStripes(
  engine: Engine,
  op: 'read' | 'write',
  local: Region,
  targets: TargetBuffer[],
  threads: number,
  stripeLen: number,
): Promise<void> {
  for (let t = 0; t < threads; t++) {
    const { remote, remoteBuffer } = targets[t % targets.length]
    for (let off = t * stripeLen; off < (t + 1) * stripeLen; off += COPY_CHUNK) {
      const length = Math.min(COPY_CHUNK, (t + 1) * stripeLen - off)
      const req = { local, localOffset: off, remote, remoteBuffer, remoteOffset: off, length }
      await (op === 'write' ? engine.write(req) : engine.read(req))
    }
  }
}
