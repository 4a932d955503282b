/**
 * Server half of the pure-Node TCP latency baseline (see node_tcp_lat.ts).
 *
 * Holds a pre-touched buffer of FERRY_BENCH_LAT_BYTES (default 64 MiB). Each request is
 * 8 bytes, `offset: u32 LE, length: u32 LE`; the answer is exactly `length` bytes of the
 * buffer from `offset`. Nagle is off. Prints `{port, pid}` once listening on 127.0.0.1 and
 * exits when stdin closes.
 */
import * as net from 'node:net'

const REQUEST_BYTES = 8
const size = Number(process.env.FERRY_BENCH_LAT_BYTES ?? 64 << 20)
const data = Buffer.alloc(size, 0x5a)

const server = net.createServer((sock) => {
  sock.setNoDelay(true)
  let pending: Buffer = Buffer.alloc(0)
  sock.on('data', (chunk: Buffer) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
    let at = 0
    while (pending.length - at >= REQUEST_BYTES) {
      const offset = pending.readUInt32LE(at)
      const length = pending.readUInt32LE(at + 4)
      at += REQUEST_BYTES
      if (offset + length > size) {
        sock.destroy(new Error(`request out of range: ${offset}+${length}`))
        return
      }
      sock.write(data.subarray(offset, offset + length))
    }
    pending = pending.subarray(at)
  })
  sock.on('error', () => sock.destroy())
})

server.listen(0, '127.0.0.1', () => {
  const addr = server.address() as net.AddressInfo
  process.stdout.write(JSON.stringify({ port: addr.port, pid: process.pid }) + '\n')
})

process.stdin.resume()
process.stdin.on('end', () => process.exit(0))
process.stdin.on('close', () => process.exit(0))
