/**
 * The `notify` suite: notifications riding on transfers, between this process and a target
 * engine in a child process (bench/target.ts, which takes every notification as it comes).
 *
 *   notify-rate             engine.notify, `--window` outstanding, notifications/s (acknowledged by the
 *                           target; one path for every transport: the sender's link to the target)
 * and per transport T (shm, tcp):
 *   write-4KiB-notify-p50-T one 4 KiB WRITE with a notification at a time, p50 in µs   vs the same WRITE without (same run)
 *   write-4KiB-notify-p99-T the same, p99                                            vs the same WRITE without (same run)
 *
 * The write with a notification resolves once the target acknowledged the notification,
 * which it sends after every byte landed: the difference is what a notification adds. The
 * two kinds of WRITE alternate, one each, so that the host's load falls on both alike.
 * Each of `--repeat` rounds measures both; records carry every round's figures, the
 * median as `value`, and the host load (1-minute load average) of each round.
 */
import { Engine } from '../../index'
import { log } from '../lib/log'
import { MiB, startTarget } from '../lib/rig'
import { hostLoad } from '../lib/rounds'
import { median, round, summarize } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'notify'
const TRANSPORTS = ['shm', 'tcp'] as const
const PAYLOAD = Buffer.alloc(16, 7)

/** Acknowledged notifications per second, `window` outstanding, for `seconds`. */
async function rate(engine: Engine, seg: Awaited<ReturnType<Engine['openSegment']>>, seconds: number, window: number): Promise<number> {
  let done = 0
  const end = performance.now() + seconds * 1000
  const pump = async () => {
    while (performance.now() < end) {
      await engine.notify(seg, PAYLOAD)
      done++
    }
  }
  const started = performance.now()
  await Promise.all(Array.from({ length: window }, pump))
  return done / ((performance.now() - started) / 1000)
}

/** 4 KiB WRITE latencies in µs, with and without a notification, alternating. */
async function latencies(
  engine: Engine,
  write: (notify: boolean, off: number) => Promise<unknown>,
  ops: number,
  maxSeconds: number,
): Promise<{ plain: number[]; notified: number[] }> {
  const plain: number[] = []
  const notified: number[] = []
  const end = performance.now() + maxSeconds * 1000
  for (let i = 0; i < ops && performance.now() < end; i++) {
    const off = (i % 256) * 4096
    for (const n of [false, true]) {
      const t0 = performance.now()
      await write(n, off)
      ;(n ? notified : plain).push((performance.now() - t0) * 1000)
    }
  }
  return { plain, notified }
}

export async function notifySuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  const target = await startTarget(4 * MiB)
  const engine = await Engine.create()
  try {
    const seg = await engine.openSegment(target.segment)
    const local = engine.allocate(MiB)
    local.buffer.fill(1)
    const rates: number[] = []
    const rateLoads: Array<number | null> = []
    for (let r = 0; r < options.repeat; r++) {
      rateLoads.push(hostLoad())
      await rate(engine, seg, options.warmupSeconds || 0.5, options.window)
      rates.push(await rate(engine, seg, options.durationSeconds, options.window))
      log(`notify rate round ${r + 1}: ${Math.round(rates[r])} notifications/s (load ${String(rateLoads[r])})`)
    }
    records.push({
      suite: SUITE,
      case: 'notify-rate',
      value: round(median(rates), 0),
      unit: 'notifications/s',
      baseline: 'none',
      baseline_value: null,
      ratio: null,
      window: options.window,
      rounds: rates.map((x) => round(x, 0)),
      host_load: rateLoads,
    })
    for (const transport of TRANSPORTS) {
      const rounds: Array<{ p50: number; p99: number; p50Plain: number; p99Plain: number; load: number | null }> = []
      const write = (notify: boolean, off: number) =>
        engine.write({ local, remote: seg, remoteBuffer: target.buffer, localOffset: off, remoteOffset: off, length: 4096, requireTransport: transport, notify: notify ? PAYLOAD : undefined })
      for (let r = 0; r < options.repeat; r++) {
        const load = hostLoad()
        await latencies(engine, write, 200, options.warmupSeconds || 1)
        const lat = await latencies(engine, write, options.latencyOps, options.latencyMaxSeconds)
        const a = summarize(lat.notified)
        const b = summarize(lat.plain)
        rounds.push({ p50: a.p50, p99: a.p99, p50Plain: b.p50, p99Plain: b.p99, load })
        log(`notify/${transport} round ${r + 1}: 4 KiB write p50 ${round(a.p50, 1)} µs with, ${round(b.p50, 1)} µs without (load ${String(load)})`)
      }
      const pick = (f: (x: (typeof rounds)[number]) => number) => median(rounds.map(f))
      const loads = rounds.map((x) => x.load)
      for (const q of ['p50', 'p99'] as const) {
        const withN = pick((x) => x[q])
        const without = pick((x) => (q === 'p50' ? x.p50Plain : x.p99Plain))
        records.push({
          suite: SUITE,
          case: `write-4KiB-notify-${q}-${transport}`,
          value: round(withN, 1),
          unit: 'µs',
          baseline: `write-4KiB without a notification (${transport}, same run, alternating)`,
          baseline_value: round(without, 1),
          ratio: without > 0 ? round(withN / without, 2) : null,
          added_us: round(withN - without, 1),
          rounds: rounds.map((x) => ({ with: round(x[q], 1), without: round(q === 'p50' ? x.p50Plain : x.p99Plain, 1) })),
          host_load: loads,
        })
      }
    }
    const got = await target.ask('notes')
    log(`notify: the target received ${String(got.received)} notifications`)
  } finally {
    await engine.close()
    await target.stop()
  }
  return records
}
