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
import { readFileSync } from 'node:fs'
import * as readline from 'node:readline'
import {
  Engine,
  type Bench,
  type BenchFailure,
  type BenchResult,
  type BenchRow,
  type EngineOptions,
  type Region,
  type Segment,
  type TransportName,
} from '../index'
import { helpLines, parseFlags, refusedLines, SHARED, UsageError, type Schema, type Values } from './options'
import { Output, type CaseRecord, type FailedRecord, type NotifyRecord } from './tebench-output'

export type { CaseRecord, DisabledRecord, FailedRecord, InjectRecord, NotifyRecord, UsageRecord } from './tebench-output'

// ---------------------------------------------------------------------------------------
// Options: declared once, in the schema format of bench/options.ts.

const GiB = 1 << 30
const MiB = 1 << 20

const GPU = 'GPU memory is not supported (DRAM only)'
const DEADLINES = 'per-transfer deadlines are not supported (a silent peer fails work after --peer_timeout_ms)'

export const OPTIONS = {
  target_seg_name: {
    type: 'string',
    default: '',
    metavar: 'SEG[,SEG]',
    help: 'target segment(s), comma list: worker i works against target i % count; empty = target mode',
  },
  seg_name: {
    type: 'string',
    default: '',
    metavar: 'HOST[:PORT]',
    help: 'target: the address peers are told (Mooncake\'s local segment name; in p2p the segment name), for a target behind --listen=0.0.0.0; empty = the listen address',
  },
  listen: {
    type: 'string',
    default: '127.0.0.1',
    metavar: 'ADDR[:PORT]',
    help: 'target: the address to listen on; without a port, --rpc_server_port',
  },
  rpc_server_port: { type: 'integer', default: 0, min: 0, max: 65535, metavar: 'PORT', help: 'target: listen port; 0 = any' },
  seg_type: { type: 'string', default: 'DRAM', choices: ['DRAM'], refusedChoices: { VRAM: GPU }, help: 'memory kind (DRAM only)' },
  op_type: { type: 'string', default: 'read', choices: ['read', 'write', 'mix'], help: 'read, write or mix (a write case, then a read case)' },
  check_consistency: {
    type: 'boolean',
    default: false,
    help: 'verify the data: write a pattern, read it back and compare (read: the target is filled with the pattern first; write: read back after each case)',
  },
  total_buffer_size: { type: 'size', default: GiB, min: 1, help: 'buffer bytes per side (K/M/G suffixes allowed)' },
  start_block_size: { type: 'size', default: 4096, min: 1, help: 'first block size in bytes (doubling sweep)' },
  max_block_size: { type: 'size', default: 64 * MiB, min: 1, help: 'last block size in bytes' },
  start_batch_size: { type: 'integer', default: 1, min: 1, help: 'first batch size (doubling sweep)' },
  max_batch_size: { type: 'integer', default: 1, min: 1, help: 'last batch size' },
  start_num_threads: { type: 'integer', default: 1, min: 1, max: 1024, help: 'first thread count (doubling sweep)' },
  max_num_threads: { type: 'integer', default: 1, min: 1, max: 1024, help: 'last thread count' },
  duration: SHARED.durationS,
  request_interval_us: { type: 'integer', default: 0, min: 0, help: 'per-thread pacing before each batch (µs)' },
  addressing: {
    type: 'string',
    default: 'fixed',
    choices: ['fixed', 'walk'],
    help: "Ferry: fixed (Mooncake's: each thread one stripe of max_block_size × max_batch_size, every batch the same contiguous blocks at its start, cache-resident) or walk (each batch the next blocks, through total_buffer_size / threads: the DRAM-bound figure)",
  },
  metadata_type: {
    type: 'string',
    default: 'p2p',
    choices: ['p2p', 'etcd'],
    refusedChoices: { redis: 'Ferry keeps metadata in etcd or p2p', http: 'Ferry keeps metadata in etcd or p2p' },
    help: 'p2p (segment names are host:port) or etcd (names are looked up in --metadata_url_list)',
  },
  metadata_url_list: {
    type: 'string',
    default: '',
    help: 'with etcd: the etcd servers, http://host:port[,host:port] (https:// for TLS)',
  },
  local_server_name: {
    type: 'string',
    default: '',
    help: 'with etcd: the name a target registers under (Mooncake\'s flag); empty = its host:port',
  },
  etcd_ca_file: { type: 'string', default: '', metavar: 'PATH', help: "with etcd: PEM CA of etcd's certificate (turns on TLS)" },
  etcd_cert_file: { type: 'string', default: '', metavar: 'PATH', help: 'with etcd: PEM client certificate (TLS)' },
  etcd_key_file: { type: 'string', default: '', metavar: 'PATH', help: 'with etcd: PEM key of --etcd_cert_file' },
  etcd_user: { type: 'string', default: '', help: "with etcd: user for etcd's password auth" },
  etcd_password_file: {
    type: 'string',
    default: '',
    metavar: 'PATH',
    help: 'with etcd: file holding the password of --etcd_user (never the password itself)',
  },
  xport_type: {
    type: 'string',
    default: '',
    choices: ['', 'rdma', 'shm', 'tcp'],
    refusedChoices: Object.fromEntries(
      ['mnnvl', 'gds', 'iouring', 'sunrise_link', 'nvlink'].map((x) => [x, 'not a Ferry transport (rdma, shm or tcp)']),
    ),
    help: 'pin one transport: rdma, shm, tcp (empty = engine default, with failover)',
  },
  backend: {
    type: 'string',
    default: 'tent',
    choices: ['tent'],
    refusedChoices: { classic: 'Ferry is one engine, of TENT\'s design; the classic TE backend is not offered' },
    help: 'Mooncake\'s backend choice: tent only',
  },
  peer_timeout_ms: { ...SHARED.peerTimeoutMs, help: `Ferry: ${SHARED.peerTimeoutMs.help}` },
  local: { type: 'boolean', default: false, help: 'start a target child on 127.0.0.1 and bench against it' },
  inject: {
    type: 'string',
    default: '',
    metavar: 'kill|stop[:AFTER_MS]',
    help: 'with --local: SIGKILL or SIGSTOP the target AFTER_MS (default 500) into the first measured case, report the time to the first FAILED and to the last request\'s end, exit 1',
  },
  format: { type: 'string', default: 'table', choices: ['table', 'mooncake', 'json'], help: 'table, mooncake (Mooncake\'s own layout) or json' },
  json: { type: 'boolean', default: false, help: 'the same as --format=json: every outcome as a JSON line on stdout' },
  help: { type: 'boolean', default: false, aliases: ['h'], help: 'show this help' },
  auth_secret_file: {
    type: 'string',
    default: '',
    metavar: 'PATH',
    help: 'both roles: a file holding the cluster secret (at least 32 bytes; one trailing newline is not part of it); needed to listen beyond loopback',
  },
  notifi: {
    type: 'boolean',
    default: false,
    help: 'every submission carries a notification; the initiator reports their rate per case, the target counts them and prints the count at its end',
  },
  // Mooncake's flags that Ferry refuses, by name, rather than ignore.
  local_gpu_id: { type: 'integer', default: 0, refused: GPU },
  target_gpu_id: { type: 'integer', default: 0, refused: GPU },
  target_offset: { type: 'integer', default: 0, refused: 'not supported: stripes start at offset 0 of the target buffer' },
  deadline_us: { type: 'integer', default: 0, refused: DEADLINES },
  deadline_tight_threads: { type: 'integer', default: 0, refused: DEADLINES },
  deadline_bw_arbitration: { type: 'boolean', default: false, refused: DEADLINES },
  tent_transport_hint: { type: 'string', default: 'unspec', refused: 'not supported: pin a transport with --xport_type' },
  tent_intent_type: { type: 'string', default: 'unspec', refused: 'request intents are not supported' },
} as const satisfies Schema

/** Mooncake's flag families that Ferry refuses by prefix. */
const REFUSED_PREFIXES = [
  ['qos_', 'QoS flags are not supported (Ferry has no QoS scheduler)'],
  ['receiver_', 'receiver-credit experiments are not supported'],
] as const

export { UsageError }

export type OutputFormat = 'table' | 'mooncake' | 'json'

export interface Injection {
  signal: 'SIGKILL' | 'SIGSTOP'
  /** ms into the first measured case. */
  afterMs: number
}

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
  /** How workers address their stripe: Mooncake's fixed blocks, or a walk through it. */
  addressing: Addressing
  metadataType: 'p2p' | 'etcd'
  metadataUrlList: string
  localServerName: string
  /** etcd TLS and auth: file paths (never a password), `undefined` when not given. */
  etcd: EtcdAccess
  /** Target: `host:port`. */
  listen: string
  /** Both roles: the file holding the cluster secret; '' = none. */
  authSecretFile: string
  /** --notifi: every submission carries a notification. */
  notifi: boolean
  /** Target: the address peers are told; undefined = the bound address. */
  advertise?: string
  rpcServerPort: number
  xportType?: TransportName
  peerTimeoutMs: number
  local: boolean
  inject?: Injection
  format: OutputFormat
  help: boolean
}

export type Addressing = 'fixed' | 'walk'

/**
 * Bytes of each thread's stripe. `walk`: the buffer split between the threads. `fixed`:
 * Mooncake's stride, max_block_size × max_batch_size (thread t at t × stride), or the
 * split when that stride does not fit `threads` times; always whole blocks.
 */
export function stripeLength(cfg: Pick<Config, 'addressing' | 'totalBufferSize' | 'maxBlockSize' | 'maxBatchSize'>, threads: number, block: number): number {
  const split = Math.floor(cfg.totalBufferSize / threads / block) * block
  if (cfg.addressing === 'walk') return split
  return Math.min(split, Math.floor((cfg.maxBlockSize * cfg.maxBatchSize) / block) * block)
}

export function helpText(): string {
  return [
    'Usage: tebench [--flag=value ...]   (gflags forms: --flag value, --flag=true|false, --noflag)',
    '',
    'Without --target_seg_name (and without --local) runs as a target: allocates a buffer,',
    'prints the command line initiators should run, and waits for Ctrl-C.',
    '',
    'Flags:',
    ...helpLines(OPTIONS),
    '',
    'Mooncake flags refused (never silently ignored):',
    ...refusedLines(OPTIONS, { refusedPrefixes: REFUSED_PREFIXES }),
    '',
    'Columns: BlkSize (B) | Batch | BW (GB/S) | Avg Inst GB/s | Avg Lat (us) | Avg Tx (us) | P99 Tx (us) | P999 Tx (us)',
    'Exit codes: 0 success, 1 transfer failure, 2 bad usage, 130 interrupted (partial results printed).',
  ].join('\n') + '\n'
}

/** `host`, `host:port` or `[v6]:port` → `host:port`, the port defaulting to `port`. */
function listenAddress(text: string, port: number): string {
  const t = text.trim()
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-_]+)(?::(\d{1,5}))?$/.exec(t)
  if (!m) throw new UsageError(`--listen: expected ADDR[:PORT], got "${text}"`)
  const p = m[2] === undefined ? port : Number(m[2])
  if (p > 65535) throw new UsageError(`--listen: port ${p} is out of range`)
  return `${m[1]}:${p}`
}

function parseInjection(text: string, durationS: number): Injection | undefined {
  if (text === '') return undefined
  const m = /^(kill|stop)(?::(\d+))?$/.exec(text.trim())
  if (!m) throw new UsageError(`--inject: expected kill or stop, optionally :AFTER_MS, got "${text}"`)
  const afterMs = m[2] === undefined ? 500 : Number(m[2])
  if (afterMs >= durationS * 1000) {
    throw new UsageError(`--inject: ${afterMs} ms is past the measured case (--duration=${durationS})`)
  }
  return { signal: m[1] === 'kill' ? 'SIGKILL' : 'SIGSTOP', afterMs }
}

export interface EtcdAccess {
  caFile?: string
  certFile?: string
  keyFile?: string
  user?: string
  passwordFile?: string
}

/** The etcd TLS/auth flags; each needs etcd, a certificate its key, a user a password file. */
function etcdAccess(v: Values<typeof OPTIONS>): EtcdAccess {
  const a: EtcdAccess = {
    caFile: v.etcd_ca_file || undefined,
    certFile: v.etcd_cert_file || undefined,
    keyFile: v.etcd_key_file || undefined,
    user: v.etcd_user || undefined,
    passwordFile: v.etcd_password_file || undefined,
  }
  const set = Object.values(a).some((x) => x !== undefined)
  if (set && v.metadata_type !== 'etcd') throw new UsageError('--etcd_* flags need --metadata_type=etcd')
  if ((a.certFile === undefined) !== (a.keyFile === undefined)) {
    throw new UsageError('--etcd_cert_file and --etcd_key_file go together')
  }
  if ((a.user === undefined) !== (a.passwordFile === undefined)) {
    throw new UsageError('--etcd_user and --etcd_password_file go together (the password is read from the file)')
  }
  return a
}

/** Flags → Config. Throws UsageError on bad usage. */
export function parseConfig(argv: string[]): Config {
  const { values: v, given } = parseFlags(OPTIONS, argv, { refusedPrefixes: REFUSED_PREFIXES })
  const urls = v.metadata_url_list.trim()
  if (v.metadata_type === 'etcd') {
    if (urls === '') throw new UsageError('--metadata_type=etcd needs --metadata_url_list=http://host:port[,host:port]')
    for (const u of urls.split(',')) {
      if (!/^(https?:\/\/)?[A-Za-z0-9.\-_[\]:]+:\d{1,5}\/?$/.test(u.trim())) {
        throw new UsageError(`--metadata_url_list: expected http(s)://host:port entries, got "${u}"`)
      }
    }
  } else if (v.local_server_name !== '') {
    throw new UsageError('--local_server_name needs --metadata_type=etcd')
  }
  if (given.has('json') && given.has('format') && v.json !== (v.format === 'json')) {
    throw new UsageError(`--json and --format=${v.format} contradict each other`)
  }
  const cfg: Config = {
    targetSegNames: v.target_seg_name
      .split(',')
      .map((x) => x.trim())
      .filter((x) => x !== ''),
    segType: 'DRAM',
    opType: v.op_type as Config['opType'],
    checkConsistency: v.check_consistency,
    totalBufferSize: v.total_buffer_size,
    startBlockSize: v.start_block_size,
    maxBlockSize: v.max_block_size,
    startBatchSize: v.start_batch_size,
    maxBatchSize: v.max_batch_size,
    startNumThreads: v.start_num_threads,
    maxNumThreads: v.max_num_threads,
    durationS: v.duration,
    requestIntervalUs: v.request_interval_us,
    addressing: v.addressing as Addressing,
    metadataType: v.metadata_type as Config['metadataType'],
    metadataUrlList: urls,
    localServerName: v.local_server_name,
    etcd: etcdAccess(v),
    listen: listenAddress(v.listen, v.rpc_server_port),
    authSecretFile: v.auth_secret_file,
    notifi: v.notifi,
    advertise: v.seg_name.trim() || undefined,
    rpcServerPort: v.rpc_server_port,
    xportType: v.xport_type === '' ? undefined : (v.xport_type as TransportName),
    peerTimeoutMs: v.peer_timeout_ms,
    local: v.local,
    inject: parseInjection(v.inject, v.duration),
    format: v.json ? 'json' : (v.format as OutputFormat),
    help: v.help,
  }
  if (cfg.startBlockSize > cfg.maxBlockSize) throw new UsageError('--start_block_size is larger than --max_block_size')
  if (cfg.startBatchSize > cfg.maxBatchSize) throw new UsageError('--start_batch_size is larger than --max_batch_size')
  if (cfg.startNumThreads > cfg.maxNumThreads) throw new UsageError('--start_num_threads is larger than --max_num_threads')
  if (cfg.local && cfg.targetSegNames.length > 0) throw new UsageError('--local and --target_seg_name exclude each other')
  if (cfg.local && cfg.metadataType === 'etcd') throw new UsageError('--local uses p2p; drop --metadata_type=etcd')
  if (cfg.inject && !cfg.local) throw new UsageError('--inject needs --local (it signals the target tebench started)')
  const initiator = cfg.local || cfg.targetSegNames.length > 0
  if (initiator && !cfg.local && (given.has('listen') || given.has('seg_name'))) {
    throw new UsageError('--listen and --seg_name are target flags; an initiator connects out')
  }
  return cfg
}

// ---------------------------------------------------------------------------------------
// Results: their records and how they are printed are in tebench-output.ts.

/** Whether argv asks for JSON, read before parsing so that bad usage can be reported as JSON. */
function wantsJson(argv: string[]): boolean {
  return argv.some(
    (a, i) =>
      /^--?json(=(true|1|yes|t|y))?$/i.test(a) || a === '--format=json' || (a === '--format' && argv[i + 1] === 'json'),
  )
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

function failedRecord(f: BenchFailure): FailedRecord {
  return {
    record: 'failed',
    status: f.statusName,
    code: f.code ?? undefined,
    transport: f.transport,
    peer: f.peer,
    request: f.request,
    reason: f.reason,
  }
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
function metadataOptions(cfg: Config): EngineOptions {
  if (cfg.metadataType !== 'etcd') return {}
  const e = cfg.etcd
  return {
    metadata: `etcd://${cfg.metadataUrlList}`,
    segmentName: cfg.localServerName || undefined,
    etcdCaFile: e.caFile,
    etcdCertFile: e.certFile,
    etcdKeyFile: e.keyFile,
    etcdUser: e.user,
    etcdPasswordFile: e.passwordFile,
  }
}

/** The etcd TLS/auth flags again, for the printed initiator command (paths only). */
function etcdFlags(e: EtcdAccess): string[] {
  const flags: Array<[string, string | undefined]> = [
    ['etcd_ca_file', e.caFile],
    ['etcd_cert_file', e.certFile],
    ['etcd_key_file', e.keyFile],
    ['etcd_user', e.user],
    ['etcd_password_file', e.passwordFile],
  ]
  return flags.filter(([, v]) => v !== undefined).map(([k, v]) => `--${k}=${v}`)
}

/** Reports every transport that was enabled but could not be installed, with the reason. */
function reportDisabled(engine: Engine, out: Output): void {
  engine.on('transportDisabled', (e) => {
    if (e.segment === undefined) out.disabled({ record: 'transportDisabled', transport: e.transport, reason: e.reason })
  })
}

/** The secret of `--auth_secret_file` (read here; the secret never is on a command line). */
function authOptions(cfg: Config): { authSecret?: Buffer } {
  if (!cfg.authSecretFile) return {}
  let secret = readFileSync(cfg.authSecretFile)
  if (secret.at(-1) === 0x0a) secret = secret.subarray(0, secret.at(-2) === 0x0d ? -2 : -1)
  return { authSecret: secret }
}

function initiatorCommand(cfg: Config, segment: string): string {
  const parts = ['npx tebench', `--target_seg_name=${segment}`]
  if (cfg.metadataType === 'etcd') {
    parts.push('--metadata_type=etcd', `--metadata_url_list=${cfg.metadataUrlList}`, ...etcdFlags(cfg.etcd))
  }
  if (cfg.totalBufferSize !== GiB) parts.push(`--total_buffer_size=${cfg.totalBufferSize}`)
  if (cfg.xportType) parts.push(`--xport_type=${cfg.xportType}`)
  if (cfg.authSecretFile) parts.push(`--auth_secret_file=${cfg.authSecretFile}`)
  return parts.join(' ')
}

/** --notifi: what the initiator sent since the last call, and its rate over the measured time. */
function notified(engine: Engine, durationS: number): NotifyRecord {
  const m = engine.metrics()
  const before = notifiedSoFar.get(engine) ?? { sent: 0, failed: 0 }
  notifiedSoFar.set(engine, { sent: m.notificationsSent, failed: m.notificationsFailed })
  const count = m.notificationsSent - before.sent
  return { record: 'notifications', role: 'initiator', count, lost: m.notificationsFailed - before.failed, perSecond: count / durationS }
}
const notifiedSoFar = new WeakMap<Engine, { sent: number; failed: number }>()

async function runTarget(cfg: Config, out: Output): Promise<number> {
  // --notifi: room for bursts while JS counts them (a full queue drops, counted and printed).
  const queue = cfg.notifi ? { notifyQueueSize: 1 << 16 } : {}
  const engine = await Engine.create({ listen: cfg.listen, advertise: cfg.advertise, ...metadataOptions(cfg), ...authOptions(cfg), ...queue })
  try {
    reportDisabled(engine, new Output(out.format === 'json' ? 'json' : 'table'))
    const region = engine.allocate(cfg.totalBufferSize)
    void region
    // Notifications are counted as they come (taken, so the queue never fills).
    let received = 0
    engine.on('notification', () => received++)
    // The command names the segment as peers must spell it: the advertised address in
    // p2p, the registered name with etcd.
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
    if (cfg.notifi || received > 0) {
      out.notifications({ record: 'notifications', role: 'target', count: received, lost: engine.metrics().notificationsDropped, perSecond: null })
    }
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
 * Checks the read-back region against the pattern: every unit of `block` bytes of every
 * stripe is either untouched (all zero: not reached) or equal to the pattern. Called with
 * the sweep's first block size: every block of every case is made of whole such units
 * (block sizes double from it, stripes are whole blocks), so a unit is never half written
 * by cases of different block sizes. Returns an error message, or undefined when consistent.
 */
function verify(expect: Region, got: Region, threads: number, stripeLen: number, block: number): string | undefined {
  const zero = Buffer.alloc(block)
  // Compared through windows of whole blocks: a region over MAX_VIEW_BYTES (4 GiB on Node 20)
  // has no single Buffer.
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
 * Unmeasured seconds before each case (Mooncake's 1 s). FERRY_TEBENCH_WARMUP_MS is a test
 * hook: a long warm-up lets a test interrupt a case before anything was measured.
 */
const WARMUP_MS = Number(process.env.FERRY_TEBENCH_WARMUP_MS) > 0 ? Number(process.env.FERRY_TEBENCH_WARMUP_MS) : 1000

/** Bytes one unmeasured copy (priming a target, reading one back) moves per request. */
const COPY_CHUNK = 16 * MiB

/**
 * Unmeasured copies for --check_consistency: `op` the first `bytes` of `local` to or from
 * every target, worker i's stripe to or from target i % targets, as the bench moved them.
 */
async function copyStripes(
  engine: Engine,
  op: 'read' | 'write',
  local: Region,
  targets: Array<{ remote: Segment; remoteBuffer: number }>,
  threads: number,
  stripeLen: number,
): Promise<void> {
  for (let t = 0; t < threads; t++) {
    const { remote, remoteBuffer } = targets[t % targets.length]
    for (let off = t * stripeLen; off < (t + 1) * stripeLen; off += COPY_CHUNK) {
      const length = Math.min(COPY_CHUNK, (t + 1) * stripeLen - off)
      const req = { local, localOffset: off, remote, remoteBuffer, remoteOffset: off, length }
      await (op === 'write' ? engine.write(req) : engine.read(req))
    }
  }
}

/**
 * Engine transports for `--xport_type`: only that transport (no fallback), else the
 * engine's default set.
 */
function engineTransports(xport: TransportName | undefined): TransportName[] | undefined {
  return xport ? [xport] : undefined
}

/** The local target of --local, as runInitiator needs it for --inject. */
interface FaultTarget {
  pid: number
  signal(sig: Injection['signal']): void
}

interface InitiatorResult {
  code: number
}

function toRecord(
  op: 'read' | 'write',
  addressing: Addressing,
  requested: string,
  result: BenchResult,
  row: BenchRow,
  partial: boolean,
): CaseRecord {
  const r: CaseRecord = {
    record: 'case',
    op,
    transport: result.served.length === 1 ? result.served[0].transport : result.servedLabel,
    requested,
    addressing,
    served: result.served,
    failovers: result.failovers,
    ...row,
  }
  if (partial) r.partial = true
  return r
}

async function runInitiator(cfg: Config, out: Output, faultTarget?: FaultTarget): Promise<InitiatorResult> {
  const engine = await Engine.create({
    transports: engineTransports(cfg.xportType),
    peerTimeoutMs: cfg.peerTimeoutMs,
    ...metadataOptions(cfg),
    ...authOptions(cfg),
  })
  reportDisabled(engine, out)
  let bench: Bench | undefined
  const stopBench = () => bench?.stop()
  interrupt.onStop.add(stopBench)
  const requested = cfg.xportType ?? 'auto'
  const segName = cfg.targetSegNames.join(',')
  const fail = (status: string, request: string, reason: string, code?: string, peer = segName) =>
    out.failed({ record: 'failed', status, code, transport: requested, peer, request, reason })
  try {
    // Every target of the comma list; worker i works against target i % targets.
    const targets: Array<{ remote: Segment; remoteBuffer: number }> = []
    for (const name of cfg.targetSegNames) {
      let segment: Segment
      try {
        segment = await engine.openSegment(name)
      } catch (err) {
        const e = err as { code?: string; message?: string }
        fail('FAILED', `openSegment ${name}`, `cannot open segment ${name}: ${e.message}`, e.code ?? 'error', name)
        return { code: 1 }
      }
      const remote = segment.buffers[0]
      if (!remote) {
        fail('FAILED', `openSegment ${name}`, `segment ${name} exposes no buffer`, undefined, name)
        return { code: 1 }
      }
      if (remote.length < cfg.totalBufferSize) {
        out.usage(`segment ${name} exposes ${remote.length} B, less than --total_buffer_size=${cfg.totalBufferSize}`)
        return { code: 2 }
      }
      targets.push({ remote: segment, remoteBuffer: remote.id })
    }
    const [first, ...extraTargets] = targets
    const local = engine.allocate(cfg.totalBufferSize)
    let readBack: Region | undefined
    if (cfg.checkConsistency) {
      local.fill(PATTERN)
      readBack = engine.allocate(cfg.totalBufferSize)
    }
    // Whether the targets hold the pattern (a read case with --check_consistency needs it).
    let primed = false
    const ops: Array<'read' | 'write'> = cfg.opType === 'mix' ? ['write', 'read'] : [cfg.opType]
    let inject = cfg.inject && faultTarget ? { ...cfg.inject, target: faultTarget } : undefined

    for (const threads of doubling(cfg.startNumThreads, cfg.maxNumThreads)) {
      if (interrupt.stopped) break
      bench = engine.bench(threads)
      let group = ''
      try {
        for (const block of doubling(cfg.startBlockSize, cfg.maxBlockSize)) {
          for (const batch of doubling(cfg.startBatchSize, cfg.maxBatchSize)) {
            if (block * batch > cfg.totalBufferSize / threads) continue
            const stripeLen = stripeLength(cfg, threads, block)
            for (const op of ops) {
              if (interrupt.stopped) return { code: 130 }
              const what = `${op} ${block} B × ${batch}, ${threads} thread(s)`
              if (op === 'read' && readBack && !primed) {
                for (const t of targets) await copyStripes(engine, 'write', local, [t], 1, cfg.totalBufferSize)
                primed = true
              }
              const target = op === 'read' && readBack ? readBack : local
              if (op === 'read' && readBack) readBack.fill(0)
              if (group !== `${op}/${threads}`) out.groupStart(op, threads, requested, cfg.addressing)
              group = `${op}/${threads}`
              progress.show(`tebench: ${what} over ${requested}…`)
              const warmupMs = WARMUP_MS
              // --inject: the fault lands in the first measured case, afterMs past its warm-up.
              let faultAt: number | undefined
              let faultTimer: NodeJS.Timeout | undefined
              const fault = inject
              if (fault) {
                faultTimer = setTimeout(() => {
                  faultAt = Date.now()
                  fault.target.signal(fault.signal)
                }, warmupMs + fault.afterMs)
              }
              const result = await bench.runCase({
                opcode: op,
                blockSize: block,
                batchSize: batch,
                local: target,
                remote: first.remote,
                remoteBuffer: first.remoteBuffer,
                extraTargets,
                stripeBase: 0,
                stripeLen,
                addressing: cfg.addressing,
                transport: cfg.xportType,
                durationMs: Math.round(cfg.durationS * 1000),
                warmupMs,
                requestIntervalUs: cfg.requestIntervalUs,
                notify: cfg.notifi,
              })
              clearTimeout(faultTimer)
              progress.clear()
              if (fault) {
                inject = undefined
                const since = (t: number | null | undefined) => (t == null || faultAt === undefined ? null : Math.max(0, t - faultAt))
                out.injected({
                  record: 'inject',
                  signal: fault.signal,
                  targetPid: fault.target.pid,
                  afterMs: fault.afterMs,
                  firstFailedMs: since(result.firstFailureAtMs),
                  lastTerminalMs: result.outcome === 'failed' ? since(result.endedAtMs) : null,
                })
              }
              if (result.outcome === 'failed') {
                const f = result.failure
                if (f) out.failed(failedRecord(f))
                else fail('FAILED', what, 'the case failed')
                return { code: 1 }
              }
              if (fault) {
                // The fault did not fail the case: the promise it checks was not kept.
                fail('FAILED', what, `${fault.signal} of the target did not fail the case`)
                return { code: 1 }
              }
              if (result.row) {
                const record = toRecord(op, cfg.addressing, requested, result, result.row, result.outcome === 'stopped')
                out.row(record, result.row, result.servedLabel)
              }
              if (cfg.notifi) out.notifications(notified(engine, cfg.durationS))
              if (result.outcome === 'stopped' || interrupt.stopped) return { code: 130 }
              if (readBack && op === 'write' && cfg.opType === 'write') {
                readBack.fill(0)
                await copyStripes(engine, 'read', readBack, targets, threads, stripeLen)
                primed = true
              }
              if (readBack && (op === 'read' || cfg.opType === 'write')) {
                const problem = verify(local, readBack, threads, stripeLen, cfg.startBlockSize)
                if (problem) {
                  fail('INCONSISTENT', what, `consistency check FAILED: ${problem}`, 'ERR_TEBENCH_CONSISTENCY')
                  return { code: 1 }
                }
              }
              if (op === 'write') primed = true
            }
          }
        }
      } finally {
        bench.stop()
        bench = undefined
      }
    }
    // --notifi: the last submissions' notifications are still on their way; let them land
    // before the engine closes (bounded), so that the target's count is the whole run's.
    const deadline = Date.now() + 5_000
    for (;;) {
      const m = engine.metrics()
      if (m.notificationsDelivered + m.notificationsFailed >= m.notificationsSent || Date.now() > deadline) break
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
    return { code: 0 }
  } finally {
    interrupt.onStop.delete(stopBench)
    progress.clear()
    await engine.close()
  }
}

// ---------------------------------------------------------------------------------------
// --local: a target child of this same script.

interface LocalTarget extends FaultTarget {
  segment: string
  stop(): Promise<void>
  killNow(): void
}

function startLocalTarget(cfg: Config, timeoutMs = 30_000): Promise<LocalTarget> {
  const args = [...process.execArgv, __filename, '--rpc_server_port=0', `--total_buffer_size=${cfg.totalBufferSize}`]
  if (cfg.authSecretFile) args.push(`--auth_secret_file=${cfg.authSecretFile}`)
  if (cfg.notifi) args.push('--notifi')
  if (cfg.format === 'json') args.push('--format=json')
  const child: ChildProcess = spawn(process.execPath, args, {
    env: { ...process.env, FERRY_TEBENCH_CHILD: '1' },
    stdio: ['pipe', 'pipe', 'pipe'],
    detached: true, // own process group: a terminal Ctrl-C reaches only the initiator
  })
  let stderr = ''
  child.stderr?.on('data', (d) => (stderr += d))
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const alive = () => child.exitCode === null && child.signalCode === null
  // A target stopped by --inject=stop cannot handle SIGTERM: it is killed at once.
  let stopped = false
  const killNow = () => {
    if (alive() && child.pid) {
      try {
        process.kill(child.pid, 'SIGKILL')
      } catch {
        // gone
      }
    }
  }
  const signal = (sig: Injection['signal']) => {
    if (!alive() || !child.pid) return
    if (sig === 'SIGSTOP') stopped = true
    try {
      process.kill(child.pid, sig)
    } catch {
      // gone
    }
  }
  const stop = async () => {
    if (!alive()) return
    if (stopped) killNow()
    else child.kill('SIGTERM')
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
      // --notifi: the target's count, printed at its end, is part of this run's output.
      if (line.startsWith('tebench: notifications:') || line.includes('"record":"notifications"')) {
        process.stdout.write(line + '\n')
        return
      }
      const m = /--target_seg_name=(\S+)/.exec(line)
      if (!m) return
      clearTimeout(timer)
      resolve({ segment: m[1], pid: child.pid ?? 0, signal, stop, killNow })
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
      new Output(wantsJson(argv) ? 'json' : 'table').usage(err.message)
      return 2
    }
    throw err
  }
  if (cfg.help) {
    process.stdout.write(helpText())
    return 0
  }
  interrupt.install()
  const out = new Output(cfg.format)

  if (!cfg.local && cfg.targetSegNames.length === 0) return runTarget(cfg, out)

  let child: LocalTarget | undefined
  try {
    if (cfg.local) {
      child = await startLocalTarget(cfg)
      cfg = { ...cfg, targetSegNames: [child.segment] }
      if (interrupt.stopped) return 130
    }
    const { code } = await runInitiator(cfg, out, child)
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
