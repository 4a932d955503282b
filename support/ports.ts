/**
 * Ports for servers started later or in another process (etcd, iperf3, an engine restarted
 * on a known port).
 *
 * Listening on port 0, reading the port and closing the server leaves a window in which the
 * kernel may hand that port to any outgoing connection on the machine (it lies in the
 * ephemeral range), and the server started later fails "address already in use": tests run
 * side by side open connections all the time, and a CI run hit it. A port below the kernel's
 * ephemeral range is never handed out by `connect` or by port 0; only another explicit pick
 * can take it, and picks are spread at random over thousands of ports.
 */
import { randomInt } from 'node:crypto'
import * as fs from 'node:fs'
import * as net from 'node:net'

/** The lowest port picked: above the well-known and most registered service ports. */
const LOWEST = 10_000
/** With fewer candidates than this below the ephemeral range, the kernel picks (the old way). */
const MIN_CANDIDATES = 1_000

/** A port on `host` that is free now and that the kernel does not hand out by itself. */
export async function unusedPort(host = '127.0.0.1'): Promise<number> {
  const low = ephemeralLow()
  if (low >= LOWEST + MIN_CANDIDATES) {
    for (let i = 0; i < 256; i++) {
      const port = randomInt(LOWEST, low)
      if ((await tryListen(host, port)) !== undefined) return port
    }
  }
  const port = await tryListen(host, 0)
  if (port === undefined) throw new Error(`no free port on ${host}`)
  return port
}

/** The lower end of `net.ipv4.ip_local_port_range` (Linux's default where it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0])
    return Number.isInteger(low) && low > 0 ? low : 32_768
  } catch {
    return 32_768
  }
}

/** Listens on `host:port` and closes again: the port it got, or undefined when taken. */
function tryListen(host: string, port: number): Promise<number | undefined> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', (err: NodeJS.ErrnoException) => (err.code === 'EADDRINUSE' ? resolve(undefined) : reject(err)))
    srv.listen(port, host, () => {
      const got = (srv.address() as net.AddressInfo).port
      srv.close(() => resolve(got))
    })
  })
}
