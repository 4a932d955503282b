/**
 * The `tcp` suite: Ferry's TCP transport over loopback, between this process and a target
 * engine in a child process (bench/target.ts).
 *
 *   write-1MiB       1 MiB WRITEs, many in flight, GB/s, hot working set   vs iperf3 -l 1M (same run)
 *   read-1MiB        1 MiB READs, many in flight, GB/s, hot working set    vs iperf3 -l 1M (same run)
 *   write-1MiB-cold  the same WRITEs over the cold working set             vs iperf3 -l 1M (same run)
 *   read-1MiB-cold   the same READs over the cold working set              vs iperf3 -l 1M (same run)
 *   read-4KiB-p50    one 4 KiB READ at a time, p50 in µs                   vs pure-Node TCP request/answer
 *   write-4KiB-rtt   one 4 KiB WRITE in flight through tebench's native loop, mean µs
 *                    vs a bare C round trip (4 KiB / 16 B), blocking and polling (tcp-rtt.ts)
 *
 * Locality: iperf3 -l 1M sends from one reused 1 MiB buffer, which stays in CPU cache. The
 * primary cases (write-1MiB, read-1MiB) cycle their 1 MiB blocks through a working set of the
 * same kind, `--working-set` MiB on each side (default 8), so their ratio compares like with
 * like. The `-cold` cases cycle through `--cold-working-set` MiB on each side (default 256,
 * pre-touched), DRAM-bound, against the same iperf3 rounds, so the gap between the two shows
 * what locality costs; `--no-cold` skips them. Each record names its `working_set_MiB` and
 * `locality`. One region of max(hot, cold) bytes per side holds both (the hot set is its
 * first `--working-set` MiB); the 4 KiB latency reads span the whole region.
 *
 * Throughput is measured two ways, the Promise API with a window of outstanding calls and
 * the batch API (submitTransfer, getBatchStatus polled with backoff); latency two ways, the
 * Promise API and the batch API with a spin on getTransferStatus. Each record reports the
 * better method as `value` and names it in `method`; both figures are in the record.
 */
import { Engine } from '../../index'
import { startIperf3Loopback, type Iperf3Result } from '../baselines/iperf3'
import { startNodeTcpLatency, type LatencyBaselineSession } from '../baselines/node_tcp_lat'
import { latencyFigures, latencyPhase, p50, type LatencyPhase } from '../lib/latency'
import { log } from '../lib/log'
import { MiB, latencyMethodLabel, mergeTallies, startTarget, throughputMethodLabel, unexpectedTransports, type Rig } from '../lib/rig'
import { ORDER_NOTE, attempt, compare, figures, isResult, roundErrors, type Rounds } from '../lib/rounds'
import { median, pooledSummary, ratio, round, summarize } from '../lib/stats'
import { caseFigures, throughputPhase, type ThroughputCase, type ThroughputPhase } from '../lib/throughput'
import { rttCase } from './tcp-rtt'
import type { CaseRecord, SuiteOptions } from './types'

const SUITE = 'tcp'

/**
 * One throughput case (write-1MiB, read-1MiB, write-1MiB-cold, read-1MiB-cold): an opcode
 * over the first `workingSetBytes` of each side, of a given locality.
 */
interface TcpCase extends ThroughputCase {
  locality: string
  /** For a cold case, the name of the hot case it is compared with. */
  hotCase?: string
}

const HOT_LOCALITY = "hot (like iperf3's reused 1 MiB buffer)"
const coldLocality = (bytes: number) => `cold (${bytes / MiB} MiB per side, DRAM-bound)`

/** The throughput cases to run: hot write and read, then (unless --no-cold) cold ones. */
function throughputCases(options: SuiteOptions, chunk: number): TcpCase[] {
  const label = `${chunk / MiB}MiB`
  const cases: TcpCase[] = (['write', 'read'] as const).map((opcode) => ({
    name: `${opcode}-${label}`,
    opcode,
    workingSetBytes: options.workingSetBytes,
    locality: HOT_LOCALITY,
  }))
  if (options.cold) {
    for (const opcode of ['write', 'read'] as const) {
      cases.push({
        name: `${opcode}-${label}-cold`,
        opcode,
        workingSetBytes: options.coldWorkingSetBytes,
        locality: coldLocality(options.coldWorkingSetBytes),
        hotCase: `${opcode}-${label}`,
      })
    }
  }
  return cases
}

function throughputRecord(c: TcpCase, cases: TcpCase[], phase: ThroughputPhase<Iperf3Result>, options: SuiteOptions): CaseRecord {
  const { cmp, cpu, seen, errors, fields } = caseFigures(phase, c.name, options.repeat)
  const iperfOk = phase.base.filter((i) => i.gbps !== null)
  const record: CaseRecord = {
    suite: SUITE,
    case: c.name,
    value: cmp.value,
    unit: 'GB/s',
    working_set_MiB: c.workingSetBytes / MiB,
    locality: c.locality,
    baseline: phase.base.find((i) => i.label)?.label ?? 'iperf3 -l 1M',
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    method: throughputMethodLabel(cmp.method, options),
    ...fields,
    cpu_pct: {
      ...cpu,
      iperf3: iperfOk.length
        ? {
            sender: round(median(iperfOk.map((i) => i.senderCpu ?? null)), 0),
            receiver: round(median(iperfOk.map((i) => i.receiverCpu ?? null)), 0),
          }
        : null,
    },
    baseline_note: `one iperf3 run per round (one reused 1 MiB buffer, cache-resident), the baseline of ${cases.map((x) => x.name).join(', ')} in that round`,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: phase.hostLoad[c.name],
  }
  if (c.hotCase !== undefined) {
    // What locality costs: this (cold) case over its hot counterpart, same rounds.
    const hot = caseFigures(phase, c.hotCase, options.repeat).cmp
    record.hot_case = c.hotCase
    record.hot_value = hot.value
    record.cold_vs_hot = ratio(cmp.value, hot.value)
    record.cold_vs_hot_per_round = cmp.rounds.map((v, r) => ratio(v, hot.rounds[r]))
  }
  record.tasks_by_transport = seen
  const other = unexpectedTransports(seen, 'tcp')
  if (other) errors.unshift(`transport: expected every task over tcp, saw ${other}`)
  if (errors.length) record.error = errors.join('; ')
  const notes = [...new Set(phase.base.map((i) => i.note).filter((n): n is string => !!n))]
  if (notes.length) record.note = notes.join('; ')
  return record
}

/**
 * `repeat` rounds of: engine 4 KiB READ latency (both methods, or the one chosen in round
 * 1), then the pure-Node baseline; odd rounds in that order, even rounds reversed. One
 * baseline server and connection serve every round, as one target serves the engine; the
 * warm-up runs in round 1 only.
 */
async function latencyRounds(rig: Rig, bytes: number): Promise<{ phase: LatencyPhase; base: Rounds<number[]> }> {
  const { options } = rig
  const base: Rounds<number[]> = []
  let session: LatencyBaselineSession | Error | undefined
  try {
    const phase = await latencyPhase(SUITE, rig, bytes, 'read', [
      async ({ round: r, tag, warm }) => {
        log(`${tag}: baseline node tcp request/answer ${bytes / 1024} KiB (${options.latencyOps} ops)`)
        if (session === undefined) session = await attempt('latency baseline start', () => startNodeTcpLatency(bytes))
        const s = session
        const res =
          s instanceof Error
            ? s
            : await attempt(`${tag} latency baseline`, () => s.run({ ops: options.latencyOps, warmupSeconds: warm, maxSeconds: options.latencyMaxSeconds }))
        base[r] = res
        if (isResult(res)) log(`${tag}: baseline p50 ${summarize(res).p50.toFixed(1)} us (n ${res.length})`)
      },
    ])
    return { phase, base }
  } finally {
    const s: LatencyBaselineSession | Error | undefined = session
    if (s !== undefined && !(s instanceof Error)) await s.close()
  }
}

function latencyRecord(phase: LatencyPhase, base: Rounds<number[]>, bytes: number, spanBytes: number, options: SuiteOptions): CaseRecord {
  const { byMethod, chosen, cpu, tallies, errors, fields } = latencyFigures(phase, options.repeat)
  const baselineRounds = figures(base, options.repeat, p50, 1)
  const cmp = compare(byMethod, chosen, false, () => baselineRounds, 1)
  const record: CaseRecord = {
    suite: SUITE,
    case: `read-${bytes / 1024}KiB-p50`,
    value: cmp.value,
    unit: 'us',
    baseline: `node tcp request/answer ${bytes / 1024} KiB`,
    baseline_value: cmp.baselineValue,
    ratio: cmp.ratio,
    method: latencyMethodLabel(cmp.method),
    lower_is_better: true,
    rounds: cmp.rounds,
    baseline_rounds: baselineRounds,
    ratio_per_round: cmp.ratioPerRound,
    ratio_median: cmp.ratioMedian,
    ...fields,
    baseline_us: pooledSummary(base.map((x) => (isResult(x) ? x : undefined))),
    pooled_note: 'promise_us, batch_us, baseline_us pool the samples of all rounds',
    cpu_pct: cpu,
    ops_per_round: options.latencyOps,
    working_set_MiB: spanBytes / MiB,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: ORDER_NOTE,
    host_load: phase.hostLoad,
  }
  errors.push(...roundErrors(base, 'baseline'))
  const seen = mergeTallies(tallies)
  record.tasks_by_transport = seen
  const other = unexpectedTransports(seen, 'tcp')
  if (other) errors.unshift(`transport: expected every task over tcp, saw ${other}`)
  if (errors.length) record.error = errors.join('; ')
  return record
}

export async function tcpSuite(options: SuiteOptions): Promise<CaseRecord[]> {
  const records: CaseRecord[] = []
  const chunk = MiB
  const latBytes = 4096

  // One target and one pre-touched region on each side, reused by every round: the hot
  // cases use its first --working-set MiB, the cold cases its first --cold-working-set MiB,
  // the latency reads all of it (as before: 256 MiB by default, with or without --no-cold).
  const regionBytes = Math.max(options.workingSetBytes, options.coldWorkingSetBytes)
  const cases = throughputCases(options, chunk)
  const target = await startTarget(regionBytes)
  let engine: Engine | undefined
  try {
    // The target is on this host: with the default transports (['shm', 'tcp']) the engine
    // would serve it over shm. This suite measures tcp, so tcp is the only one enabled here.
    engine = await Engine.create({ listen: '127.0.0.1:0', transports: ['tcp'] })
    const local = engine.allocate(regionBytes)
    local.buffer.fill(0x3c) // fault every page in before anything is timed
    const remote = await engine.openSegment(target.segment)
    const rig: Rig = { engine, local, regionBytes, remote, remoteBuffer: target.buffer, target, options }

    log(`tcp: throughput, ${options.repeat} rounds of ${cases.map((c) => c.name).join(' + ')} + iperf3, ${options.durationSeconds} s each`)
    // `repeat` rounds of each case in turn then one iperf3 client run, the baseline of
    // every case of the round. The target, its connections and the working sets are reused,
    // and one iperf3 server serves every client run.
    const iperf = startIperf3Loopback('1M')
    let tput: ThroughputPhase<Iperf3Result>
    try {
      tput = await throughputPhase(SUITE, rig, chunk, cases, { name: 'iperf3', run: (s, warm) => iperf.run(s, warm) })
    } finally {
      await iperf.close()
    }
    for (const c of cases) records.push(throughputRecord(c, cases, tput, options))

    log(`tcp: latency, ${options.repeat} rounds of engine + pure-Node baseline, ${options.latencyOps} ops each`)
    const lat = await latencyRounds(rig, latBytes)
    records.push(latencyRecord(lat.phase, lat.base, latBytes, regionBytes, options))

    log(`tcp: round trip, ${options.repeat} rounds of the native loop (one 4 KiB WRITE in flight) + C round trip blocking and polling, ${options.durationSeconds} s each`)
    records.push(await rttCase({ engine, local, remote, remoteBuffer: target.buffer, options }))
  } finally {
    await engine?.close()
    await target.stop()
  }
  return records
}
