/**
 * The `encrypt` suite: what sealing tcp data connections costs (`encrypt`: AES-256-GCM,
 * per-connection keys from the handshake). Two target engines in child processes
 * (bench/target.ts) on this host, both holding the cluster secret, one sealing every data
 * connection (encrypt: true) and one none (encrypt: false), each reached by an initiator
 * engine in this process with the matching setting:
 *
 *   tcp-1MiB-encrypt   GB/s of 1 MiB WRITEs sealed   vs the same WRITEs in plaintext (same run, same method)
 *
 * Every frame is sealed by its sender and opened whole into a staging buffer by its
 * receiver before any of it reaches memory: two passes of AES-GCM and a copy per byte, on
 * the I/O threads. Target ratio >= 0.5. Rounds as in the auth suite: odd rounds plaintext
 * first, even rounds sealed first.
 */
import { SIDES, optionCostCase, type Side } from '../lib/option-cost'
import { clusterSecret } from '../lib/secret'
import { openRig, startTarget, type Rig, type Target } from '../lib/rig'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'encrypt'
const TARGET_RATIO = 0.5

interface Sides {
  targets: Partial<Record<Side, Target>>
  rigs: Partial<Record<Side, Rig>>
}

/** A target and an initiator per side, over tcp, both with the secret; "on" seals. */
async function startSides(regionBytes: number, options: SuiteOptions, secretFile: string, secret: string): Promise<Sides> {
  const sides: Sides = { targets: {}, rigs: {} }
  for (const side of SIDES) {
    const env: Record<string, string> = { FERRY_AUTH_SECRET_FILE: secretFile, FERRY_BENCH_ENCRYPT: side === 'on' ? 'true' : 'false' }
    const target = await startTarget(regionBytes, { env })
    sides.targets[side] = target
    sides.rigs[side] = await openRig(target, regionBytes, options, { transports: ['tcp'], authSecret: secret, encrypt: side === 'on' })
  }
  return sides
}

async function stopSides(sides: Sides): Promise<void> {
  for (const side of SIDES) await sides.rigs[side]?.engine.close()
  for (const side of SIDES) await sides.targets[side]?.stop()
}


export async function encryptSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const regionBytes = options.workingSetBytes
  const { secret, file: secretFile, remove } = clusterSecret('encrypt')
  try {
    const sides = await startSides(regionBytes, options, secretFile, secret)
    try {
      const rig = sides.rigs as Record<Side, Rig>
      const name = 'tcp-1MiB-encrypt'
      return [
        await optionCostCase(
          {
            suite: SUITE,
            name,
            word: 'encrypt',
            op: 'write',
            transport: 'tcp',
            targetRatio: TARGET_RATIO,
            baseline: 'the same 1 MiB WRITEs over plaintext connections (both engines with the secret)',
            order: 'rounds alternate the order: odd rounds plaintext first, even rounds sealed first',
          },
          rig,
          regionBytes,
          options,
        ),
      ]
    } finally {
      await stopSides(sides)
    }
  } finally {
    remove()
  }
}
