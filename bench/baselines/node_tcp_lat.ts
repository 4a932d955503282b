/**
 * Pure-Node TCP latency baseline: what a Node user gets fetching a small block from another
 * process without Ferry. The server (node_tcp_lat_server.ts) runs in a child process; this
 * process sends an 8-byte request `{offset, length}` over loopback TCP (Nagle off) and times
 * until all `length` bytes of the answer are copied into a local buffer. One request in
 * flight at a time: a READ round trip, the shape of Ferry's `engine.read`.
 */
import * as net from 'node:net'
import * as path from 'node:path'
import { jsonLines, startTsx, stopChild, tailStderr } from '../lib/children'
import { nowNs } from '../lib/stats'

export interface LatencyBaselineOptions {
  /** Bytes per answer. */
  messageBytes: number
  /** Timed round trips after the warm-up. */
  ops: number
  /** Warm-up, in seconds. */
  warmupSeconds: number
  /** Hard limit on the timed phase, in seconds (the result may hold fewer than `ops`). */
  maxSeconds: number
}

/** Round-trip times in microseconds. */
export async function nodeTcpLatency(opts: LatencyBaselineOptions): Promise<number[]> {
  const span = 64 << 20
  const server = startTsx('node tcp latency server', path.join(__dirname, 'node_tcp_lat_server.ts'), [], {
    FERRY_BENCH_LAT_BYTES: String(span),
  })
  const stderr = tailStderr(server)
  const lines = jsonLines(server, () => stderr())
  let sock: net.Socket | undefined
  try {
    const hello = await lines.next(20_000)
    const port = Number(hello.port)
    sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => resolve(s))
      s.once('error', reject)
    })
    sock.setNoDelay(true)
    return await pingPong(sock, span, opts)
  } finally {
    sock?.destroy()
    lines.close()
    server.stdin?.end()
    await stopChild(server)
  }
}

function pingPong(sock: net.Socket, span: number, opts: LatencyBaselineOptions): Promise<number[]> {
  const { messageBytes } = opts
  const slots = Math.floor(span / messageBytes)
  const dst = Buffer.alloc(span, 0)
  const req = Buffer.alloc(8)
  const samples: number[] = []
  return new Promise((resolve, reject) => {
    const warmEnd = Date.now() + opts.warmupSeconds * 1000
    let deadline = Number.POSITIVE_INFINITY
    let i = 0
    let got = 0
    let offset = 0
    let t0 = 0
    const send = () => {
      offset = (i++ % slots) * messageBytes
      got = 0
      req.writeUInt32LE(offset, 0)
      req.writeUInt32LE(messageBytes, 4)
      t0 = nowNs()
      sock.write(req)
    }
    // Bounds the whole run even if the server stops answering.
    const watchdog = setTimeout(
      () => done(new Error('baseline latency run timed out')),
      (opts.warmupSeconds + opts.maxSeconds + 10) * 1000,
    )
    const done = (err?: Error) => {
      clearTimeout(watchdog)
      sock.removeAllListeners('data')
      if (err) reject(err)
      else resolve(samples)
    }
    sock.on('data', (chunk: Buffer) => {
      if (got + chunk.length > messageBytes) return done(new Error('baseline server sent more than asked'))
      chunk.copy(dst, offset + got)
      got += chunk.length
      if (got < messageBytes) return
      const t1 = nowNs()
      const now = Date.now()
      if (now >= warmEnd) {
        if (deadline === Number.POSITIVE_INFINITY) deadline = now + opts.maxSeconds * 1000
        samples.push((t1 - t0) / 1000)
        if (samples.length >= opts.ops || now >= deadline) return done()
      }
      send()
    })
    sock.once('error', done)
    sock.once('close', () => done(new Error('baseline connection closed early')))
    send()
  })
}
