/**
 * The `integrity` suite: what `verify` costs. One target engine in a child process
 * (bench/target.ts) on this host, reached over tcp by two initiator engines in this
 * process, the same but for `verify` (the engine's default for every request):
 *
 *   tcp-1MiB-verify        1 MiB WRITEs, GB/s with verify vs the same without (same run)
 *   tcp-1MiB-verify-read   the same for READs
 *
 * With verify a WRITE's payload is checksummed (CRC32C, SSE4.2) at the source, and at the
 * target read into a staging buffer, checked, then copied into the buffer; a READ is
 * checksummed at the target and checked where it landed. Target ratio >= 0.85. The rounds
 * run like the auth suite's: `--repeat` rounds, odd rounds without verify first, even
 * rounds with it first, both API methods (or the one chosen in round 1), the record
 * comparing the same method.
 */
import { SIDES, optionCostCase, type Side } from '../lib/option-cost'
import { openRig, startTarget, type Rig } from '../lib/rig'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'integrity'
const TARGET_RATIO = 0.85


export async function integritySuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const regionBytes = options.workingSetBytes
  const target = await startTarget(regionBytes)
  const rigs: Partial<Record<Side, Rig>> = {}
  try {
    for (const side of SIDES) rigs[side] = await openRig(target, regionBytes, options, { transports: ['tcp'], verify: side === 'on' })
    const rig = rigs as Record<Side, Rig>
    const records: CaseRecord[] = []
    for (const op of ['write', 'read'] as const) records.push(
        await optionCostCase(
          {
            suite: SUITE,
            name: op === 'write' ? 'tcp-1MiB-verify' : 'tcp-1MiB-verify-read',
            word: 'verify',
            op,
            transport: 'tcp',
            targetRatio: TARGET_RATIO,
            baseline: `the same 1 MiB ${op.toUpperCase()}s over tcp to the same target without verify`,
            order: 'rounds alternate the order: odd rounds without verify first, even rounds with it first',
          },
          rig,
          regionBytes,
          options,
        ),
      )
    return records
  } finally {
    for (const side of SIDES) await rigs[side]?.engine.close()
    await target.stop()
  }
}
