/**
 * Ferry performance suite.
 *
 *   npm run perf -- --suite tcp [--repeat 3] [--duration 5] [--warmup 1] [--lat-ops 20000] ...
 *   npm run perf -- --suite shm,failover --repeat 3 --duration 3
 *
 * Suites: `tcp` (tcp transport over loopback vs iperf3 and a pure-Node round trip), `shm`
 * (shared-memory transport to a same-host peer vs a one-thread memcpy, plus 4 KiB write
 * latency), `failover` (shm WRITE throughput with a share of shm completions failing over to
 * tcp, vs the same engine setup without faults).
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
 */
import { installCleanup, killAll } from './lib/children'
import { emit, log } from './lib/log'
import { failoverSuite } from './suites/failover'
import { livenessSuite } from './suites/liveness'
import { shmSuite } from './suites/shm'
import { soakSuite } from './suites/soak'
import { tcpSuite } from './suites/tcp'
import type { Suite, SuiteOptions } from './suites/types'

const suites: Record<string, Suite> = {
  tcp: tcpSuite,
  shm: shmSuite,
  failover: failoverSuite,
  liveness: livenessSuite,
  soak: soakSuite,
}

const USAGE = `usage: npm run perf -- --suite <${Object.keys(suites).join('|')}>[,<suite>...] [options]
  --suite NAME        suite(s) to run, comma-separated (default: tcp):
                        tcp       tcp transport over loopback vs iperf3 -l 1M and a pure-Node
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
  --repeat N          rounds per case, engine and baseline interleaved; medians reported (default 3)
  --duration S        measured seconds per throughput run and baseline run (iperf3, memcpy)
                      (default 5)
  --warmup S          warm-up seconds before each measurement of round 1 (default 1)
  --budget S          soft limit on one phase's rounds; over it, rounds after the first measure
                      only the API method that won round 1 (default 300)
  --lat-ops N         timed operations per latency method (default 20000)
  --lat-max S         time limit of one latency method's timed phase (default 30)
  --window N          outstanding Promise-API requests in throughput runs (default 32)
  --batch-tasks N     tasks per batch in batch-API throughput runs (default 16)
  --batches N         batches in flight in batch-API throughput runs (default 4)
  --working-set MIB   hot working set on each side, MiB, that write-1MiB and read-1MiB cycle
                      their 1 MiB blocks through; small enough to stay in CPU cache, like
                      iperf3's one reused 1 MiB buffer (default 8)
  --cold-working-set MIB
                      cold working set on each side, MiB, pre-touched, for write-1MiB-cold and
                      read-1MiB-cold (DRAM-bound); the 4 KiB latency reads span the larger
                      of the two working sets, with or without --no-cold (default 256)
  --no-cold           skip the write-1MiB-cold and read-1MiB-cold cases
  --shm-working-set MIB
                      shm: working set on each side, pre-touched, that write-1MiB and
                      read-1MiB cycle through (and the 4 KiB writes span), and the memcpy
                      baseline's source and destination each (default 1024)
  --failover-working-set MIB
                      failover: working set on each side, pre-touched (default 256)
  --fault-rate R      failover: share of shm completions reported FAILED (corruptCompletionRate),
                      0..1 (default 0.1)
  --fault-seed N      failover: seed of the fault injection (default 7)
  --trials N          liveness: trials per case (default 20)
  --peer-timeout-ms N liveness: peerTimeoutMs in the silent-loss case (default 3000)
  --soak-warmup N     soak: transfers per case before the first reading (default 200000)
  --soak-transfers N  soak: transfers per case after the warm-up (default 2000000)
  --soak-sample-every N
                      soak: a memory sample every N transfers (default 250000)
  --json              JSON lines on stdout (the default and only format)
  -h, --help          this text`

class UsageError extends Error {}

interface Cli {
  suites: string[]
  options: SuiteOptions
  help?: boolean
}

function parseArgs(argv: string[]): Cli {
  const options: SuiteOptions = {
    durationSeconds: 5,
    warmupSeconds: 1,
    latencyOps: 20_000,
    latencyMaxSeconds: 30,
    window: 32,
    batchTasks: 16,
    batchesInFlight: 4,
    workingSetBytes: 8 << 20,
    coldWorkingSetBytes: 256 << 20,
    cold: true,
    shmWorkingSetBytes: 1024 << 20,
    failoverWorkingSetBytes: 256 << 20,
    faultRate: 0.1,
    faultSeed: 7,
    repeat: 3,
    budgetSeconds: 300,
    trials: 20,
    peerTimeoutMs: 3000,
    soakWarmup: 200_000,
    soakTransfers: 2_000_000,
    soakSampleEvery: 250_000,
  }
  let names = ['tcp']
  const numeric: Record<string, { set: (v: number) => void; min: number; max?: number; integer: boolean }> = {
    '--duration': { set: (v) => (options.durationSeconds = v), min: 0.1, integer: false },
    '--warmup': { set: (v) => (options.warmupSeconds = v), min: 0, integer: false },
    '--lat-ops': { set: (v) => (options.latencyOps = v), min: 1, integer: true },
    '--lat-max': { set: (v) => (options.latencyMaxSeconds = v), min: 0.1, integer: false },
    '--window': { set: (v) => (options.window = v), min: 1, integer: true },
    '--batch-tasks': { set: (v) => (options.batchTasks = v), min: 1, integer: true },
    '--batches': { set: (v) => (options.batchesInFlight = v), min: 1, integer: true },
    '--working-set': { set: (v) => (options.workingSetBytes = v * (1 << 20)), min: 1, integer: true },
    '--cold-working-set': { set: (v) => (options.coldWorkingSetBytes = v * (1 << 20)), min: 1, integer: true },
    '--shm-working-set': { set: (v) => (options.shmWorkingSetBytes = v * (1 << 20)), min: 1, integer: true },
    '--failover-working-set': { set: (v) => (options.failoverWorkingSetBytes = v * (1 << 20)), min: 1, integer: true },
    '--fault-rate': { set: (v) => (options.faultRate = v), min: 0, max: 1, integer: false },
    '--fault-seed': { set: (v) => (options.faultSeed = v), min: 0, max: 2 ** 32 - 1, integer: true },
    '--repeat': { set: (v) => (options.repeat = v), min: 1, max: 1000, integer: true },
    '--budget': { set: (v) => (options.budgetSeconds = v), min: 1, integer: false },
    '--trials': { set: (v) => (options.trials = v), min: 1, max: 1000, integer: true },
    '--peer-timeout-ms': { set: (v) => (options.peerTimeoutMs = v), min: 100, max: 600_000, integer: true },
    '--soak-warmup': { set: (v) => (options.soakWarmup = v), min: 1, integer: true },
    '--soak-transfers': { set: (v) => (options.soakTransfers = v), min: 1, integer: true },
    '--soak-sample-every': { set: (v) => (options.soakSampleEvery = v), min: 1, integer: true },
  }
  for (let i = 0; i < argv.length; i++) {
    const raw = argv[i]
    const eq = raw.indexOf('=')
    const flag = raw.startsWith('--') && eq > 0 ? raw.slice(0, eq) : raw
    const inline = raw.startsWith('--') && eq > 0 ? raw.slice(eq + 1) : undefined
    const value = () => {
      if (inline !== undefined) return inline
      const v = argv[++i]
      if (v === undefined) throw new UsageError(`${flag} needs a value`)
      return v
    }
    if (flag === '-h' || flag === '--help') {
      return { suites: [], options, help: true }
    } else if (flag === '--json') {
      // the default; accepted for explicitness
    } else if (flag === '--no-cold') {
      if (inline !== undefined) throw new UsageError('--no-cold takes no value')
      options.cold = false
    } else if (flag === '--suite') {
      names = value()
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
    } else if (flag in numeric) {
      const spec = numeric[flag]
      const text = value()
      const v = Number(text)
      if (!Number.isFinite(v) || v < spec.min || v > (spec.max ?? Infinity) || (spec.integer && !Number.isInteger(v))) {
        const range = spec.max === undefined ? `>= ${spec.min}` : `in ${spec.min}..${spec.max}`
        throw new UsageError(`${flag}: expected ${spec.integer ? 'an integer' : 'a number'} ${range}, got ${text}`)
      }
      spec.set(v)
    } else {
      throw new UsageError(`unknown argument ${raw}`)
    }
  }
  if (names.length === 0) throw new UsageError('--suite needs a name')
  const unknown = names.filter((n) => !Object.hasOwn(suites, n))
  if (unknown.length) {
    throw new UsageError(`unknown suite ${unknown.join(', ')} (known: ${Object.keys(suites).join(', ')})`)
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
