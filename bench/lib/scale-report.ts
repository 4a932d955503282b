/**
 * The `scale` suite's report (bench/suites/scale.ts): each record's speed-up over the same
 * series at its fewest threads, and the readable table of every record. Pure: records in,
 * records and lines out.
 *
 * Run as a script it prints the table of the scale records in JSON-lines files (what
 * scripts/scale-check.sh shows after its runs):
 *
 *   node dist/bench/lib/scale-report.js FILE...
 */
import * as fs from 'node:fs'

/** The fields of a scale record that the report reads. */
export interface ScalePoint {
  suite: string
  transport: string
  opcode: string
  block_bytes: number
  threads: number
  value: number | null
  baseline_value: number | null
  ratio: number | null
  avg_tx_us?: number | null
  engine_speedup?: number | null
  baseline_speedup?: number | null
  /** The engine over the companion baseline (tcp: iperf3 pinned cross-core), if measured. */
  companion_ratio?: number | null
  error?: string
}

const KiB = 1024
const MiB = KiB * KiB

/** 4096 as "4 KiB", 1048576 as "1 MiB". */
export const sizeLabel = (bytes: number) => (bytes >= MiB && bytes % MiB === 0 ? `${bytes / MiB} MiB` : `${bytes / KiB} KiB`)

/** The series a point belongs to: everything but the thread count. */
const seriesOf = (p: ScalePoint) => `${p.transport}/${p.opcode}/${p.block_bytes}`

const speedup = (v: number | null, base: number | null) =>
  v === null || base === null || !(base > 0) ? null : Math.round((v / base) * 100) / 100

/**
 * Sets `engine_speedup` and `baseline_speedup`: each figure over its series' figure at the
 * series' fewest threads (1 where measured), so 2.0 at 2 threads is perfect scaling from 1.
 */
export function addSpeedups<T extends ScalePoint>(points: T[]): T[] {
  const first = new Map<string, T>()
  for (const p of points) {
    const f = first.get(seriesOf(p))
    if (!f || p.threads < f.threads) first.set(seriesOf(p), p)
  }
  for (const p of points) {
    const f = first.get(seriesOf(p))!
    p.engine_speedup = speedup(p.value, f.value)
    p.baseline_speedup = speedup(p.baseline_value, f.baseline_value)
  }
  return points
}

const num = (x: number | null | undefined, digits: number) => (typeof x === 'number' && Number.isFinite(x) ? x.toFixed(digits) : '-')

/** The table: one row per point, in the order given, with a header naming the units. */
export function scaleTable(points: ScalePoint[]): string[] {
  const head = ['transport', 'op', 'block', 'threads', 'engine GB/s', 'x fewest', 'baseline GB/s', 'x fewest', 'ratio', 'x-core ratio', 'Avg Tx us']
  const rows = points.map((p) => [
    p.transport,
    p.opcode,
    sizeLabel(p.block_bytes),
    String(p.threads),
    num(p.value, 3),
    num(p.engine_speedup, 2),
    num(p.baseline_value, 3),
    num(p.baseline_speedup, 2),
    num(p.ratio, 3),
    num(p.companion_ratio, 3),
    num(p.avg_tx_us, 1) + (p.error ? '  (error)' : ''),
  ])
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i])).join('  ').trimEnd()
  return [line(head), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)]
}

/** The scale records among JSON lines (other suites' lines and blank lines skipped). */
export function scalePointsOf(text: string): ScalePoint[] {
  return text
    .split('\n')
    .filter((l) => l.trim().startsWith('{'))
    .map((l) => JSON.parse(l) as ScalePoint)
    .filter((r) => r.suite === 'scale')
}

if (require.main === module) {
  const files = process.argv.slice(2)
  if (files.length === 0) {
    process.stderr.write('usage: node scale-report.js FILE...   (JSON lines of npm run perf -- --suite scale)\n')
    process.exitCode = 2
  } else {
    const points = files.flatMap((f) => scalePointsOf(fs.readFileSync(f, 'utf8')))
    process.stdout.write(scaleTable(points).join('\n') + '\n')
  }
}
