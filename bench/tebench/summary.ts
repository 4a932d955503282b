/**
 * The run's summary line, from its case records: how many cases and operations, the bytes
 * and the measured time, what served them all, and the best bandwidth. Pure.
 */
import type { CaseRecord } from './output'

export interface SummaryRecord {
  record: 'summary'
  cases: number
  /** Cases cut short by Ctrl-C. */
  partial: number
  ops: number
  /** Bytes the measured operations moved (warm-up excluded, as every figure). */
  bytes: number
  /** Measured seconds: each case's mean per-thread wall time, summed. */
  measuredS: number
  /** What served every case together: `shm (100 %)`, `tcp 90 %, shm 10 %`, `none`. */
  served: string
  failovers: number
  /** The case of the highest BW, or null without cases. */
  best: { op: string; blockSize: number; batchSize: number; threads: number; bwGbps: number } | null
}

/** `shm (100 %)` for one transport, `tcp 90 %, shm 10 %` for several (as the rows' headers read). */
export function servedLabel(bytesBy: Map<string, number>): string {
  const total = [...bytesBy.values()].reduce((a, b) => a + b, 0)
  const shares = [...bytesBy].filter(([, b]) => b > 0).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
  const pct = (b: number) => {
    const p = (b * 100) / total
    return p < 1 ? '<1 %' : `${Math.round(p)} %`
  }
  if (shares.length === 0) return 'none'
  if (shares.length === 1) return `${shares[0][0]} (${pct(shares[0][1])})`
  return shares.map(([t, b]) => `${t} ${pct(b)}`).join(', ')
}

/** The summary of `rows`. */
export function summarize(rows: readonly CaseRecord[]): SummaryRecord {
  const bytesBy = new Map<string, number>()
  let best: SummaryRecord['best'] = null
  const s: SummaryRecord = { record: 'summary', cases: rows.length, partial: 0, ops: 0, bytes: 0, measuredS: 0, served: 'none', failovers: 0, best }
  for (const r of rows) {
    s.ops += r.ops
    s.bytes += r.ops * r.blockSize * r.batchSize
    s.measuredS += r.threads > 0 ? (r.ops * r.avgLatUs) / r.threads / 1e6 : 0
    s.failovers += r.failovers
    if (r.partial) s.partial++
    for (const share of r.served) bytesBy.set(share.transport, (bytesBy.get(share.transport) ?? 0) + share.bytes)
    if (!best || r.bwGbps > best.bwGbps) {
      best = { op: r.op, blockSize: r.blockSize, batchSize: r.batchSize, threads: r.threads, bwGbps: r.bwGbps }
    }
  }
  return { ...s, served: servedLabel(bytesBy), best }
}

/** The summary as one line (after `tebench: `). */
export function summaryText(s: SummaryRecord): string {
  const n = (v: number, one: string) => `${v} ${one}${v === 1 ? '' : 's'}`
  const parts = [
    n(s.cases, 'case') + (s.partial > 0 ? ` (${s.partial} partial)` : ''),
    n(s.ops, 'op'),
    `${(s.bytes / 1e9).toFixed(3)} GB in ${s.measuredS.toFixed(1)} s measured`,
    `served ${s.served}`,
    n(s.failovers, 'failover'),
  ]
  if (s.best) {
    const b = s.best
    parts.push(`best BW ${b.bwGbps.toFixed(2)} GB/s (${b.op} ${b.blockSize} B × ${b.batchSize}, ${n(b.threads, 'thread')})`)
  }
  return `summary: ${parts.join(', ')}`
}
