/**
 * CPU time the hypervisor took from this VM ("steal"), from /proc/stat. These machines are
 * shared VMs: when the host runs its other guests, a vCPU stops for milliseconds at a
 * time. A single operation in flight waits for every thread it hands work to, so one stolen
 * vCPU stalls it whole, while a stream such as iperf3 keeps its buffers filling on the
 * other vCPU; a round with heavy steal therefore says little about either side. The
 * records carry the steal of each measurement so that such rounds can be told apart.
 */
import * as fs from 'node:fs'
import { round } from './stats'

/** What a record's `*_steal_pct` fields mean. */
export const STEAL_NOTE =
  'engine_steal_pct / baseline_steal_pct: CPU time the hypervisor took from this VM during that run (/proc/stat steal), percent of all CPU time; one op in flight stalls whole while a vCPU is stolen, a stream barely, so rounds with high steal understate the engine'

export interface CpuTimes {
  steal: number
  total: number
}

/** The aggregate CPU times (jiffies) in a /proc/stat text, or null if it has none. */
export function parseCpuTimes(procStat: string): CpuTimes | null {
  const fields = procStat.split('\n', 1)[0].trim().split(/\s+/)
  if (fields[0] !== 'cpu') return null
  // user nice system idle iowait irq softirq steal (guest times are inside user/nice).
  const values = fields.slice(1, 9).map(Number)
  if (values.length < 8 || values.some((v) => !Number.isFinite(v))) return null
  return { steal: values[7], total: values.reduce((a, b) => a + b, 0) }
}

/** Steal between two readings, in percent of all CPU time then; null without progress. */
export function stealPercent(start: CpuTimes | null, end: CpuTimes | null): number | null {
  if (!start || !end || end.total <= start.total) return null
  return round((100 * (end.steal - start.steal)) / (end.total - start.total), 1)
}

function cpuTimes(): CpuTimes | null {
  try {
    return parseCpuTimes(fs.readFileSync('/proc/stat', 'utf8'))
  } catch {
    return null
  }
}

/** Starts measuring; the returned function gives the steal in percent of all CPU time since then. */
export function stealMeter(): () => number | null {
  const start = cpuTimes()
  return () => stealPercent(start, cpuTimes())
}

/** Runs `fn` and returns its result with the steal measured over it. */
export async function withSteal<T>(fn: () => Promise<T>): Promise<{ result: T; stealPct: number | null }> {
  const meter = stealMeter()
  const result = await fn()
  return { result, stealPct: meter() }
}
