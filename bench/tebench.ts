#!/usr/bin/env node
/**
 * tebench: Mooncake TENT's transfer benchmark, on Ferry.
 *
 * Layers: OPTIONS (one schema with defaults, shared by parsing and --help) → parseConfig
 * (flags → typed Config, or a UsageError) → runTarget / runInitiator / runLocal (call the
 * Ferry API, produce CaseRecords) → formatting (table or JSON lines on stdout; progress on
 * stderr only when it is a TTY) → main (sets the exit code in one place).
 *
 * Exit codes: 0 success, 1 a transfer failed (printed with status, transport and peer),
 * 2 bad usage, 130 interrupted by Ctrl-C (partial results printed).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import * as readline from 'node:readline'
import { parseArgs } from 'node:util'
import { Engine, type Bench, type BenchFailure, type BenchRow, type Region, type Segment, type TransportName } from '../index'

// ---------------------------------------------------------------------------------------
// Options: declared once.

interface OptionSpec {
  type: 'string' | 'boolean'
  default: string | boolean
  help: string
}

const GiB = 1 << 30
const MiB = 1 << 20

export const OPTIONS = {
  target_seg_name: {
    type: 'string',
    default: '',
    help: 'target segment(s), comma list: worker i works against target i % count; empty = target mode',
  },
  seg_type: { type: 'string', default: 'DRAM', help: 'memory kind (DRAM only)' },
  op_type: { type: 'string', default: 'read', help: 'read, write or mix (a write case, then a read case)' },
  check_consistency: { type: 'boolean', default: false, help: 'with mix: write a pattern, read it back, verify' },
  total_buffer_size: { type: 'string', default: String(GiB), help: 'buffer bytes per side (K/M/G suffixes allowed)' },
  start_block_size: { type: 'string', default: '4096', help: 'first block size in bytes (doubling sweep)' },
  max_block_size: { type: 'string', default: String(64 * MiB), help: 'last block size in bytes' },
  start_batch_size: { type: 'string', default: '1', help: 'first batch size (doubling sweep)' },
  max_batch_size: { type: 'string', default: '1', help: 'last batch size' },
  start_num_threads: { type: 'string', default: '1', help: 'first thread count (doubling sweep)' },
  max_num_threads: { type: 'string', default: '1', help: 'last thread count' },
  duration: { type: 'string', default: '5', help: 'measured seconds per case, after a 1 s warm-up' },
  request_interval_us: { type: 'string', default: '0', help: 'per-thread pacing before each batch (µs)' },
  metadata_type: {
    type: 'string',
    default: 'p2p',
    help: 'p2p (segment names are host:port) or etcd (names are looked up in --metadata_url_list)',
  },
  metadata_url_list: { type: 'string', default: '', help: 'with etcd: the etcd servers, http://host:port[,host:port]' },
  local_server_name: {
    type: 'string',
    default: '',
    help: 'with etcd: the name a target registers under (Mooncake\'s flag); empty = its host:port',
  },
  rpc_server_port: { type: 'string', default: '0', help: 'target listen port on 127.0.0.1; 0 = any' },
  xport_type: { type: 'string', default: '', help: 'pin one transport: rdma, shm, tcp (empty = engine default)' },
  peer_timeout_ms: { type: 'string', default: '3000', help: 'Ferry: a silent peer is declared lost (FAILED) after this many ms' },
  local: { type: 'boolean', default: false, help: 'start a target child on 127.0.0.1 and bench against it' },
  json: { type: 'boolean', default: false, help: 'one JSON object per case per line instead of a table' },
  help: { type: 'boolean', default: false, help: 'show this help' },
} as const satisfies Record<string, OptionSpec>

type OptionName = keyof typeof OPTIONS

export class UsageError extends Error {}

export interface Config {
  targetSegNames: string[]
  segType: 'DRAM'
  opType: 'read' | 'write' | 'mix'
  checkConsistency: boolean
  totalBufferSize: number
  startBlockSize: number
  maxBlockSize: number
  startBatchSize: number
  maxBatchSize: number
  startNumThreads: number
  maxNumThreads: number
  durationS: number
  requestIntervalUs: number
  metadataType: 'p2p' | 'etcd'
  metadataUrlList: string
  localServerName: string
  rpcServerPort: number
  xportType?: TransportName
  peerTimeoutMs: number
  local: boolean
  json: boolean
  help: boolean
}

export function helpText(): string {
  const lines = [
    'Usage: tebench [--flag=value ...]',
    '',
    'Without --target_seg_name (and without --local) runs as a target: allocates a buffer,',
    'prints the command line initiators should run, and waits for Ctrl-C.',
    '',
    'Flags:',
  ]
  for (const [name, spec] of Object.entries(OPTIONS) as Array<[OptionName, OptionSpec]>) {
    const dflt = spec.type === 'boolean' ? (spec.default ? 'true' : 'false') : JSON.stringify(spec.default)
    lines.push(`  --${name.padEnd(22)} ${spec.help} (default ${dflt})`)
  }
  lines.push(
    '',
    'Columns: BlkSize (B) | Batch | BW (GB/S) | Avg Inst GB/s | Avg Lat (us) | Avg Tx (us) | P99 Tx (us) | P999 Tx (us)',
    'Exit codes: 0 success, 1 transfer failure, 2 bad usage, 130 interrupted (partial results printed).',
  )
  return lines.join('\n') + '\n'
}

function parseSize(name: string, v: string, min = 1): number {
  const m = /^(\d+)([kKmMgG]?)[iI]?[bB]?$/.exec(v.trim())
  if (!m) throw new UsageError(`--${name}: expected a whole number of bytes (K/M/G suffix allowed), got "${v}"`)
  const mult = { '': 1, k: 1024, m: MiB, g: GiB }[m[2].toLowerCase() as '' | 'k' | 'm' | 'g']
  const n = Number(m[1]) * mult
  if (!Number.isSafeInteger(n) || n < min) throw new UsageError(`--${name}: must be an integer >= ${min}, got "${v}"`)
  return n
}

function parseInteger(name: string, v: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!/^\d+$/.test(v.trim())) throw new UsageError(`--${name}: expected a whole number, got "${v}"`)
  const n = Number(v)
  if (n < min || n > max) throw new UsageError(`--${name}: must be between ${min} and ${max}, got ${v}`)
  return n
}

/** Flags → Config. Throws UsageError on bad usage. */
export function parseConfig(argv: string[]): Config {
  let values: Record<string, string | boolean | undefined>
  try {
    const options = Object.fromEntries(
      Object.entries(OPTIONS).map(([k, s]) => [k, { type: s.type, default: s.default }]),
    ) as Record<string, { type: 'string' | 'boolean'; default: string | boolean }>
    values = parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as Record<
      string,
      string | boolean | undefined
    >
  } catch (err) {
    throw new UsageError((err as Error).message)
  }
  const s = (k: OptionName) => String(values[k] ?? OPTIONS[k].default)
  const b = (k: OptionName) => Boolean(values[k] ?? OPTIONS[k].default)

  const segType = s('seg_type')
  if (segType.toUpperCase() !== 'DRAM') throw new UsageError(`--seg_type=${segType} is not supported (DRAM only)`)
  const opType = s('op_type')
  if (opType !== 'read' && opType !== 'write' && opType !== 'mix') {
    throw new UsageError(`--op_type must be read, write or mix, got "${opType}"`)
  }
  const metadataType = s('metadata_type')
  if (metadataType !== 'p2p' && metadataType !== 'etcd') {
    throw new UsageError(`--metadata_type must be p2p or etcd, got "${metadataType}"`)
  }
  const urls = s('metadata_url_list').trim()
  if (metadataType === 'etcd') {
    if (urls === '') throw new UsageError('--metadata_type=etcd needs --metadata_url_list=http://host:port[,host:port]')
    for (const u of urls.split(',')) {
      if (!/^(http:\/\/)?[A-Za-z0-9.\-_[\]:]+:\d{1,5}\/?$/.test(u.trim())) {
        throw new UsageError(`--metadata_url_list: expected http://host:port entries, got "${u}"`)
      }
    }
  } else if (s('local_server_name') !== '') {
    throw new UsageError('--local_server_name needs --metadata_type=etcd')
  }
  const xport = s('xport_type')
  if (xport !== '' && xport !== 'rdma' && xport !== 'shm' && xport !== 'tcp') {
    throw new UsageError(`--xport_type must be rdma, shm or tcp, got "${xport}"`)
  }
  const duration = Number(s('duration'))
  if (!Number.isFinite(duration) || duration <= 0 || s('duration').trim() === '') {
    throw new UsageError(`--duration must be a positive number of seconds, got "${s('duration')}"`)
  }
  const cfg: Config = {
    targetSegNames: s('target_seg_name')
      .split(',')
      .map((x) => x.trim())
      .filter((x) => x !== ''),
    segType: 'DRAM',
    opType,
    checkConsistency: b('check_consistency'),
    totalBufferSize: parseSize('total_buffer_size', s('total_buffer_size')),
    startBlockSize: parseSize('start_block_size', s('start_block_size')),
    maxBlockSize: parseSize('max_block_size', s('max_block_size')),
    startBatchSize: parseInteger('start_batch_size', s('start_batch_size'), 1),
    maxBatchSize: parseInteger('max_batch_size', s('max_batch_size'), 1),
    startNumThreads: parseInteger('start_num_threads', s('start_num_threads'), 1, 1024),
    maxNumThreads: parseInteger('max_num_threads', s('max_num_threads'), 1, 1024),
    durationS: duration,
    requestIntervalUs: parseInteger('request_interval_us', s('request_interval_us'), 0),
    metadataType,
    metadataUrlList: urls,
    localServerName: s('local_server_name'),
    rpcServerPort: parseInteger('rpc_server_port', s('rpc_server_port'), 0, 65535),
    xportType: xport === '' ? undefined : (xport as TransportName),
    peerTimeoutMs: parseInteger('peer_timeout_ms', s('peer_timeout_ms'), 10, 3_600_000),
    local: b('local'),
    json: b('json'),
    help: b('help'),
  }
  if (cfg.startBlockSize > cfg.maxBlockSize) throw new UsageError('--start_block_size is larger than --max_block_size')
  if (cfg.startBatchSize > cfg.maxBatchSize) throw new UsageError('--start_batch_size is larger than --max_batch_size')
  if (cfg.startNumThreads > cfg.maxNumThreads) throw new UsageError('--start_num_threads is larger than --max_num_threads')
  if (cfg.checkConsistency && cfg.opType !== 'mix') throw new UsageError('--check_consistency needs --op_type=mix')
  if (cfg.local && cfg.targetSegNames.length > 0) throw new UsageError('--local and --target_seg_name exclude each other')
  if (cfg.local && cfg.metadataType === 'etcd') throw new UsageError('--local uses p2p; drop --metadata_type=etcd')
  return cfg
}

// ---------------------------------------------------------------------------------------
// Results: data first.

export interface CaseRecord {
  op: 'read' | 'write'
  transport: string
  threads: number
  blockSize: number
  batchSize: number
  ops: number
  bwGbps: number
  avgInstGbps: number
  avgLatUs: number
  avgTxUs: number
  p99TxUs: number
  p999TxUs: number
  partial?: boolean
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

/** Writes results on stdout: a table (one header per op/threads group) or JSON lines. */
class Output {
  #group = ''
  constructor(private readonly json: boolean) {}

  row(r: CaseRecord): void {
    if (this.json) {
      process.stdout.write(JSON.stringify(r) + '\n')
      return
    }
    this.header(r.op, r.threads, r.transport)
    process.stdout.write(tableLine(COLUMNS.map(([, f]) => f(r))) + (r.partial ? '  (partial)' : '') + '\n')
  }

  header(op: string, threads: number, transport: string): void {
    if (this.json) return
    const group = `${op}/${threads}/${transport}`
    if (group === this.#group) return
    this.#group = group
    const title = `${op.toUpperCase()}, ${threads} thread${threads === 1 ? '' : 's'}, transport ${transport}`
    process.stdout.write(`\n${title}\n${tableLine(COLUMNS.map(([h]) => h))}\n`)
    process.stdout.write(WIDTHS.map((w) => '-'.repeat(w)).join('-+-') + '\n')
  }
}

const progress = {
  tty: Boolean(process.stderr.isTTY),
  show(text: string): void {
    if (this.tty) process.stderr.write(`\r\x1b[K${text}`)
  },
  clear(): void {
    if (this.tty) process.stderr.write('\r\x1b[K')
  },
}

function failureLine(f: BenchFailure): string {
  const code = f.code ? ` (${f.code})` : ''
  return `tebench: ${f.statusName}${code} over ${f.transport} to ${f.peer} — ${f.request}: ${f.reason}`
}

// ---------------------------------------------------------------------------------------
// Interrupts: the first Ctrl-C stops the running bench; a second one forces.

const interrupt = {
  count: 0,
  signal: '' as '' | 'SIGINT' | 'SIGTERM',
  onStop: new Set<() => void>(),
  onForce: new Set<() => void>(),
  install(): void {
    const handler = (sig: 'SIGINT' | 'SIGTERM') => {
      this.count++
      if (this.count === 1) {
        this.signal = sig
        for (const f of this.onStop) f()
      } else {
        for (const f of this.onForce) f()
        process.exit(130) // second Ctrl-C: force (the only process.exit)
      }
    }
    process.on('SIGINT', () => handler('SIGINT'))
    process.on('SIGTERM', () => handler('SIGTERM'))
  },
  get stopped(): boolean {
    return this.count > 0
  },
}

// ---------------------------------------------------------------------------------------
// Target mode.

/** Engine options of the metadata flags. */
function metadataOptions(cfg: Config): { metadata?: `etcd://${string}`; segmentName?: string } {
  if (cfg.metadataType !== 'etcd') return {}
  return { metadata: `etcd://${cfg.metadataUrlList}`, segmentName: cfg.localServerName || undefined }
}

function initiatorCommand(cfg: Config, segment: string): string {
  const parts = ['npx tebench', `--target_seg_name=${segment}`]
  if (cfg.metadataType === 'etcd') parts.push('--metadata_type=etcd', `--metadata_url_list=${cfg.metadataUrlList}`)
  if (cfg.totalBufferSize !== GiB) parts.push(`--total_buffer_size=${cfg.totalBufferSize}`)
  if (cfg.xportType) parts.push(`--xport_type=${cfg.xportType}`)
  return parts.join(' ')
}

async function runTarget(cfg: Config): Promise<number> {
  const engine = await Engine.create({ listen: `127.0.0.1:${cfg.rpcServerPort}`, ...metadataOptions(cfg) })
  try {
    const region = engine.allocate(cfg.totalBufferSize)
    void region
    process.stdout.write(initiatorCommand(cfg, engine.segmentName) + '\n')
    progress.show(`tebench: target ${engine.segmentName} ready (${cfg.totalBufferSize} B); Ctrl-C to stop`)
    await new Promise<void>((resolve) => {
      const keepAlive = setInterval(() => {}, 1 << 30)
      const done = () => {
        clearInterval(keepAlive)
        resolve()
      }
      interrupt.onStop.add(done)
      // Started by --local: leave when the parent goes away.
      if (process.env.FERRY_TEBENCH_CHILD === '1') {
        process.stdin.on('end', done)
        process.stdin.on('error', done)
        process.stdin.resume()
      }
    })
    progress.clear()
    return 0
  } finally {
    await engine.close()
    if (process.env.FERRY_TEBENCH_CHILD === '1') process.stdin.pause()
  }
}

// ---------------------------------------------------------------------------------------
// Initiator mode.

function doubling(start: number, max: number): number[] {
  const out: number[] = []
  for (let v = start; v <= max; v *= 2) out.push(v)
  return out
}

const PATTERN = Buffer.from(Array.from({ length: 255 }, (_, i) => i + 1)) // never 0, period 255

/**
 * Checks the read-back region against the pattern: every block of every stripe is either
 * untouched (all zero: not reached in the measured time) or equal to the pattern.
 * Returns an error message, or undefined when consistent.
 */
function verify(expect: Region, got: Region, threads: number, stripeLen: number, block: number): string | undefined {
  const zero = Buffer.alloc(block)
  // Compared through windows of whole blocks: a region over 4 GiB has no single Buffer.
  const windowBlocks = Math.max(1, Math.floor((256 << 20) / block))
  let checked = 0
  for (let t = 0; t < threads; t++) {
    const end = (t + 1) * stripeLen
    for (let base = t * stripeLen; base + block <= end; base += windowBlocks * block) {
      const len = Math.min(windowBlocks, Math.floor((end - base) / block)) * block
      const g = got.view(base, len)
      const e = expect.view(base, len)
      for (let off = 0; off + block <= len; off += block) {
        const gb = g.subarray(off, off + block)
        if (gb.equals(zero)) continue
        if (!gb.equals(e.subarray(off, off + block))) {
          let i = 0
          while (gb[i] === e[off + i]) i++
          return `mismatch at offset ${base + off + i}: read ${gb[i]}, wrote ${e[off + i]}`
        }
        checked++
      }
    }
  }
  return checked === 0 ? 'nothing was read back' : undefined
}

/**
 * Engine transports for `--xport_type`: only that transport (no fallback), else the
 * engine's default set.
 */
function engineTransports(xport: TransportName | undefined): TransportName[] | undefined {
  return xport ? [xport] : undefined
}

interface InitiatorResult {
  code: number
}

async function runInitiator(cfg: Config, out: Output): Promise<InitiatorResult> {
  const engine = await Engine.create({
    transports: engineTransports(cfg.xportType),
    peerTimeoutMs: cfg.peerTimeoutMs,
    ...metadataOptions(cfg),
  })
  let bench: Bench | undefined
  const stopBench = () => bench?.stop()
  interrupt.onStop.add(stopBench)
  try {
    // Every target of the comma list; worker i works against target i % targets.
    const targets: Array<{ remote: Segment; remoteBuffer: number }> = []
    for (const segName of cfg.targetSegNames) {
      let segment: Segment
      try {
        segment = await engine.openSegment(segName)
      } catch (err) {
        const e = err as { code?: string; message?: string }
        process.stderr.write(`tebench: cannot open segment ${segName}: ${e.code ?? 'error'}: ${e.message}\n`)
        return { code: 1 }
      }
      const remote = segment.buffers[0]
      if (!remote) {
        process.stderr.write(`tebench: segment ${segName} exposes no buffer\n`)
        return { code: 1 }
      }
      if (remote.length < cfg.totalBufferSize) {
        process.stderr.write(
          `tebench: segment ${segName} exposes ${remote.length} B, less than --total_buffer_size=${cfg.totalBufferSize}\n`,
        )
        return { code: 2 }
      }
      targets.push({ remote: segment, remoteBuffer: remote.id })
    }
    const [first, ...extraTargets] = targets
    const segName = cfg.targetSegNames.join(',')
    const segment = first.remote
    const remote = { id: first.remoteBuffer }
    const local = engine.allocate(cfg.totalBufferSize)
    let readBack: Region | undefined
    if (cfg.checkConsistency) {
      local.fill(PATTERN)
      readBack = engine.allocate(cfg.totalBufferSize)
    }
    const ops: Array<'read' | 'write'> = cfg.opType === 'mix' ? ['write', 'read'] : [cfg.opType]
    const transportLabel = cfg.xportType ?? 'auto'

    for (const threads of doubling(cfg.startNumThreads, cfg.maxNumThreads)) {
      if (interrupt.stopped) break
      bench = engine.bench(threads)
      try {
        for (const block of doubling(cfg.startBlockSize, cfg.maxBlockSize)) {
          for (const batch of doubling(cfg.startBatchSize, cfg.maxBatchSize)) {
            if (block * batch > cfg.totalBufferSize / threads) continue
            const stripeLen = Math.floor(cfg.totalBufferSize / threads / block) * block
            for (const op of ops) {
              if (interrupt.stopped) return { code: 130 }
              const target = op === 'read' && readBack ? readBack : local
              if (op === 'read' && readBack) readBack.fill(0)
              out.header(op, threads, transportLabel)
              progress.show(`tebench: ${op} ${block} B × ${batch}, ${threads} thread(s) over ${transportLabel}…`)
              const result = await bench.runCase({
                opcode: op,
                blockSize: block,
                batchSize: batch,
                local: target,
                remote: segment,
                remoteBuffer: remote.id,
                extraTargets,
                stripeBase: 0,
                stripeLen,
                transport: cfg.xportType,
                durationMs: Math.round(cfg.durationS * 1000),
                warmupMs: 1000,
                requestIntervalUs: cfg.requestIntervalUs,
              })
              progress.clear()
              if (result.outcome === 'failed') {
                const f = result.failure
                process.stderr.write(
                  (f ? failureLine(f) : `tebench: FAILED over ${transportLabel} to ${segName} — ${op} ${block} B × ${batch}`) +
                    '\n',
                )
                return { code: 1 }
              }
              if (result.row) out.row(toRecord(op, transportLabel, result.row, result.outcome === 'stopped'))
              if (result.outcome === 'stopped' || interrupt.stopped) return { code: 130 }
              if (op === 'read' && readBack) {
                const problem = verify(local, readBack, threads, stripeLen, block)
                if (problem) {
                  process.stderr.write(
                    `tebench: consistency check FAILED over ${transportLabel} to ${segName} — ${block} B × ${batch}, ${threads} thread(s): ${problem}\n`,
                  )
                  return { code: 1 }
                }
              }
            }
          }
        }
      } finally {
        bench.stop()
        bench = undefined
      }
    }
    return { code: 0 }
  } finally {
    interrupt.onStop.delete(stopBench)
    progress.clear()
    await engine.close()
  }
}

function toRecord(op: 'read' | 'write', transport: string, row: BenchRow, partial: boolean): CaseRecord {
  const r: CaseRecord = {
    op,
    transport,
    threads: row.threads,
    blockSize: row.blockSize,
    batchSize: row.batchSize,
    ops: row.ops,
    bwGbps: row.bwGbps,
    avgInstGbps: row.avgInstGbps,
    avgLatUs: row.avgLatUs,
    avgTxUs: row.avgTxUs,
    p99TxUs: row.p99TxUs,
    p999TxUs: row.p999TxUs,
  }
  if (partial) r.partial = true
  return r
}

// ---------------------------------------------------------------------------------------
// --local: a target child of this same script.

interface LocalTarget {
  segment: string
  stop(): Promise<void>
  killNow(): void
}

function startLocalTarget(cfg: Config, timeoutMs = 30_000): Promise<LocalTarget> {
  const args = [...process.execArgv, __filename, '--rpc_server_port=0', `--total_buffer_size=${cfg.totalBufferSize}`]
  const child: ChildProcess = spawn(process.execPath, args, {
    env: { ...process.env, FERRY_TEBENCH_CHILD: '1' },
    stdio: ['pipe', 'pipe', 'pipe'],
    detached: true, // own process group: a terminal Ctrl-C reaches only the initiator
  })
  let stderr = ''
  child.stderr?.on('data', (d) => (stderr += d))
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const alive = () => child.exitCode === null && child.signalCode === null
  const killNow = () => {
    if (alive() && child.pid) {
      try {
        process.kill(child.pid, 'SIGKILL')
      } catch {
        // gone
      }
    }
  }
  const stop = async () => {
    if (!alive()) return
    child.kill('SIGTERM')
    let timer: NodeJS.Timeout | undefined
    await Promise.race([exited, new Promise<void>((r) => (timer = setTimeout(r, 3000)))])
    clearTimeout(timer)
    if (alive()) {
      killNow()
      await exited
    }
  }
  interrupt.onForce.add(killNow)
  return new Promise((resolve, reject) => {
    const lines = readline.createInterface({ input: child.stdout! })
    const timer = setTimeout(() => {
      void stop().then(() => reject(new Error(`target child did not start in ${timeoutMs} ms: ${stderr.trim()}`)))
    }, timeoutMs)
    child.once('exit', (code, sig) => {
      clearTimeout(timer)
      reject(new Error(`target child exited early (${sig ?? code}): ${stderr.trim()}`))
    })
    lines.on('line', (line) => {
      const m = /--target_seg_name=(\S+)/.exec(line)
      if (!m) return
      clearTimeout(timer)
      resolve({ segment: m[1], stop, killNow })
    })
  })
}

// ---------------------------------------------------------------------------------------
// main: the exit code is set here, in one place.

async function main(argv: string[]): Promise<number> {
  let cfg: Config
  try {
    cfg = parseConfig(argv)
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`tebench: ${err.message} (see --help)\n`)
      return 2
    }
    throw err
  }
  if (cfg.help) {
    process.stdout.write(helpText())
    return 0
  }
  interrupt.install()
  const out = new Output(cfg.json)

  if (!cfg.local && cfg.targetSegNames.length === 0) return runTarget(cfg)

  let child: LocalTarget | undefined
  try {
    if (cfg.local) {
      child = await startLocalTarget(cfg)
      cfg = { ...cfg, targetSegNames: [child.segment] }
      if (interrupt.stopped) return 130
    }
    const { code } = await runInitiator(cfg, out)
    return code === 130 && interrupt.signal === 'SIGTERM' ? 143 : code
  } finally {
    await child?.stop()
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code
    },
    (err: unknown) => {
      const e = err as { code?: string; message?: string; stack?: string }
      process.stderr.write(`tebench: ${e?.code ? `${e.code}: ` : ''}${e?.message ?? String(err)}\n`)
      process.exitCode = 1
    },
  )
}
