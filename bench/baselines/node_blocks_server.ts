/**
 * Server half of the pure-Node block-stream baseline (see node_blocks.ts).
 *
 * Holds a pre-touched buffer of FERRY_BENCH_BLOCKS_BYTES (default 64 MiB). Each frame is a
 * 12-byte header `op: u32 LE (0 read, 1 write), offset: u32 LE, length: u32 LE`; a write's
 * `length` payload bytes follow and are copied into the buffer at `offset`, answered by one
 * byte; a read is answered by exactly `length` bytes of the buffer from `offset`. Nagle is
 * off. Prints `{port, pid}` once listening on 127.0.0.1 and exits when stdin closes.
 */
import { serveFrames } from '../lib/loopback'

const HEADER = 12
const size = Number(process.env.FERRY_BENCH_BLOCKS_BYTES ?? 64 << 20)
const data = Buffer.alloc(size, 0x5a)
const ACK = Buffer.from([1])

serveFrames((sock, pending) => {
  let at = 0
  sock.cork()
  while (pending.length - at >= HEADER) {
    const op = pending.readUInt32LE(at)
    const offset = pending.readUInt32LE(at + 4)
    const length = pending.readUInt32LE(at + 8)
    if (offset + length > size) {
      sock.destroy(new Error(`block out of range: ${offset}+${length}`))
      return undefined
    }
    if (op === 1) {
      if (pending.length - at < HEADER + length) break
      pending.copy(data, offset, at + HEADER, at + HEADER + length)
      at += HEADER + length
      sock.write(ACK)
    } else {
      at += HEADER
      sock.write(data.subarray(offset, offset + length))
    }
  }
  sock.uncork()
  return at
})
