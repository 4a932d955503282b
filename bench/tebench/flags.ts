/**
 * tebench's flags, declared once in the schema format of bench/options.ts: parsing, the
 * help text and the tests all read this schema. Mooncake's flags that Ferry does not
 * implement are declared too, and refused by name rather than ignored.
 */
import { helpLines, refusedLines, SHARED, type Schema } from '../options'

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
  tcp_lanes: {
    type: 'string',
    default: 'auto',
    metavar: 'N|auto',
    help: 'Ferry: tcp lanes (data connections) per peer, 1..64, on both sides with --local; auto = one per core, 2..32 (the run header names what the engine uses)',
  },
  local: { type: 'boolean', default: false, help: 'start a target child on 127.0.0.1 and bench against it' },
  inject: {
    type: 'string',
    default: '',
    metavar: 'kill|stop[:AFTER_MS]',
    help: 'with --local: SIGKILL or SIGSTOP the target AFTER_MS (default 500) into the first measured case, report the time to the first FAILED and to the last request\'s end, exit 1',
  },
  format: {
    type: 'string',
    default: 'table',
    choices: ['table', 'mooncake', 'csv', 'json'],
    help: "table, mooncake (Mooncake's own layout), csv (# KEY: VALUE header lines, then column names and a line per case) or json (a JSON line per record)",
  },
  json: { type: 'boolean', default: false, help: 'the same as --format=json: every outcome as a JSON line on stdout' },
  help: { type: 'boolean', default: false, aliases: ['h'], help: 'show this help' },
  version: { type: 'boolean', default: false, help: 'print the version, commit and Node, and exit' },
  auth_secret_file: {
    type: 'string',
    default: '',
    metavar: 'PATH',
    help: 'both roles: a file holding the cluster secret (at least 32 bytes; one trailing newline is not part of it); needed to listen beyond loopback',
  },
  verify: {
    type: 'boolean',
    default: false,
    help: "Ferry: check every transfer's bytes end to end (the engine's verify: a CRC32C at each end; a mismatch fails with ERR_FERRY_INTEGRITY)",
  },
  encrypt: {
    type: 'boolean',
    default: false,
    help: "both roles: seal every tcp connection (AES-256-GCM; the engine's encrypt: true); --noencrypt: none (encrypt: false); neither: the engine's default, 'auto' (sealed beyond loopback)",
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
export const REFUSED_PREFIXES = [
  ['qos_', 'QoS flags are not supported (Ferry has no QoS scheduler)'],
  ['receiver_', 'receiver-credit experiments are not supported'],
] as const

/** The text of --help, from the schema. */
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
    'Columns: BlkSize (B) | Batch | BW (GB/S) | Avg Inst GB/s | Avg Lat (us) | Avg Tx (us) | P50 Tx (us) | P99 Tx (us) | P999 Tx (us) | Max Tx (us)',
    "  (--format=mooncake: Mooncake's eight, without P50 and Max; csv and json add Min Tx. Warm-up excluded from every figure.)",
    'Exit codes: 0 success, 1 transfer failure, 2 bad usage, 130 interrupted (partial results printed).',
  ].join('\n') + '\n'
}
