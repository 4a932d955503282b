/**
 * Pure-Node TCP latency baseline: what a Node user gets fetching a small block from another
 * process without Ferry. The server (node_tcp_lat_server.ts) runs in a child process; this
 * process sends an 8-byte request `{offset, length}` over loopback TCP (Nagle off) and times
 * until all `length` bytes of the answer are copied into a local buffer. One request in
 * flight at a time: a READ round trip, the shape of Ferry's `engine.read`.
 *
 * `startNodeTcpLatency` starts the server and connects once; its `run` can then be called
 * for several rounds over the same connection (as the engine's runs reuse its target), and
 * `close` kills the server by pid.
 */
import * as net from 'node:net'
import * as path from 'node:path'
import { connectBaseline } from '../lib/loopback'
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

export interface LatencyBaselineSession {
  /** One run: round-trip times in microseconds. */
  run(opts: Omit<LatencyBaselineOptions, 'messageBytes'>): Promise<number[]>
  close(): Promise<void>
}

const SPAN = 64 << 20

export async function startNodeTcpLatency(messageBytes: number): Promise<LatencyBaselineSession> {
  const { sock: connected, close } = await connectBaseline('node tcp latency server', path.join(__dirname, 'node_tcp_lat_server.ts'), {
    FERRY_BENCH_LAT_BYTES: String(SPAN),
  })
  const dst = Buffer.alloc(SPAN, 0)
  return {
    run(opts) {
      return pingPong(connected, dst, { ...opts, messageBytes })
    },
    close,
  }
}

/** One run with a server and connection of its own. */
export async function nodeTcpLatency(opts: LatencyBaselineOptions): Promise<number[]> {
  const session = await startNodeTcpLatency(opts.messageBytes)
  try {
    return await session.run(opts)
  } finally {
    await session.close()
  }
}

function pingPong(sock: net.Socket, dst: Buffer, opts: LatencyBaselineOptions): Promise<number[]> {
  const { messageBytes } = opts
  const slots = Math.floor(dst.length / messageBytes)
  const req = Buffer.alloc(8)
  const samples: number[] = []
  return new Promise((resolve, reject) => {
    if (sock.destroyed) return reject(new Error('baseline connection closed'))
    const warmEnd = Date.now() + opts.warmupSeconds * 1000
    let deadline = Number.POSITIVE_INFINITY
    let i = 0
    let got = 0
    let offset = 0
    let t0 = 0
    let settled = false
    const send = () => {
      offset = (i++ % slots) * messageBytes
      got = 0
      req.writeUInt32LE(offset, 0)
      req.writeUInt32LE(messageBytes, 4)
      t0 = nowNs()
      sock.write(req)
    }
    const onData = (chunk: Buffer) => {
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
    }
    const onError = (err: Error) => done(err)
    const onClose = () => done(new Error('baseline connection closed early'))
    // Bounds the whole run even if the server stops answering.
    const watchdog = setTimeout(
      () => {
        // The answer in flight would land in the next run: this connection is done for.
        sock.destroy()
        done(new Error('baseline latency run timed out'))
      },
      (opts.warmupSeconds + opts.maxSeconds + 10) * 1000,
    )
    function done(err?: Error) {
      if (settled) return
      settled = true
      clearTimeout(watchdog)
      sock.off('data', onData)
      sock.off('error', onError)
      sock.off('close', onClose)
      // After a failure the stream may be out of step: later runs must not reuse it.
      if (err) sock.destroy()
      if (err) reject(err)
      else resolve(samples)
    }
    sock.on('data', onData)
    sock.once('error', onError)
    sock.once('close', onClose)
    send()
  })
}
