/**
 * A flood of idle connections: `count` TCP connections to `host:port` that never send a
 * byte, opened from this namespace (one source address) at most `BURST` at a time, each
 * reopened when the target drops it, until `stop()`. What a client that wants to lock out
 * others does; the soak checks that legitimate peers still get through.
 */
import * as net from 'node:net'

export interface FloodStats {
  /** Connections wanted. */
  wanted: number
  /** Connects that succeeded (reopens included). */
  connected: number
  /** Connects refused, reset or timed out. */
  failed: number
  /** Connections the target closed after accepting them. */
  dropped: number
  /** Most open at once. */
  peakOpen: number
}

export interface Flood {
  stats(): FloodStats
  /** Closes every connection; no reopening after it. */
  stop(): void
}

const BURST = 64
const CONNECT_TIMEOUT_MS = 5000
const REOPEN_DELAY_MS = 100

export function startFlood(host: string, port: number, count: number): Flood {
  const stats: FloodStats = { wanted: count, connected: 0, failed: 0, dropped: 0, peakOpen: 0 }
  const sockets = new Set<net.Socket>()
  let open = 0
  let pending = 0
  let stopped = false
  let missing = count
  const timers = new Set<NodeJS.Timeout>()

  const later = (fn: () => void, ms: number) => {
    const t = setTimeout(() => {
      timers.delete(t)
      fn()
    }, ms)
    timers.add(t)
  }

  const pump = () => {
    while (!stopped && missing > 0 && pending < BURST) {
      missing--
      pending++
      const s = net.connect({ host, port })
      sockets.add(s)
      let connected = false
      s.setTimeout(CONNECT_TIMEOUT_MS, () => s.destroy(new Error('connect timeout')))
      s.once('connect', () => {
        connected = true
        pending--
        s.setTimeout(0)
        stats.connected++
        open++
        stats.peakOpen = Math.max(stats.peakOpen, open)
        pump()
      })
      s.on('error', () => {})
      s.once('close', () => {
        sockets.delete(s)
        if (connected) {
          open--
          if (!stopped) stats.dropped++
        } else {
          pending--
          if (!stopped) stats.failed++
        }
        if (stopped) return
        missing++
        later(pump, REOPEN_DELAY_MS)
      })
    }
  }
  pump()
  return {
    stats: () => ({ ...stats }),
    stop() {
      stopped = true
      for (const t of timers) clearTimeout(t)
      timers.clear()
      for (const s of sockets) s.destroy()
      sockets.clear()
    },
  }
}
