/**
 * The command line → a typed Config: the flags of flags.ts, then what no single flag can
 * check (flags that need or exclude each other). Bad usage throws a UsageError.
 */
import type { TransportName } from '../../index'
import { parseFlags, UsageError, type Values } from '../options'
import { parseInjection, type Injection } from './fault'
import { OPTIONS, REFUSED_PREFIXES } from './flags'
import type { OutputFormat } from './output'

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
  /** --encrypt: the engine's `encrypt` option. */
  encrypt: 'auto' | boolean
  /** --notifi: every submission carries a notification. */
  notifi: boolean
  /** --verify: every transfer's bytes checked end to end (the engine's `verify`). */
  verify: boolean
  /** Target: the address peers are told; undefined = the bound address. */
  advertise?: string
  rpcServerPort: number
  xportType?: TransportName
  peerTimeoutMs: number
  /** `--tcp_lanes`: the engine's `connectionsPerPeer`. */
  tcpLanes: number | 'auto'
  local: boolean
  inject?: Injection
  format: OutputFormat
  help: boolean
  version: boolean
}

export type Addressing = 'fixed' | 'walk'

/** `host`, `host:port` or `[v6]:port` → `host:port`, the port defaulting to `port`. */
function listenAddress(text: string, port: number): string {
  const t = text.trim()
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-_]+)(?::(\d{1,5}))?$/.exec(t)
  if (!m) throw new UsageError(`--listen: expected ADDR[:PORT], got "${text}"`)
  const p = m[2] === undefined ? port : Number(m[2])
  if (p > 65535) throw new UsageError(`--listen: port ${p} is out of range`)
  return `${m[1]}:${p}`
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
    encrypt: given.has('encrypt') ? v.encrypt : 'auto',
    notifi: v.notifi,
    verify: v.verify,
    advertise: v.seg_name.trim() || undefined,
    rpcServerPort: v.rpc_server_port,
    xportType: v.xport_type === '' ? undefined : (v.xport_type as TransportName),
    peerTimeoutMs: v.peer_timeout_ms,
    tcpLanes: parseLanes(v.tcp_lanes),
    local: v.local,
    inject: parseInjection(v.inject, v.duration),
    format: v.json ? 'json' : (v.format as OutputFormat),
    help: v.help,
    version: v.version,
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

/** Whether argv asks for JSON, read before parsing so that bad usage can be reported as JSON. */
export function wantsJson(argv: string[]): boolean {
  return argv.some(
    (a, i) =>
      /^--?json(=(true|1|yes|t|y))?$/i.test(a) || a === '--format=json' || (a === '--format' && argv[i + 1] === 'json'),
  )
}

/** `--tcp_lanes`: a whole number of 1..64 or `auto`. */
export function parseLanes(text: string): number | 'auto' {
  const t = text.trim()
  if (t === 'auto') return 'auto'
  if (!/^\d+$/.test(t) || Number(t) < 1 || Number(t) > 64) throw new UsageError(`--tcp_lanes: expected 1..64 or auto, got "${text}"`)
  return Number(t)
}
