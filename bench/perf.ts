/**
 * Ferry performance suite.
 *
 *   npm run perf -- --suite tcp [--repeat 3] [--duration 5] [--warmup 1] [--lat-ops 20000] ...
 *   npm run perf -- --suite shm,failover --repeat 3 --duration 3
 *   npm run perf -- --suite scale --threads 1,2,4,8,16 [--sizes 4K,64K,1M,16M] [--ops write,read] [--lanes N]
 *   npm run perf -- --suite storm --engines 128 --procs 8
 *
 * Suites: `tcp` (tcp transport over loopback vs iperf3 and a pure-Node round trip), `shm`
 * (shared-memory transport to a same-host peer vs a one-thread memcpy, plus 4 KiB write
 * latency), `failover` (shm WRITE throughput with a share of shm completions failing over to
 * tcp, vs the same engine setup without faults), `blocks` (many 4 KiB / 64 KiB blocks per call
 * through the vectorized API, over shm vs memcpy and over tcp vs pure Node), `scale` (tebench's
 * native loop on 1, 2, 4, … submitting threads, tcp and shm, 4 KiB to 16 MiB blocks, vs N
 * iperf3 client/server pairs side by side and memcpy on N threads; a table at the end). The
 * tcp suite's write-4KiB-rtt case compares one 4 KiB WRITE in flight with a bare C round trip
 * (bench/baselines/tcp_rtt.c), blocking and polling.
 *
 * It runs from source under tsx, or compiled (tsc) with plain `node dist/bench/perf.js`: the
 * child processes then run their compiled .js too (lib/children.ts), and with
 * FERRY_PERF_BIN_DIR set the C baselines are taken prebuilt from there instead of compiled
 * (scripts/scale-check.sh packs it all for a machine with no Node, compiler or network).
 *
 * Prints one JSON line per case on stdout (the only thing written there) and progress on
 * stderr. Each figure is compared with a baseline measured in the same invocation (these
 * machines are shared and noisy): engine and baseline are measured interleaved, in
 * `--repeat` rounds, each round running both back to back (the order alternating between
 * rounds), and the record reports medians over the rounds; `ratio` is engine / baseline. Every child process
 * started (target engines, iperf3, baseline servers, the memcpy baseline) is killed by pid on exit, on error and
 * on SIGINT/SIGTERM.
 *
 * A new suite is a function `(options) => Promise<CaseRecord[]>` added to `suites` below.
 * Options are declared in the schema format of bench/options.ts, shared with tebench.
 */
import { installCleanup, killAll } from './lib/children'
import { emit, log } from './lib/log'
import { authSuite } from './suites/auth'
import { BLOCKS_CASES, blocksSuite } from './suites/blocks'
import { encryptSuite } from './suites/encrypt'
import { failoverSuite } from './suites/failover'
import { integritySuite } from './suites/integrity'
import { livenessSuite } from './suites/liveness'
import { notifySuite } from './suites/notify'
import { SCALE_SIZES, SCALE_TRANSPORTS, scaleSuite } from './suites/scale'
import { shmSuite } from './suites/shm'
import { soakSuite } from './suites/soak'
import { stormSuite } from './suites/storm'
import { tcpSuite } from './suites/tcp'
import type { Suite, SuiteOptions } from './suites/types'
import { helpLines, parseFlags, parseSize, SHARED, UsageError, type Schema } from './options'

const suites: Record<string, Suite> = {
  tcp: tcpSuite,
  shm: shmSuite,
  failover: failoverSuite,
  liveness: livenessSuite,
  soak: soakSuite,
  auth: authSuite,
  integrity: integritySuite,
  encrypt: encryptSuite,
  blocks: blocksSuite,
  notify: notifySuite,
  scale: scaleSuite,
  storm: stormSuite,
}

const MiB = 1 << 20

/** perf's options, in the schema format tebench uses too (bench/options.ts). */
const OPTIONS = {
  suite: {
    type: 'string',
    default: 'tcp',
    metavar: 'NAME[,NAME]',
    help: `suite(s) to run, comma-separated: ${Object.keys(suites).join(', ')} (described below), or all`,
  },
  case: {
    type: 'string',
    default: '',
    metavar: 'NAME[,NAME]',
    help: 'blocks suite only: run just these cases (a vector case runs over each transport it has); empty = every case',
  },
  repeat: { type: 'integer', default: 3, min: 1, max: 1000, help: 'rounds per case, engine and baseline interleaved; medians reported' },
  duration: { ...SHARED.durationS, help: 'measured seconds per throughput run and baseline run (iperf3, memcpy)' },
  warmup: { type: 'number', default: 1, min: 0, max: 3600, help: 'warm-up seconds before each measurement of round 1' },
  budget: {
    type: 'number',
    default: 300,
    min: 1,
    help: "soft limit on one phase's rounds; over it, rounds after the first measure only the API method that won round 1",
  },
  'lat-ops': { type: 'integer', default: 20_000, min: 1, help: 'timed operations per latency method' },
  'lat-max': { type: 'number', default: 30, min: 0.1, help: "time limit of one latency method's timed phase (s)" },
  window: { type: 'integer', default: 32, min: 1, help: 'outstanding Promise-API requests in throughput runs' },
  'batch-tasks': { type: 'integer', default: 16, min: 1, help: 'tasks per batch in batch-API throughput runs' },
  batches: { type: 'integer', default: 4, min: 1, help: 'batches in flight in batch-API throughput runs' },
  'working-set': {
    type: 'integer',
    default: 8,
    min: 1,
    metavar: 'MIB',
    help: 'hot working set on each side, MiB, that write-1MiB and read-1MiB cycle their 1 MiB blocks through',
  },
  'cold-working-set': {
    type: 'integer',
    default: 256,
    min: 1,
    metavar: 'MIB',
    help: 'cold working set on each side, MiB, pre-touched, for write-1MiB-cold and read-1MiB-cold',
  },
  cold: { type: 'boolean', default: true, help: 'measure the -cold cases (--no-cold skips them)' },
  'shm-working-set': {
    type: 'integer',
    default: 1024,
    min: 1,
    metavar: 'MIB',
    help: 'shm: working set on each side, pre-touched, and the memcpy baseline\'s source and destination each',
  },
  'failover-working-set': { type: 'integer', default: 256, min: 1, metavar: 'MIB', help: 'failover: working set on each side, pre-touched' },
  'fault-rate': { type: 'number', default: 0.1, min: 0, max: 1, help: 'failover: share of shm completions reported FAILED (corruptCompletionRate)' },
  'fault-seed': { type: 'integer', default: 7, min: 0, max: 2 ** 32 - 1, help: 'failover: seed of the fault injection' },
  trials: { type: 'integer', default: 20, min: 1, max: 1000, help: 'liveness: trials per case' },
  'peer-timeout-ms': { ...SHARED.peerTimeoutMs, help: `liveness, silent-loss case, and storm: ${SHARED.peerTimeoutMs.help}` },
  'soak-warmup': { type: 'integer', default: 200_000, min: 1, help: 'soak: transfers per case before the first reading' },
  'soak-transfers': { type: 'integer', default: 2_000_000, min: 1, help: 'soak: transfers per case after the warm-up' },
  'soak-sample-every': { type: 'integer', default: 250_000, min: 1, help: 'soak: a memory sample every N transfers' },
  threads: {
    type: 'string',
    default: '',
    metavar: 'N[,N]',
    help: 'scale: submitting thread counts; empty = 1, 2, 4, … up to the cores',
  },
  sizes: { type: 'string', default: '4K,64K,1M,16M', metavar: 'SIZE[,SIZE]', help: 'scale: block sizes (K/M suffixes)' },
  ops: { type: 'string', default: 'write', metavar: 'OP[,OP]', help: 'scale: write, read or both (write,read)' },
  transports: { type: 'string', default: SCALE_TRANSPORTS.join(','), metavar: 'T[,T]', help: 'scale: tcp, shm or both' },
  companion: {
    type: 'boolean',
    default: true,
    help: "scale: also run each tcp point's iperf3 pairs pinned cross-core, for context (--no-companion skips it)",
  },
  'io-threads': { type: 'integer', default: 0, min: 0, max: 64, help: "scale: both engines' ioThreads, storm: every engine's; 0 = the engine's default" },
  lanes: { type: 'integer', default: 0, min: 0, max: 64, help: "scale: both engines' tcp lanes (connectionsPerPeer); 0 = the engine's default" },
  engines: { type: 'integer', default: 32, min: 2, max: 1024, help: 'storm: engines in the storm, all opening each other' },
  procs: { type: 'integer', default: 4, min: 1, max: 64, help: 'storm: processes the engines are spread over' },
  'storm-timeout': { type: 'number', default: 120, min: 1, max: 3600, help: 'storm: seconds each phase may take before the storm counts as hung' },
  'storm-transports': { type: 'string', default: 'tcp', metavar: 'T[,T]', help: "storm: the engines' transports" },
  'storm-nofile': { type: 'integer', default: 0, min: 0, max: 1_048_576, help: 'storm: each process under prlimit --nofile=N; 0 = inherited' },
  json: { type: 'boolean', default: true, help: 'JSON lines on stdout (the default and only format)' },
  help: { type: 'boolean', default: false, aliases: ['h'], help: 'this text' },
} as const satisfies Schema

const SUITE_HELP = `    tcp       tcp transport over loopback vs iperf3 -l 1M and a pure-Node
              TCP request/answer
    shm       shm transport to a same-host target: write-1MiB, read-1MiB vs
              a 1-thread memcpy (gcc -O2 at run time; target ratio >= 0.85),
              write-4KiB-p50 (no baseline), batches of 64 x 4 KiB (ops/s)
    failover  1 MiB WRITEs over shm with a share of shm completions failing
              over to tcp, vs the same without faults (ratio = faulty / clean)
    liveness  time to FAILED when the target of a 1 MiB write stream is
              SIGKILLed (sigkill) or its network link goes silent in a
              network namespace (silent-loss; needs root): median and max
              over --trials trials
    soak      resident memory of an initiator before and after
              --soak-transfers 4 KiB WRITEs (shm and tcp; Promise and
              batch API), each case in a fresh process; target growth
              <= 32 MB
    auth      what the cluster secret costs: 1 MiB WRITEs over tcp and shm
              with and without it (ratio = with / without; target >= 0.97)
              and openSegment's median time with and without
    integrity what verify costs: 1 MiB WRITEs (tcp-1MiB-verify) and READs
              over tcp with and without it (ratio = with / without; target
              >= 0.85)
    encrypt   what sealing tcp costs (encrypt): tcp-1MiB-encrypt, 1 MiB
              WRITEs sealed vs plaintext, both with the secret (ratio =
              sealed / plaintext; target >= 0.5)
    blocks    many small blocks: writeBlocks/readBlocks over shm (4 KiB,
              64 KiB) vs memcpy of those blocks and over tcp (4 KiB) vs pure
              Node; then the native tebench loop, 1 thread, fixed addressing:
              shm 4 KiB and 1 MiB WRITE vs memcpy of the same block and
              working set (target ratio >= 0.9 at 1 MiB), tcp 1 MiB WRITE and
              READ vs iperf3 -l 1M (>= 0.7)
    notify    notifications/s (engine.notify, --window outstanding) and the
              latency a notification adds to a 4 KiB WRITE (p50, p99), with
              and without alternating in the same run (shm and tcp)
    scale     tebench's native loop on --threads submitting threads (batch
              1, fixed addressing) for --transports × --sizes × --ops, vs N
              iperf3 client/server pairs side by side (tcp; -l = the block,
              at most 1M) and memcpy on N threads (shm); GB/s, ratio and
              speed-up over the fewest threads, then a table on stderr
    storm     --engines engines in --procs processes all open each other at
              once (tcp), then one verified 64 KiB WRITE per opened pair:
              seconds to open all (goal <= 8 s at 128 x 8), descriptors and
              memory per pair, typed errors seen`

const USAGE = [
  `usage: npm run perf -- --suite <${Object.keys(suites).join('|')}>[,<suite>...] [options]`,
  '(gflags forms: --flag=value, --flag value, --flag, --noflag / --no-flag)',
  ...helpLines(OPTIONS, 28),
  '',
  'Suites:',
  SUITE_HELP,
].join('\n')

interface Cli {
  suites: string[]
  options: SuiteOptions
  help?: boolean
}

/** The names of a comma list, blanks dropped. */
const commaList = (list: string) =>
  list
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean)

/** The names of a comma list, each checked against `known`; at least one. */
function oneOf<T extends string>(flag: string, names: string[], known: readonly T[]): T[] {
  const bad = names.filter((n) => !known.includes(n as T))
  if (bad.length || names.length === 0) throw new UsageError(`--${flag}: expected ${known.join(', ')} (comma-separated), got "${names.join(',')}"`)
  return [...new Set(names)] as T[]
}

function parseArgs(argv: string[]): Cli {
  const { values: v } = parseFlags(OPTIONS, argv)
  if (!v.json) throw new UsageError('--json is the only format; --nojson is not offered')
  const options: SuiteOptions = {
    durationSeconds: v.duration,
    warmupSeconds: v.warmup,
    latencyOps: v['lat-ops'],
    latencyMaxSeconds: v['lat-max'],
    window: v.window,
    batchTasks: v['batch-tasks'],
    batchesInFlight: v.batches,
    workingSetBytes: v['working-set'] * MiB,
    coldWorkingSetBytes: v['cold-working-set'] * MiB,
    cold: v.cold,
    shmWorkingSetBytes: v['shm-working-set'] * MiB,
    failoverWorkingSetBytes: v['failover-working-set'] * MiB,
    faultRate: v['fault-rate'],
    faultSeed: v['fault-seed'],
    repeat: v.repeat,
    budgetSeconds: v.budget,
    trials: v.trials,
    peerTimeoutMs: v['peer-timeout-ms'],
    soakWarmup: v['soak-warmup'],
    soakTransfers: v['soak-transfers'],
    soakSampleEvery: v['soak-sample-every'],
    cases: commaList(v.case),
    scaleThreads: commaList(v.threads).map((t) => {
      if (!/^\d+$/.test(t) || Number(t) < 1 || Number(t) > 1024) throw new UsageError(`--threads: expected thread counts 1..1024, got "${t}"`)
      return Number(t)
    }),
    scaleSizes: commaList(v.sizes).map((x) => {
      const n = parseSize('sizes', x)
      if (n < 1 || n > 1 << 30) throw new UsageError(`--sizes: expected sizes of 1 B .. 1 GiB, got "${x}"`)
      return n
    }),
    scaleOps: oneOf('ops', commaList(v.ops), ['write', 'read'] as const),
    scaleTransports: oneOf('transports', commaList(v.transports), SCALE_TRANSPORTS),
    scaleCompanion: v.companion,
    ioThreads: v['io-threads'],
    lanes: v.lanes,
    stormEngines: v.engines,
    stormProcs: v.procs,
    stormTimeoutSeconds: v['storm-timeout'],
    stormTransports: v['storm-transports'],
    stormNofile: v['storm-nofile'],
  }
  if (options.scaleSizes.length === 0) options.scaleSizes = [...SCALE_SIZES]
  if (v.help) return { suites: [], options, help: true }
  const names = v.suite === 'all' ? Object.keys(suites) : commaList(v.suite)
  if (names.length === 0) throw new UsageError('--suite needs a name')
  const unknown = names.filter((n) => !Object.hasOwn(suites, n))
  if (unknown.length) {
    throw new UsageError(`unknown suite ${unknown.join(', ')} (known: ${Object.keys(suites).join(', ')})`)
  }
  if (options.cases.length) {
    if (names.some((n) => n !== 'blocks')) throw new UsageError('--case applies to the blocks suite alone')
    const unknownCases = options.cases.filter((c) => !BLOCKS_CASES.includes(c))
    if (unknownCases.length) {
      throw new UsageError(`unknown blocks case ${unknownCases.join(', ')} (known: ${BLOCKS_CASES.join(', ')})`)
    }
  }
  return { suites: names, options }
}

async function main(): Promise<number> {
  let cli: Cli
  try {
    cli = parseArgs(process.argv.slice(2))
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`perf: ${err.message}\n${USAGE}\n`)
      return 2
    }
    throw err
  }
  if (cli.help) {
    process.stderr.write(USAGE + '\n')
    return 0
  }
  // This CLI's main decides how the process ends: after a signal or a crash, the cleanup
  // kills every child by pid and hands the exit code back here.
  installCleanup((code) => process.exit(code))
  log(`options ${JSON.stringify(cli.options)}`)
  let failed = false
  for (const name of cli.suites) {
    const started = Date.now()
    log(`suite ${name}: start`)
    const records = await suites[name](cli.options)
    for (const r of records) {
      emit(r)
      if (r.error !== undefined || r.value === null || r.median_ms === null) failed = true
    }
    log(`suite ${name}: done in ${((Date.now() - started) / 1000).toFixed(1)} s`)
  }
  return failed ? 1 : 0
}

main().then(
  (code) => {
    killAll('end')
    process.exitCode = code
  },
  (err: unknown) => {
    log(`failed: ${(err as Error)?.stack ?? String(err)}`)
    killAll('error')
    process.exitCode = 1
  },
)
