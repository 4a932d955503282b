/**
 * The `liveness` suite: how long the initiator takes to see FAILED when its peer goes away
 * in the middle of a stream of 1 MiB WRITEs (Promise API, 8 in flight, tcp):
 *
 *   sigkill      the target process is SIGKILLed; time from the kill until the initiator
 *                sees a write end FAILED. Goal: median <= 1000 ms.
 *   silent-loss  the target runs in its own network namespace (support/netns.ts) and its
 *                end of the veth link is taken down: no reset, no EOF, only silence. Time
 *                from link-down until the initiator sees a write end FAILED, with
 *                peerTimeoutMs = --peer-timeout-ms (default 3000, the engine's default).
 *                Goal: median <= peerTimeoutMs + 1000 ms. Needs root and iproute2.
 *
 * The stream keeps going after the cut until that first failure (the writes in flight at
 * the cut may all complete before it takes effect); afterwards every write still pending
 * must settle, or the trial fails.
 *
 * Each case runs `--trials` trials (default 20), each with a fresh target process (and, for
 * silent-loss, a fresh namespace), and prints one JSON line:
 *   {"suite":"liveness","case":"sigkill","median_ms":…,"max_ms":…,"trials":20}
 *   {"suite":"liveness","case":"silent-loss","median_ms":…,"max_ms":…,"peer_timeout_ms":3000,"trials":20}
 * with an `error` field added when the case could not be measured. Every child is killed by
 * pid and every namespace removed, also on failure and on SIGINT/SIGTERM.
 */
import { Engine, type FerryError, type Region, type Segment } from '../../index'
import { createNetwork, netnsUnavailable } from '../../support/netns'
import { atCleanup } from '../lib/children'
import { log } from '../lib/log'
import { clusterSecret } from '../lib/secret'
import { MiB, startTarget, type Target } from '../lib/rig'
import { median, round } from '../lib/stats'
import type { SuiteOptions, TimingRecord } from './types'

const SUITE = 'liveness'
const WINDOW = 8
const BLOCKS = 16

const delay = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** A stream of 1 MiB writes with WINDOW in flight, until `stop()`. */
function stream(engine: Engine, local: Region, seg: Segment, buffer: number) {
  let running = true
  let completed = 0
  const failedAt: number[] = []
  const pending = new Set<Promise<void>>()
  let i = 0
  const launch = () => {
    if (!running) return
    const off = (i++ % BLOCKS) * MiB
    const p: Promise<void> = engine
      .write({ local, localOffset: off, remote: seg, remoteBuffer: buffer, remoteOffset: off, length: MiB })
      .then(
        () => void completed++,
        (_err: FerryError) => void failedAt.push(Date.now()),
      )
      .finally(() => {
        pending.delete(p)
        launch()
      })
    pending.add(p)
  }
  for (let k = 0; k < WINDOW; k++) launch()
  return {
    get completed() {
      return completed
    },
    failedAt,
    /** Stops launching; resolves when every write still pending has settled (or after `capMs`). */
    async drain(capMs: number): Promise<number> {
      running = false
      const left = [...pending]
      await Promise.race([Promise.all(left), delay(capMs)])
      return pending.size
    },
  }
}

/**
 * One trial: start the stream, wait until it flows, `cut()` the peer, keep the stream going
 * (writes issued into a dead or silent peer must fail too; and the writes in flight at the
 * cut may all still complete) until the first write ends FAILED, then stop launching and
 * wait until every pending write has settled. Returns ms from the cut to that first FAILED.
 */
async function trial(target: Target, engineOptions: Parameters<typeof Engine.create>[0], cut: () => void, capMs: number): Promise<number> {
  const engine = await Engine.create(engineOptions)
  try {
    const local = engine.allocate(BLOCKS * MiB)
    const seg = await engine.openSegment(target.segment)
    const s = stream(engine, local, seg, target.buffer)
    const flowing = Date.now() + 15_000
    while (s.completed < 20 && Date.now() < flowing) await delay(5)
    if (s.completed < 20) throw new Error('the write stream did not flow')
    const cutAt = Date.now()
    cut()
    const seen = () => s.failedAt.find((t) => t >= cutAt)
    while (seen() === undefined && Date.now() - cutAt < capMs) await delay(1)
    const first = seen()
    const stuck = await s.drain(capMs)
    if (first === undefined) throw new Error(`no write failed within ${capMs} ms of the cut`)
    if (stuck > 0) throw new Error(`${stuck} writes still pending ${capMs} ms after the first failure`)
    return first - cutAt
  } finally {
    await engine.close()
  }
}

function record(name: string, times: number[], trials: number, extra: Record<string, unknown>, error?: string): TimingRecord {
  const r: TimingRecord = {
    suite: SUITE,
    case: name,
    median_ms: times.length ? round(median(times), 1) : null,
    max_ms: times.length ? Math.max(...times) : null,
    ...extra,
    trials: times.length,
  }
  if (error !== undefined || times.length < trials) r.error = error ?? `${trials - times.length} of ${trials} trials failed`
  return r
}

async function sigkill(options: SuiteOptions): Promise<TimingRecord> {
  const times: number[] = []
  let error: string | undefined
  for (let k = 0; k < options.trials; k++) {
    let target: Target | undefined
    try {
      target = await startTarget(BLOCKS * MiB)
      const pid = target.pid
      const ms = await trial(target, { transports: ['tcp'] }, () => process.kill(pid, 'SIGKILL'), 10_000)
      times.push(ms)
      log(`liveness sigkill trial ${k + 1}/${options.trials}: ${ms} ms`)
    } catch (err) {
      error = (err as Error).message
      log(`liveness sigkill trial ${k + 1}: ${error}`)
    } finally {
      await target?.stop()
    }
  }
  return record('sigkill', times, options.trials, {}, error)
}

async function silentLoss(options: SuiteOptions): Promise<TimingRecord> {
  const peerTimeoutMs = options.peerTimeoutMs
  const extra = { peer_timeout_ms: peerTimeoutMs }
  const why = netnsUnavailable()
  if (why) return record('silent-loss', [], options.trials, extra, why)
  // The target listens on its namespace's address, beyond loopback: both ends need the
  // cluster secret.
  const cluster = clusterSecret('liveness')
  const times: number[] = []
  let error: string | undefined
  try {
    for (let k = 0; k < options.trials; k++) {
      let target: Target | undefined
      let net: ReturnType<typeof createNetwork> | undefined
      let forget = () => {}
      try {
        net = createNetwork()
        forget = atCleanup(net.destroy)
        target = await startTarget(BLOCKS * MiB, {
          listen: `${net.b.address}:0`,
          machineId: `liveness-b-${process.pid}`,
          prefix: net.prefix(net.b),
          env: { FERRY_AUTH_SECRET_FILE: cluster.file },
        })
        const n = net
        const ms = await trial(
          target,
          { transports: ['tcp'], peerTimeoutMs, machineId: `liveness-a-${process.pid}`, authSecret: cluster.secret },
          () => n.linkDown(),
          peerTimeoutMs + 10_000,
        )
        times.push(ms)
        log(`liveness silent-loss trial ${k + 1}/${options.trials}: ${ms} ms`)
      } catch (err) {
        error = (err as Error).message
        log(`liveness silent-loss trial ${k + 1}: ${error}`)
      } finally {
        await target?.stop()
        net?.destroy()
        forget()
      }
    }
  } finally {
    cluster.remove()
  }
  return record('silent-loss', times, options.trials, extra, error)
}

/** Runs both cases. */
export async function livenessSuite(options: SuiteOptions): Promise<TimingRecord[]> {
  return [await sigkill(options), await silentLoss(options)]
}
