/**
 * A legitimate newcomer during an idle flood: a fresh engine in the driver's namespace (the
 * flood's source address) opens host FERRY_SOAK_PROBE.target by name through etcd and writes
 * and reads back one 4 KiB block. Prints one JSON line — `{openMs, ioMs, ok, code?}` — and
 * exits. Settings in FERRY_SOAK_PROBE (JSON: etcd, target, regionBytes, hangMs); the secret
 * in FERRY_AUTH_SECRET_FILE. The block goes to the region's probe area (flags.ts's
 * `PROBE_AREA`), which no writer uses.
 */
import { Engine } from '../../index'
import { PROBE_AREA } from './flags'
import { bounded, codeOf } from './wait'

interface ProbeSettings {
  etcd: `etcd://${string}`
  target: string
  regionBytes: number
  hangMs: number
}

const BLOCK = PROBE_AREA

async function main(): Promise<Record<string, unknown>> {
  const s = JSON.parse(process.env.FERRY_SOAK_PROBE ?? 'null') as ProbeSettings | null
  if (!s) throw new Error('FERRY_SOAK_PROBE is not set')
  const engine = await Engine.create({ metadata: s.etcd, machineId: 'soak-probe', transports: ['tcp'], segmentName: `soak-probe-${process.pid}` })
  const out: Record<string, unknown> = {}
  try {
    const t0 = performance.now()
    const seg = await bounded(engine.openSegment(s.target), s.hangMs)
    out.openMs = Math.round((performance.now() - t0) * 10) / 10
    const buffer = seg.buffers.find((b) => b.length === s.regionBytes)
    if (!buffer) throw Object.assign(new Error('no target buffer'), { code: 'NO_BUFFER' })
    const local = engine.allocate(2 * BLOCK)
    local.buffer.fill(0xa5, 0, BLOCK)
    const remote = { remote: seg, remoteBuffer: buffer.id, remoteOffset: s.regionBytes - BLOCK, length: BLOCK }
    const t1 = performance.now()
    await engine.write({ local, ...remote, signal: AbortSignal.timeout(s.hangMs) })
    await engine.read({ local, localOffset: BLOCK, ...remote, signal: AbortSignal.timeout(s.hangMs) })
    out.ioMs = Math.round((performance.now() - t1) * 10) / 10
    out.ok = local.buffer.subarray(0, BLOCK).equals(local.buffer.subarray(BLOCK, 2 * BLOCK))
  } catch (err) {
    out.ok = false
    out.code = codeOf(err)
    out.message = (err as Error)?.message
  } finally {
    await engine.close()
  }
  return out
}

main().then(
  (r) => process.stdout.write(JSON.stringify(r) + '\n'),
  (err: unknown) => {
    process.stdout.write(JSON.stringify({ ok: false, code: codeOf(err), message: (err as Error)?.message }) + '\n')
    process.exitCode = 1
  },
)
