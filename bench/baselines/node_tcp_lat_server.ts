/**
 * Server half of the pure-Node TCP latency baseline (see node_tcp_lat.ts).
 *
 * Holds a pre-touched buffer of FERRY_BENCH_LAT_BYTES (default 64 MiB). Each request is
 * 8 bytes, `offset: u32 LE, length: u32 LE`; the answer is exactly `length` bytes of the
 * buffer from `offset`. Nagle is off. Prints `{port, pid}` once listening on 127.0.0.1 and
 * exits when stdin closes.
 */
import { serveFrames } from '../lib/loopback'

const REQUEST_BYTES = 8
const size = Number(process.env.FERRY_BENCH_LAT_BYTES ?? 64 << 20)
const data = Buffer.alloc(size, 0x5a)

serveFrames((sock, pending) => {
  let at = 0
  while (pending.length - at >= REQUEST_BYTES) {
    const offset = pending.readUInt32LE(at)
    const length = pending.readUInt32LE(at + 4)
    at += REQUEST_BYTES
    if (offset + length > size) {
      sock.destroy(new Error(`request out of range: ${offset}+${length}`))
      return undefined
    }
    sock.write(data.subarray(offset, offset + length))
  }
  return at
})
