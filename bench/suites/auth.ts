/**
 * The `auth` suite: what the cluster secret costs. Two target engines in child processes
 * (bench/target.ts) on this host, the same but for the secret (FERRY_AUTH_SECRET_FILE on one),
 * each reached by an initiator engine in this process with the matching setting:
 *
 *   tcp-write-1MiB-auth   GB/s with the secret   vs the same WRITEs without (same run, same method)
 *   shm-write-1MiB-auth   the same over shm
 *   open-segment-handshake  openSegment's median µs with the secret vs without (same run)
 *
 * The secret is proved once per connection (HMAC-SHA256 challenge-response, both ways); no
 * frame after the handshake carries anything more, so throughput should not move: target
 * ratio >= 0.97. The throughput cases run like the failover suite's: `--repeat` rounds, odd
 * rounds without the secret first, even rounds with it first, both API methods (or the one
 * chosen in round 1), the record comparing the same method. openSegment is timed
 * alternately on both sides, each time a closed segment opened again (new control and data
 * connections, a new handshake on each).
 */
import type { EngineOptions } from '../../index'
import { SIDES, optionCostCase, type Side } from '../lib/option-cost'
import { clusterSecret } from '../lib/secret'
import { openRig, startTarget, type Rig, type Target } from '../lib/rig'
import { hostLoad } from '../lib/rounds'
import { nowNs, percentile, round, sorted } from '../lib/stats'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'auth'
const TARGET_RATIO = 0.97
/** openSegment timings per side. */
const OPENS = 40

type Transport = 'tcp' | 'shm'

interface Sides {
  targets: Partial<Record<Side, Target>>
  rigs: Partial<Record<Side, Rig>>
}

/** A target and an initiator per side; tcp only where `transport` is tcp. */
async function startSides(transport: Transport, regionBytes: number, options: SuiteOptions, secretFile: string, secret: string): Promise<Sides> {
  const sides: Sides = { targets: {}, rigs: {} }
  const transports: EngineOptions = transport === 'tcp' ? { transports: ['tcp'] } : {}
  for (const side of SIDES) {
    // "off" is no secret at all: without allowUnauthenticated an engine proves the per-user one.
    const env: Record<string, string> = side === 'on' ? { FERRY_AUTH_SECRET_FILE: secretFile } : { FERRY_BENCH_UNAUTHENTICATED: '1' }
    const target = await startTarget(regionBytes, { env })
    sides.targets[side] = target
    sides.rigs[side] = await openRig(target, regionBytes, options, side === 'on' ? { ...transports, authSecret: secret } : { ...transports, allowUnauthenticated: true })
  }
  return sides
}

async function stopSides(sides: Sides): Promise<void> {
  for (const side of SIDES) await sides.rigs[side]?.engine.close()
  for (const side of SIDES) await sides.targets[side]?.stop()
}


/** openSegment after closeSegment, alternating sides, `OPENS` times each. */
async function handshakeCase(rig: Record<Side, Rig>): Promise<CaseRecord> {
  const us: Record<Side, number[]> = { off: [], on: [] }
  for (let i = 0; i < OPENS; i++) {
    for (const side of i % 2 === 0 ? SIDES : [...SIDES].reverse()) {
      const r = rig[side]
      r.engine.closeSegment(r.remote)
      const t0 = nowNs()
      r.remote = await r.engine.openSegment(r.target.segment)
      us[side].push((nowNs() - t0) / 1e3)
    }
  }
  const on = sorted(us.on)
  const off = sorted(us.off)
  const p50 = { on: percentile(on, 0.5), off: percentile(off, 0.5) }
  return {
    suite: SUITE,
    case: 'open-segment-handshake',
    value: round(p50.on, 1),
    unit: 'us (p50 of openSegment)',
    baseline: 'openSegment of a target without a secret, from an engine without one (same run, alternating)',
    baseline_value: round(p50.off, 1),
    ratio: round(p50.on / p50.off, 3),
    added_us_p50: round(p50.on - p50.off, 1),
    p90_us: { on: round(percentile(on, 0.9), 1), off: round(percentile(off, 0.9), 1) },
    opens: OPENS,
    note: 'each openSegment follows a closeSegment of the same segment, so it makes new connections and proves the secret on each',
    host_load: hostLoad(),
  }
}

export async function authSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const regionBytes = options.workingSetBytes
  const { secret, file: secretFile, remove } = clusterSecret('auth')
  const records: CaseRecord[] = []
  try {
    for (const transport of ['tcp', 'shm'] as const) {
      const sides = await startSides(transport, regionBytes, options, secretFile, secret)
      try {
        const rig = sides.rigs as Record<Side, Rig>
        records.push(
          await optionCostCase(
            {
              suite: SUITE,
              name: `${transport}-write-1MiB-auth`,
              word: 'secret',
              op: 'write',
              transport,
              targetRatio: TARGET_RATIO,
              baseline: 'the same 1 MiB WRITEs between engines without a secret',
              order: 'rounds alternate the order: odd rounds without the secret first, even rounds with it first',
            },
            rig,
            regionBytes,
            options,
          ),
        )
        if (transport === 'tcp') records.push(await handshakeCase(rig))
      } finally {
        await stopSides(sides)
      }
    }
  } finally {
    remove()
  }
  return records
}
