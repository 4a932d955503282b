/**
 * What the pure-Node baselines share: the server side (a framed loopback server that
 * announces its port) and the client side (the server in a child process, one connection).
 */
import * as net from 'node:net'
import { jsonLines, startTsx, stopChild, tailStderr } from './children'

/**
 * Serves framed requests on 127.0.0.1 (any port, Nagle off) and prints `{port, pid}`, the
 * hello the client waits for. `consume` gets the bytes received and not yet used and
 * returns how many it used (whole frames), or `undefined` once it destroyed the socket.
 * When stdin closes (the parent is done or gone) the server and its sockets close, and the
 * process ends by itself once nothing is left to run.
 */
export function serveFrames(consume: (sock: net.Socket, pending: Buffer) => number | undefined): net.Server {
  const sockets = new Set<net.Socket>()
  const server = net.createServer((sock) => {
    sockets.add(sock)
    sock.on('close', () => sockets.delete(sock))
    sock.setNoDelay(true)
    let pending: Buffer = Buffer.alloc(0)
    sock.on('data', (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
      const used = consume(sock, pending)
      if (used !== undefined) pending = pending.subarray(used)
    })
    sock.on('error', () => sock.destroy())
  })
  server.listen(0, '127.0.0.1', () => {
    const addr = server.address() as net.AddressInfo
    process.stdout.write(JSON.stringify({ port: addr.port, pid: process.pid }) + '\n')
  })
  const stop = () => {
    server.close()
    for (const sock of sockets) sock.destroy()
    process.stdin.pause()
  }
  process.stdin.once('end', stop)
  process.stdin.once('close', stop)
  process.stdin.resume()
  return server
}

/** A loopback connection to `port` with Nagle off; rejects after 10 s. */
function connectLoopback(port: number): Promise<net.Socket> {
  return new Promise<net.Socket>((resolve, reject) => {
    const timer = setTimeout(() => {
      s.destroy()
      reject(new Error('baseline: connect timed out after 10 s'))
    }, 10_000)
    const s = net.connect(port, '127.0.0.1', () => {
      clearTimeout(timer)
      s.setNoDelay(true)
      resolve(s)
    })
    s.once('error', (e) => {
      clearTimeout(timer)
      reject(e)
    })
  })
}

/** A baseline server running in a child process, and this process's connection to it. */
export interface BaselineConnection {
  sock: net.Socket
  /** Closes the connection and kills the server by pid (idempotent). */
  close(): Promise<void>
}

/** Starts `script` (tsx) with `env`, waits for its hello and connects once. */
export async function connectBaseline(label: string, script: string, env: Record<string, string>): Promise<BaselineConnection> {
  const server = startTsx(label, script, [], env)
  const stderr = tailStderr(server)
  const lines = jsonLines(server, () => stderr())
  let sock: net.Socket | undefined
  let closed = false
  const close = async () => {
    if (closed) return
    closed = true
    sock?.destroy()
    lines.close()
    server.stdin?.end()
    await stopChild(server)
  }
  try {
    const hello = await lines.next(20_000)
    sock = await connectLoopback(Number(hello.port))
  } catch (err) {
    await close()
    throw err
  }
  // Absorbs socket errors between runs (a run listens for them itself while it lasts).
  sock.on('error', () => undefined)
  return { sock, close }
}
