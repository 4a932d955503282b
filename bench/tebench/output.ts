/**
 * What tebench prints: its records (data first; with --format=json each is one line on
 * stdout, tagged by `record`), and their writer in each format: Ferry's table, Mooncake's
 * layout, CSV or JSON lines. The progress line is `progress`'s, on stderr.
 *
 * Every format starts with the run's header (what produced it) and ends with a summary:
 * table lines `tebench: KEY: VALUE`; CSV comment lines `# KEY: VALUE` above one line of
 * column names, a line per case, and `# summary: …`; JSON a `header` and a `summary`
 * record. Mooncake's layout keeps its stdout as Mooncake prints it: header and summary go
 * to stderr there.
 */
import { benchMooncakeHeader, benchMooncakeLine, type BenchRow, type EngineSpread, type TransportShare } from '../../index'
import type { Injection } from './fault'
import { shellQuote } from './command'
import type { RunInfo } from './runinfo'
import { summaryText, type SummaryRecord } from './summary'

/** How results are printed: Ferry's table, Mooncake's layout, CSV or JSON lines. */
export type OutputFormat = 'table' | 'mooncake' | 'csv' | 'json'

/** A case's row: the native row's columns and what served the case. */
export interface CaseRecord extends BenchRow {
  record: 'case'
  op: 'read' | 'write'
  /** What served the case: one transport's name, or the shares (`tcp 90 %, shm 10 %`). */
  transport: string
  /** The transport asked for: `auto` or the --xport_type. */
  requested: string
  /** How the workers addressed their stripes: `fixed` (Mooncake's) or `walk`. */
  addressing: 'fixed' | 'walk'
  /** Bytes per transport, of the measured operations only (as every figure of the row). */
  served: TransportShare[]
  failovers: number
  partial?: boolean
}

/** What produced the run, printed before anything else it measured. */
export interface HeaderRecord extends Omit<RunInfo, 'name'> {
  record: 'header'
  tool: 'tebench'
  package: string
  role: 'initiator' | 'target'
  /** The transport asked for: `auto` or the --xport_type. */
  requested: string
  addressing: 'fixed' | 'walk'
}

export interface FailedRecord {
  record: 'failed'
  status: string
  code?: string
  transport: string
  peer: string
  request: string
  reason: string
}

export interface InjectRecord {
  record: 'inject'
  signal: Injection['signal']
  targetPid: number
  afterMs: number
  /** From the fault to the first FAILED; null when nothing failed. */
  firstFailedMs: number | null
  /** From the fault to the last request's terminal status. */
  lastTerminalMs: number | null
}

export interface DisabledRecord {
  record: 'transportDisabled'
  transport: string
  reason: string
}

export interface UsageRecord {
  record: 'usage'
  code: 'ERR_USAGE'
  error: string
}

/** --notifi: the notifications of one case (initiator) or of the whole run (target). */
export interface NotifyRecord {
  record: 'notifications'
  role: 'initiator' | 'target'
  /** Initiator: sent during the case's measured time; target: received in all. */
  count: number
  /** Initiator: sent during the case's warm-up, left out of `count` and `perSecond`. */
  warmup?: number
  /** Initiator: whose delivery failed; target: dropped because its queue was full. */
  lost: number
  /** Initiator: sent per second of the case's measured time; null for the target. */
  perSecond: number | null
}

/** The run header's engine: what it spreads its work over, as it reports it (`Engine.spread()`). */
export interface SpreadRecord extends EngineSpread {
  record: 'engine'
  role: 'initiator' | 'target'
}

export type AnyRecord =
  | HeaderRecord
  | CaseRecord
  | FailedRecord
  | InjectRecord
  | DisabledRecord
  | UsageRecord
  | NotifyRecord
  | SpreadRecord
  | SummaryRecord

/** The engine's words: `2 I/O threads, tcp 4 lanes per peer, shm 1 copy thread`. */
export function spreadText(r: EngineSpread): string {
  const n = (v: number, one: string, many = `${one}s`) => `${v} ${v === 1 ? one : many}`
  const parts = [n(r.ioThreads, 'I/O thread')]
  if (r.tcpLanes !== null) parts.push(`tcp ${n(r.tcpLanes, 'lane')} per peer`)
  if (r.shmCopyThreads !== null) parts.push(`shm ${n(r.shmCopyThreads, 'copy thread')}`)
  return parts.join(', ')
}

/** The header as `KEY: VALUE` pairs, in the order printed. */
export function headerPairs(h: HeaderRecord): Array<[string, string]> {
  const pairs: Array<[string, string]> = [
    ['version', `${h.package} ${h.version} (commit ${h.commit})`],
    ['node', h.node],
    ['host', `${h.host}, ${h.cores} core${h.cores === 1 ? '' : 's'}`],
    ['role', h.role],
    ['transport', `requested ${h.requested}`],
  ]
  if (h.role === 'initiator') pairs.push(['addressing', h.addressing])
  pairs.push(['flags', h.flags.length === 0 ? '(none)' : h.flags.map(shellQuote).join(' ')])
  return pairs
}

const us = (v: number) => v.toFixed(2)
/** Ferry's table: Mooncake's columns, then the median and the longest operation. */
const COLUMNS: Array<[string, (r: CaseRecord) => string]> = [
  ['BlkSize (B)', (r) => String(r.blockSize)],
  ['Batch', (r) => String(r.batchSize)],
  ['BW (GB/S)', (r) => r.bwGbps.toFixed(2)],
  ['Avg Inst GB/s', (r) => r.avgInstGbps.toFixed(2)],
  ['Avg Lat (us)', (r) => us(r.avgLatUs)],
  ['Avg Tx (us)', (r) => us(r.avgTxUs)],
  ['P50 Tx (us)', (r) => us(r.p50TxUs)],
  ['P99 Tx (us)', (r) => us(r.p99TxUs)],
  ['P999 Tx (us)', (r) => us(r.p999TxUs)],
  ['Max Tx (us)', (r) => us(r.maxTxUs)],
]
const WIDTHS = COLUMNS.map(([h]) => Math.max(h.length, 10))

function tableLine(cells: string[]): string {
  return cells.map((c, i) => c.padStart(WIDTHS[i])).join(' | ')
}

/** CSV's columns: the record's own keys, so that CSV and JSON name a figure alike. */
export const CSV_COLUMNS = [
  'op',
  'threads',
  'blockSize',
  'batchSize',
  'ops',
  'bwGbps',
  'avgInstGbps',
  'avgLatUs',
  'avgTxUs',
  'minTxUs',
  'p50TxUs',
  'p99TxUs',
  'p999TxUs',
  'maxTxUs',
  'transport',
  'requested',
  'addressing',
  'failovers',
  'partial',
] as const satisfies ReadonlyArray<keyof CaseRecord>

/** One CSV cell (RFC 4180: quoted when it holds a comma, a quote or a line break). */
export function csvCell(v: unknown): string {
  const s = v === undefined ? '' : String(v)
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s
}

function failovers(n: number): string {
  return `${n} failover${n === 1 ? '' : 's'}`
}

/**
 * Writes results: Ferry's table (a title per op/threads group, printed as the group starts,
 * and a header naming what served the rows under it), Mooncake's layout (its header per
 * group; what served goes to stderr), CSV or JSON lines. Failures and notes go to stderr
 * except with JSON, where every outcome is a line on stdout.
 */
export class Output {
  #header = ''
  #mooncakeThreads = 0
  #csvColumns = false
  constructor(readonly format: OutputFormat) {}

  #json(r: AnyRecord): void {
    process.stdout.write(JSON.stringify(r) + '\n')
  }

  /** A header or summary line: `tebench: KEY: VALUE`, `# KEY: VALUE` in CSV, on stderr for Mooncake's layout. */
  #note(key: string, value: string): void {
    if (this.format === 'csv') process.stdout.write(`# ${key}: ${value}\n`)
    else (this.format === 'mooncake' ? process.stderr : process.stdout).write(`tebench: ${key}: ${value}\n`)
  }

  /** The run's header: what produced it. */
  header(h: HeaderRecord): void {
    if (this.format === 'json') return this.#json(h)
    for (const [k, v] of headerPairs(h)) this.#note(k, v)
  }

  /** The header's engine line (`Engine.spread()`): this process's, or --local's target's. */
  spread(r: SpreadRecord): void {
    if (this.format === 'json') return this.#json(r)
    this.#note(`${r.role} engine`, spreadText(r))
  }

  /** A group of cases (one op, one thread count) starts. */
  groupStart(op: string, threads: number, requested: string, addressing: string): void {
    this.#header = ''
    if (this.format === 'json' || this.format === 'csv') return
    if (this.format === 'mooncake') {
      // Mooncake prints its header once per thread count, also when mix alternates ops.
      if (this.#mooncakeThreads !== threads) process.stdout.write(benchMooncakeHeader() + '\n')
      this.#mooncakeThreads = threads
      return
    }
    const title = `${op.toUpperCase()}, ${threads} thread${threads === 1 ? '' : 's'}, requested transport ${requested}, addressing ${addressing}`
    process.stdout.write(`\n${title}\n`)
  }

  /** A case's row; `native` is the same in the binding's form, `label` what served it. */
  row(r: CaseRecord, native: BenchRow, label: string): void {
    if (this.format === 'json') return this.#json(r)
    if (this.format === 'csv') {
      if (!this.#csvColumns) process.stdout.write(CSV_COLUMNS.join(',') + '\n')
      this.#csvColumns = true
      process.stdout.write(CSV_COLUMNS.map((c) => csvCell(c === 'partial' ? Boolean(r.partial) : r[c])).join(',') + '\n')
      return
    }
    const served = `transport ${label}, ${failovers(r.failovers)}`
    if (this.format === 'mooncake') {
      process.stdout.write(benchMooncakeLine(native) + '\n')
      process.stderr.write(`tebench: ${r.op} ${r.blockSize} B × ${r.batchSize}, ${r.threads} thread(s): ${served}\n`)
      return
    }
    if (served !== this.#header) {
      this.#header = served
      process.stdout.write(`${served}\n${tableLine(COLUMNS.map(([h]) => h))}\n`)
      process.stdout.write(WIDTHS.map((w) => '-'.repeat(w)).join('-+-') + '\n')
    }
    process.stdout.write(tableLine(COLUMNS.map(([, f]) => f(r))) + (r.partial ? '  (partial)' : '') + '\n')
  }

  /** The run's last line: what it measured in all. */
  summary(s: SummaryRecord): void {
    if (this.format === 'json') return this.#json(s)
    const text = summaryText(s)
    const at = text.indexOf(': ')
    this.#note(text.slice(0, at), text.slice(at + 2))
  }

  failed(f: FailedRecord): void {
    if (this.format === 'json') return this.#json(f)
    const code = f.code ? ` (${f.code})` : ''
    process.stderr.write(`tebench: ${f.status}${code} over ${f.transport} to ${f.peer} — ${f.request}: ${f.reason}\n`)
  }

  injected(r: InjectRecord): void {
    if (this.format === 'json') return this.#json(r)
    const ms = (v: number | null) => (v === null ? 'never' : `${v} ms`)
    process.stderr.write(
      `tebench: --inject: ${r.signal} to the target (pid ${r.targetPid}) ${r.afterMs} ms into the first measured case; ` +
        `first FAILED after ${ms(r.firstFailedMs)}, last request ended after ${ms(r.lastTerminalMs)}\n`,
    )
  }

  notifications(r: NotifyRecord): void {
    if (this.format === 'json') return this.#json(r)
    const text =
      r.role === 'initiator'
        ? `${r.count} sent (${r.lost} not delivered), ${Math.round(r.perSecond ?? 0)}/s; ${r.warmup ?? 0} more in the warm-up`
        : `${r.count} received (${r.lost} dropped)`
    if (this.format === 'csv') process.stdout.write(`# notifications: ${text}\n`)
    else process.stdout.write(`tebench: notifications: ${text}\n`)
  }

  disabled(r: DisabledRecord): void {
    if (this.format === 'json') return this.#json(r)
    process.stderr.write(`tebench: transport ${r.transport} disabled: ${r.reason}\n`)
  }

  usage(message: string): void {
    if (this.format === 'json') return this.#json({ record: 'usage', code: 'ERR_USAGE', error: message })
    process.stderr.write(`tebench: ${message} (see --help)\n`)
  }
}
