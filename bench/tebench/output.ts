/**
 * What tebench prints: its records (data first; with --format=json each is one line on
 * stdout, tagged by `record`), the writer of Ferry's table, Mooncake's layout or JSON, and
 * the progress line on stderr.
 */
import { benchMooncakeHeader, benchMooncakeLine, type BenchRow, type EngineSpread, type TransportShare } from '../../index'
import type { Injection } from './fault'

/** How results are printed: Ferry's table, Mooncake's layout or JSON lines. */
export type OutputFormat = 'table' | 'mooncake' | 'json'

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
  served: TransportShare[]
  failovers: number
  partial?: boolean
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
  /** Initiator: sent during the case (warm-up included); target: received in all. */
  count: number
  /** Initiator: whose delivery failed; target: dropped because its queue was full. */
  lost: number
  /** Initiator: sent per second of the case's measured time; null for the target. */
  perSecond: number | null
}

/** The run header: what the engine spreads its work over, as it reports it (`Engine.spread()`). */
export interface SpreadRecord extends EngineSpread {
  record: 'engine'
  role: 'initiator' | 'target'
}

export type AnyRecord = CaseRecord | FailedRecord | InjectRecord | DisabledRecord | UsageRecord | NotifyRecord | SpreadRecord

/** The run header's words: `engine: 2 I/O threads, tcp 4 lanes per peer, shm 1 copy thread`. */
export function spreadLine(r: SpreadRecord): string {
  const n = (v: number, one: string, many = `${one}s`) => `${v} ${v === 1 ? one : many}`
  const parts = [n(r.ioThreads, 'I/O thread')]
  if (r.tcpLanes !== null) parts.push(`tcp ${n(r.tcpLanes, 'lane')} per peer`)
  if (r.shmCopyThreads !== null) parts.push(`shm ${n(r.shmCopyThreads, 'copy thread')}`)
  return `${r.role} engine: ${parts.join(', ')}`
}

const COLUMNS: Array<[string, (r: CaseRecord) => string]> = [
  ['BlkSize (B)', (r) => String(r.blockSize)],
  ['Batch', (r) => String(r.batchSize)],
  ['BW (GB/S)', (r) => r.bwGbps.toFixed(2)],
  ['Avg Inst GB/s', (r) => r.avgInstGbps.toFixed(2)],
  ['Avg Lat (us)', (r) => r.avgLatUs.toFixed(1)],
  ['Avg Tx (us)', (r) => r.avgTxUs.toFixed(1)],
  ['P99 Tx (us)', (r) => r.p99TxUs.toFixed(1)],
  ['P999 Tx (us)', (r) => r.p999TxUs.toFixed(1)],
]
const WIDTHS = COLUMNS.map(([h]) => Math.max(h.length, 10))

function tableLine(cells: string[]): string {
  return cells.map((c, i) => c.padStart(WIDTHS[i])).join(' | ')
}

function failovers(n: number): string {
  return `${n} failover${n === 1 ? '' : 's'}`
}

/**
 * Writes results: Ferry's table (a title per op/threads group, printed as the group starts,
 * and a header naming what served the rows under it), Mooncake's layout (its header per
 * group; what served goes to stderr) or JSON lines. Failures and notes go to stderr except
 * with JSON, where every outcome is a line on stdout.
 */
export class Output {
  #header = ''
  #mooncakeThreads = 0
  constructor(readonly format: OutputFormat) {}

  #json(r: AnyRecord): void {
    process.stdout.write(JSON.stringify(r) + '\n')
  }

  /** A group of cases (one op, one thread count) starts. */
  groupStart(op: string, threads: number, requested: string, addressing: string): void {
    this.#header = ''
    if (this.format === 'json') return
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
        ? `notifications: ${r.count} sent (${r.lost} not delivered), ${Math.round(r.perSecond ?? 0)}/s`
        : `notifications: ${r.count} received (${r.lost} dropped)`
    process.stdout.write(`tebench: ${text}
`)
  }

  /** The run header, once the engine started (Mooncake's layout: on stderr, its stdout kept as Mooncake prints it). */
  spread(r: SpreadRecord): void {
    if (this.format === 'json') return this.#json(r)
    const line = `tebench: ${spreadLine(r)}\n`
    if (this.format === 'mooncake') process.stderr.write(line)
    else process.stdout.write(line)
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


/** What runs now, on stderr, and only when stderr is a terminal. */
export const progress = {
  tty: Boolean(process.stderr.isTTY),
  show(text: string): void {
    if (this.tty) process.stderr.write(`\r\x1b[K${text}`)
  },
  clear(): void {
    if (this.tty) process.stderr.write('\r\x1b[K')
  },
}
