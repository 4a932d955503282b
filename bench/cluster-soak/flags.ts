/**
 * The cluster soak's flags (bench/options.ts's schema and gflags forms) and the run's
 * configuration made from them. Pure: tested in __test__/cluster-soak.spec.ts.
 */
import { helpLines, parseFlags, SHARED, UsageError, type Schema } from '../options'

const KiB = 1024

export const SOAK_OPTIONS = {
  hosts: { type: 'integer', default: 8, min: 2, max: 64, help: 'hosts, each a process with an engine in a network namespace of its own' },
  rounds: { type: 'integer', default: 10, min: 1, max: 10_000, help: 'rounds, the first --warmup-rounds without disruption' },
  'round-ms': { type: 'integer', default: 8000, min: 500, max: 3_600_000, help: 'length of a round (longer when its disruptions need it)' },
  'warmup-rounds': { type: 'integer', default: 1, min: 0, max: 1000, help: 'rounds at the start without disruption' },
  storm: { type: 'boolean', default: false, help: 'kill/restart storms: each round SIGKILLs --kill hosts at once and restarts them on the same address' },
  kill: { type: 'integer', default: 2, min: 1, max: 63, help: 'hosts killed at once in a storm' },
  'down-ms': { type: 'integer', default: 500, min: 0, max: 600_000, help: 'how long killed hosts stay down before their restart' },
  'etcd-pause': { type: 'boolean', default: false, help: 'each round pauses etcd (SIGSTOP) for --etcd-pause-ms, then resumes it (SIGCONT)' },
  'etcd-pause-ms': { type: 'integer', default: 8000, min: 100, max: 600_000, help: 'how long etcd stays paused' },
  'idle-flood': { type: 'boolean', default: false, help: 'each round opens --flood-conns idle connections to one host and has a fresh engine open it meanwhile' },
  'flood-conns': { type: 'integer', default: 1100, min: 1, max: 15_000, help: 'idle connections in a flood, all from this namespace\'s address' },
  lanes: { type: 'integer', default: 2, min: 1, max: 64, help: 'transfers in flight from each host to each peer' },
  'gap-ms': { type: 'integer', default: 20, min: 0, max: 60_000, help: 'pause of a lane between two verified writes' },
  'block-min': { type: 'size', default: 1 * KiB, min: 64, max: 64 * KiB * KiB, help: 'smallest write (random size between the two)' },
  'block-max': { type: 'size', default: 16 * KiB, min: 64, max: 64 * KiB * KiB, help: 'largest write' },
  slots: { type: 'integer', default: 64, min: 1, max: 65_536, help: 'slots of --block-max bytes each writer cycles through in each peer' },
  'peer-timeout-ms': { ...SHARED.peerTimeoutMs },
  'lease-ttl-ms': { type: 'integer', default: 3000, min: 1000, max: 3_600_000, help: 'each engine\'s etcd lease (whole seconds)' },
  reopen: {
    type: 'string',
    default: 'on-stale',
    choices: ['on-stale', 'never'],
    help: 'on-stale: a lane reopens the segment when its handle no longer names the peer\'s buffer; never: it keeps the handle (the promise of docs/cluster.md)',
  },
  'hang-ms': { type: 'integer', default: 30_000, min: 100, max: 3_600_000, help: 'a transfer or open still pending after this is aborted and counted as hung' },
  'rss-slope-mb': {
    type: 'number',
    default: 2,
    min: 0,
    max: 100_000,
    help: 'RSS and native memory growth (MB, 10^6 bytes, per round: the least-squares slope over the second half of the rounds) up to which a host counts as flat; more --rounds see slower leaks',
  },
  'heap-slope-mb': {
    type: 'number',
    default: 0.5,
    min: 0,
    max: 100_000,
    help: 'the same for the live JS heap after a full collection, which wanders far less',
  },
  port: { type: 'integer', default: 7000, min: 1, max: 65_535, help: 'port every host listens on, on its own address' },
  seed: { type: 'integer', default: 1, min: 0, max: 2 ** 32 - 1, help: 'seed of the storm victims' },
  help: { type: 'boolean', default: false, aliases: ['h'], help: 'this help' },
} as const satisfies Schema

export interface SoakConfig {
  hosts: number
  rounds: number
  roundMs: number
  warmupRounds: number
  storm: { kill: number; downMs: number } | null
  etcdPauseMs: number | null
  flood: { connections: number } | null
  lanes: number
  gapMs: number
  blockMin: number
  blockMax: number
  slots: number
  peerTimeoutMs: number
  leaseTtlMs: number
  reopen: 'on-stale' | 'never'
  hangMs: number
  rssSlopeMb: number
  heapSlopeMb: number
  port: number
  seed: number
}

export const USAGE = [
  'usage: npm run soak -- [--hosts=8] [--rounds=10] [--storm] [--etcd-pause] [--idle-flood] [options]',
  '(gflags forms: --flag=value, --flag value, --flag, --noflag / --no-flag)',
  ...helpLines(SOAK_OPTIONS, 22),
].join('\n')

/** The configuration from `argv`, or `'help'`; a UsageError names the flag on bad usage. */
export function parseSoakFlags(argv: readonly string[]): SoakConfig | 'help' {
  const { values: v } = parseFlags(SOAK_OPTIONS, argv)
  if (v.help) return 'help'
  if (v['block-min'] > v['block-max']) throw new UsageError(`--block-min (${v['block-min']}) is above --block-max (${v['block-max']})`)
  if (v.storm && v.kill >= v.hosts) throw new UsageError(`--kill: at most --hosts - 1 (${v.hosts - 1}) hosts, so that someone survives; got ${v.kill}`)
  if (v.slots < v.lanes) throw new UsageError(`--slots (${v.slots}) must be at least --lanes (${v.lanes}): each lane has slots of its own`)
  if (v['lease-ttl-ms'] % 1000 !== 0) throw new UsageError(`--lease-ttl-ms: whole seconds, got ${v['lease-ttl-ms']}`)
  if (v['warmup-rounds'] >= v.rounds && (v.storm || v['etcd-pause'] || v['idle-flood'])) {
    throw new UsageError(`--rounds (${v.rounds}) leaves no round after --warmup-rounds (${v['warmup-rounds']}) for the disruptions`)
  }
  return {
    hosts: v.hosts,
    rounds: v.rounds,
    roundMs: v['round-ms'],
    warmupRounds: v['warmup-rounds'],
    storm: v.storm ? { kill: v.kill, downMs: v['down-ms'] } : null,
    etcdPauseMs: v['etcd-pause'] ? v['etcd-pause-ms'] : null,
    flood: v['idle-flood'] ? { connections: v['flood-conns'] } : null,
    lanes: v.lanes,
    gapMs: v['gap-ms'],
    blockMin: v['block-min'],
    blockMax: v['block-max'],
    slots: v.slots,
    peerTimeoutMs: v['peer-timeout-ms'],
    leaseTtlMs: v['lease-ttl-ms'],
    reopen: v.reopen as SoakConfig['reopen'],
    hangMs: v['hang-ms'],
    rssSlopeMb: v['rss-slope-mb'],
    heapSlopeMb: v['heap-slope-mb'],
    port: v.port,
    seed: v.seed,
  }
}

/** Bytes at the end of each target region that no writer uses: the flood probe's. */
export const PROBE_AREA = 4096

/**
 * The bytes of each host's target region: a stripe per writer of `slots` slots of
 * `blockMax` bytes, then the probe's area.
 */
export function regionBytes(c: Pick<SoakConfig, 'hosts' | 'slots' | 'blockMax'>): number {
  return c.hosts * c.slots * c.blockMax + PROBE_AREA
}
