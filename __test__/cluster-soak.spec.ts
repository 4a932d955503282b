/**
 * The cluster soak (`npm run soak`, bench/cluster-soak/): its pure parts — flags, the round
 * plan, the block and notification judgement, a host's view of a peer, the figures — and one
 * short run of the real thing (3 hosts in network namespaces, one round with a kill and a
 * restart), where namespaces and etcd are available.
 */
import test from 'ava'
import type { ChildProcess } from 'node:child_process'
import * as path from 'node:path'
import * as v8 from 'node:v8'
import * as vm from 'node:vm'
import { UsageError } from '../bench/options'
import {
  distribution,
  failureFigures,
  hostOf,
  mismatchFigures,
  peerLostFigures,
  restartFigures,
  type Kill,
} from '../bench/cluster-soak/accounting'
import { blockHash, decodePayload, encodePayload, HEADER_BYTES, judge, readHeader, writeHeader, type Payload } from '../bench/cluster-soak/block'
import { parseSoakFlags, PROBE_AREA, regionBytes, type SoakConfig } from '../bench/cluster-soak/flags'
import { CallDeadline } from '../bench/cluster-soak/host/deadline'
import { PeerLink } from '../bench/cluster-soak/host/link'
import { judgedQuantities, memoryFigures, MIN_SAMPLES, rssBaselineRound, slope } from '../bench/cluster-soak/memory'
import { addCounters, newCounters } from '../bench/cluster-soak/protocol'
import { pick, planRound, seededRandom } from '../bench/cluster-soak/schedule'
import { summarize, type SummaryInput } from '../bench/cluster-soak/summary'
import { netnsUnavailable } from '../support/netns'
import { clusterNamespaces, sweepClusters } from '../support/netns-cluster'
import { etcdUnavailable } from './etcd'
import { killAll, spawnNode } from './helpers'

test.after.always(killAll)

const config = (argv: string[] = []): SoakConfig => {
  const c = parseSoakFlags(argv)
  if (c === 'help') throw new Error('help')
  return c
}

const usage = (argv: string[]): string => {
  try {
    parseSoakFlags(argv)
  } catch (err) {
    if (err instanceof UsageError) return err.message
    throw err
  }
  return '(accepted)'
}

// ---------------------------------------------------------------------------------------
// Flags.

test('flags: defaults are 8 hosts, 10 rounds, no disruption', (t) => {
  const c = config()
  t.is(c.hosts, 8)
  t.is(c.rounds, 10)
  t.is(c.storm, null)
  t.is(c.etcdPauseMs, null)
  t.is(c.flood, null)
  t.is(c.reopen, 'on-stale')
  t.is(regionBytes(c), 8 * 64 * 16 * 1024 + PROBE_AREA)
  t.is(parseSoakFlags(['--help']), 'help')
})

test('flags: each disruption by its flag, with its settings', (t) => {
  const c = config(['--hosts=12', '--storm', '--kill=3', '--down-ms=0', '--etcd-pause', '--etcd-pause-ms=4000', '--idle-flood', '--flood-conns', '50', '--block-max=64K', '--reopen=never'])
  t.is(c.hosts, 12)
  t.deepEqual(c.storm, { kill: 3, downMs: 0 })
  t.is(c.etcdPauseMs, 4000)
  t.deepEqual(c.flood, { connections: 50 })
  t.is(c.blockMax, 64 * 1024)
  t.is(c.reopen, 'never')
  t.is(config(['--storm', '--nostorm']).storm, null)
})

test('flags: bad usage is refused naming the flag', (t) => {
  t.regex(usage(['--hosts=1']), /--hosts: must be between 2 and 64/)
  t.regex(usage(['--storm', '--hosts=3', '--kill=3']), /--kill: at most --hosts - 1 \(2\)/)
  t.regex(usage(['--block-min=32K', '--block-max=16K']), /--block-min .* above --block-max/)
  t.regex(usage(['--lease-ttl-ms=2500']), /--lease-ttl-ms: whole seconds/)
  t.regex(usage(['--rounds=1', '--etcd-pause']), /leaves no round after --warmup-rounds/)
  t.regex(usage(['--slots=2', '--lanes=3']), /--slots \(2\) must be at least --lanes \(3\)/)
  t.regex(usage(['--reopen=sometimes']), /--reopen must be on-stale or never/)
  t.regex(usage(['--nonsense']), /unknown flag --nonsense/)
  t.is(usage(['--rounds=1', '--warmup-rounds=0', '--storm', '--hosts=2', '--kill=1']), '(accepted)')
})

// ---------------------------------------------------------------------------------------
// The round plan.

test('schedule: warm-up rounds disrupt nothing; later rounds place each disruption in turn', (t) => {
  const c = config(['--storm', '--etcd-pause', '--etcd-pause-ms=2000', '--idle-flood', '--round-ms=1000'])
  const warm = planRound(c, 0)
  t.true(warm.warmup)
  t.deepEqual([warm.flood, warm.etcdPause, warm.storm], [null, null, null])
  t.is(warm.lengthMs, 1000)
  const r = planRound(c, 3)
  t.deepEqual(r.etcdPause, { startMs: 1000, endMs: 3000 })
  t.is(r.storm!.killMs, 5000, 'the storm waits 2 s after the pause')
  t.is(r.storm!.restartMs, 5500)
  t.is(r.storm!.hosts.length, 2)
  t.true(r.lengthMs >= 5500 + 6000, 'the round settles after the restart (2 × the 3 s lease)')
  t.deepEqual(r.flood, { host: 2, startMs: 0, endMs: r.lengthMs - 500 })
  t.deepEqual(planRound(c, 3), r, 'the same flags plan the same round')
  t.is(planRound(config(['--round-ms=1000']), 5).lengthMs, 1000, 'no disruption, no settling')
})

test('schedule: victims are distinct, in range, and follow the seed', (t) => {
  for (let seed = 0; seed < 50; seed++) {
    const v = pick(8, 3, seededRandom(seed))
    t.is(new Set(v).size, 3)
    t.true(v.every((x) => x >= 0 && x < 8))
    t.deepEqual(v, [...v].sort((a, b) => a - b))
    t.deepEqual(pick(8, 3, seededRandom(seed)), v)
  }
  t.deepEqual(pick(4, 4, seededRandom(1)), [0, 1, 2, 3])
})

// ---------------------------------------------------------------------------------------
// Blocks and the judgement of notifications.

function block(length: number, writer: number, incarnation: number, seq: number, fill = 7): { bytes: Buffer; payload: Payload } {
  const bytes = Buffer.alloc(length, fill)
  writeHeader(bytes, { writer, incarnation, seq })
  return { bytes, payload: { writer, incarnation, seq, slot: 0, length, hash: blockHash(bytes) } }
}

/** A slot of `size` bytes holding `content` at its start. */
function slotWith(content: Buffer | null, size = 4096): Buffer {
  const s = Buffer.alloc(size)
  content?.copy(s)
  return s
}

test('block: header and payload round-trip; foreign bytes are no payload', (t) => {
  const { bytes, payload } = block(1000, 3, 1_700_000_000_123, 42)
  t.deepEqual(readHeader(bytes), { writer: 3, incarnation: 1_700_000_000_123, seq: 42, length: 1000 })
  t.deepEqual(decodePayload(Buffer.from(encodePayload(payload))), payload)
  t.is(readHeader(Buffer.alloc(HEADER_BYTES)), null)
  for (const bad of ['', 'null', '[]', '{"w":1}', '{"w":-1,"i":1,"s":1,"k":0,"n":64,"h":"x"}', 'not json', '{"w":1,"i":"x","s":1,"k":0,"n":64,"h":"x"}']) {
    t.is(decodePayload(Buffer.from(bad)), null, bad)
  }
})

test('judge: the slot holding exactly the block is verified', (t) => {
  const { bytes, payload } = block(1000, 1, 100, 5)
  t.deepEqual(judge(payload, slotWith(bytes)), { kind: 'verified' })
})

test('judge: a later block of the same writer (seq or incarnation) supersedes, never misdelivers', (t) => {
  const { payload } = block(1000, 1, 100, 5)
  t.deepEqual(judge(payload, slotWith(block(500, 1, 100, 6).bytes)), { kind: 'superseded' })
  t.deepEqual(judge(payload, slotWith(block(500, 1, 101, 1).bytes)), { kind: 'superseded' })
})

test('judge: zeros (a restarted instance), an older or foreign block, or other bytes are misdelivered', (t) => {
  const { bytes, payload } = block(1000, 1, 100, 5)
  t.deepEqual(judge(payload, slotWith(null)), { kind: 'misdelivered', why: 'zeros' })
  t.deepEqual(judge(payload, slotWith(block(1000, 1, 100, 4).bytes)), { kind: 'misdelivered', why: 'older' })
  t.deepEqual(judge(payload, slotWith(block(1000, 1, 99, 9).bytes)), { kind: 'misdelivered', why: 'older' })
  t.deepEqual(judge(payload, slotWith(block(1000, 2, 100, 5).bytes)), { kind: 'misdelivered', why: 'foreign' })
  const corrupt = Buffer.from(bytes)
  corrupt[900] ^= 1
  t.deepEqual(judge(payload, slotWith(corrupt)), { kind: 'misdelivered', why: 'corrupt' })
  t.deepEqual(judge(payload, slotWith(Buffer.alloc(64, 0xff))), { kind: 'misdelivered', why: 'corrupt' })
  t.deepEqual(judge({ ...payload, length: 8000 }, slotWith(bytes)), { kind: 'misdelivered', why: 'bad-payload' })
})

// ---------------------------------------------------------------------------------------
// A host's view of one peer.

test('link: the first failure and those in flight then are reported; fast failures after are only counted', (t) => {
  const link = new PeerLink()
  t.true(link.failed(100, 110), 'the first failure')
  t.true(link.failed(105, 111), 'in flight when the peer went')
  t.false(link.failed(112, 113), 'started once it was known down')
  t.is(link.succeeded(108, 114), null, 'a success of a transfer started before the loss is no recovery')
  t.deepEqual(link.succeeded(200, 210), { downAt: 110, tStart: 200, tEnd: 210, failures: 3 })
  t.true(link.up)
  t.is(link.succeeded(220, 230), null)
})

test('link: a kill notice yields a recovery even when no transfer failed', (t) => {
  const link = new PeerLink()
  t.is(link.succeeded(10, 20), null)
  link.killed(50)
  t.is(link.succeeded(40, 60), null, 'started before the kill')
  t.deepEqual(link.succeeded(70, 80), { downAt: 50, tStart: 70, tEnd: 80, failures: 0 })
  t.is(link.succeeded(90, 95), null)
  // A notice that arrives after the peer already answered a transfer started after the kill.
  link.killed(85)
  t.is(link.succeeded(96, 99), null)
  // Failures after a notice: the loss and the recovery as usual, once.
  link.killed(100)
  t.true(link.failed(101, 102))
  t.deepEqual(link.succeeded(150, 160), { downAt: 102, tStart: 150, tEnd: 160, failures: 1 })
  t.is(link.succeeded(170, 180), null)
})

// ---------------------------------------------------------------------------------------
// Figures.

const kill = (host: number, tKill: number, tReady: number | null, storm: number[] = [], tProcess: number | null = null, tEngineStart: number | null = null): Kill => ({
  host,
  round: 1,
  tKill,
  tReady,
  tProcess,
  tEngineStart,
  storm,
})

test('distribution: nearest-rank percentiles; never counts as infinitely late', (t) => {
  t.deepEqual(distribution([]), { n: 0, never: 0, p50: null, p90: null, p99: null, max: null })
  const d = distribution(Array.from({ length: 100 }, (_, i) => i + 1))
  t.deepEqual([d.p50, d.p90, d.p99, d.max], [50, 90, 99, 100])
  const late = distribution([10, 20, 30, 40, 50, 60, 70, 80, 90], 1)
  t.deepEqual([late.n, late.never, late.p50, late.p90, late.max], [10, 1, 50, 90, null])
})

test('time-to-FAILED: from the kill for transfers in flight, from their start after; others unexplained', (t) => {
  const kills = [kill(2, 1000, 3000)]
  const f = failureFigures(
    [
      { host: 0, target: 2, code: 'ERR_FERRY_PEER_LOST', tStart: 990, tEnd: 1008 }, // in flight: 8 ms
      { host: 1, target: 2, code: 'ERR_FERRY_PEER_LOST', tStart: 1010, tEnd: 1013 }, // started after: 3 ms
      { host: 0, target: 1, code: 'ERR_FERRY_TIMEOUT', tStart: 1000, tEnd: 1500 }, // host 1 was never killed
      { host: 0, target: 2, code: 'ERR_FERRY_CONNECT', tStart: 3100, tEnd: 3200 }, // after the restart
      { host: 0, target: 2, code: 'ERR_FERRY_CONNECT', tStart: 500, tEnd: 900 }, // before the kill
    ],
    kills,
  )
  t.is(f.timeToFailedMs.n, 2)
  t.deepEqual([f.timeToFailedMs.p50, f.timeToFailedMs.max], [3, 8])
  t.deepEqual(f.unexplained, { ERR_FERRY_TIMEOUT: 1, ERR_FERRY_CONNECT: 2 })
})

test('restart-to-first-success: per survivor from ready and from the kill; storm peers excluded; never counted', (t) => {
  const kills = [kill(0, 1000, 2000, [1], 1600, 1900), kill(1, 1000, 2100, [0], 1700, 2050), kill(0, 9000, null)]
  const r = restartFigures(
    kills,
    [
      { host: 2, target: 0, tEnd: 2150 },
      { host: 3, target: 0, tEnd: 1900 }, // before ready (a race of clocks): 0
      { host: 1, target: 0, tEnd: 2300 }, // host 1 was killed in the same storm: not counted
      { host: 2, target: 1, tEnd: 2400 },
      { host: 2, target: 0, tEnd: 9500 }, // after host 0's next kill: that kill's
    ],
    4,
  )
  // host 0: survivors 2 (150), 3 (0); host 1: survivors 2 (300), 3 (never)
  t.is(r.n, 4)
  t.is(r.never, 1)
  t.is(r.notRestarted, 1)
  t.deepEqual([r.p50, r.max], [150, null])
  // From the kill: 1150, 900, 1400, never.
  t.deepEqual([r.fromKill.n, r.fromKill.never, r.fromKill.p50, r.fromKill.max], [4, 1, 1150, null])
  // The restarts' parts: kill to ready 1000, 1100; to the process 600, 700; Node and tsx 300, 350; the engine 100, 50.
  t.deepEqual([r.killToReady.p50, r.killToReady.max], [1000, 1100])
  t.deepEqual([r.killToProcess.p50, r.killToProcess.max], [600, 700])
  t.deepEqual([r.processToEngine.p50, r.processToEngine.max], [300, 350])
  t.deepEqual([r.engineToReady.p50, r.engineToReady.max], [50, 100])
})

test('peerLost: true within the attribution window of a kill of its host; reasons tallied, unknown fields tolerated', (t) => {
  const f = peerLostFigures(
    [
      { host: 1, t: 1100, event: { kind: 'peerLost', segment: 'soak-host-0', reason: 'control connection closed by peer' } },
      { host: 2, t: 1200, event: { kind: 'peerLost', segment: 'soak-host-0', reason: 'crashed', incarnation: 'x' } },
      { host: 2, t: 5000, event: { kind: 'peerLost', segment: 'soak-host-3', reason: 'etcd record removed' } },
      { host: 3, t: 999, event: { kind: 'peerLost', segment: 'soak-host-0' } }, // before the kill
      { host: 3, t: 1300, event: { kind: 'peerLost', segment: 'soak-host-0', reason: { kind: 'restarted' } } },
    ],
    [kill(0, 1000, 1500)],
  )
  t.is(f.total, 5)
  t.is(f.falsePeerLost, 2)
  t.deepEqual(f.reasons, {
    true: { 'control connection closed by peer': 1, crashed: 1, '{"kind":"restarted"}': 1 },
    false: { 'etcd record removed': 1, '(none)': 1 },
  })
  t.is(hostOf('soak-host-12'), 12)
  t.is(hostOf('soak-host-012'), -1)
  t.is(hostOf(undefined), -1)
})

test('mismatches: zeros read back across a restart of the target are lost to it, not mismatches', (t) => {
  const kills = [kill(1, 1000, 1500)]
  const m = mismatchFigures(
    [
      { host: 0, target: 1, tStart: 990, tEnd: 1600, zero: true },
      { host: 0, target: 1, tStart: 990, tEnd: 1600, zero: false },
      { host: 0, target: 2, tStart: 990, tEnd: 1600, zero: true },
    ],
    kills,
  )
  t.deepEqual(m, { mismatches: 2, lostToRestart: 1 })
})

test('memory: the baseline round is the later of the warm-up and the middle', (t) => {
  t.is(rssBaselineRound(10, 1), 4)
  t.is(rssBaselineRound(10, 7), 6)
  t.is(rssBaselineRound(1, 0), 0)
})

test('memory: slope is the least-squares fit, null without two rounds', (t) => {
  t.is(slope([]), null)
  t.is(slope([[3, 10]]), null)
  t.is(slope([[0, 1], [1, 2], [2, 3]]), 1)
  t.is(slope([[0, 5], [1, 5], [2, 5], [3, 5]]), 0)
  t.is(slope([[4, 100], [5, 103], [6, 100], [7, 103]]), 0.6)
})

test('memory: judged per incarnation from the baseline; a restart starts afresh without its partial round', (t) => {
  const series = [
    [50, 60, 62, 63, 64, 65],
    [50, 55, 70, 80, 90, 100],
    [50, null, 40, 80, 81, 82], // restarted in round 2: that round's sample is left out
    [50, 51, 52, null, null, null], // down at the end
    [50, 50, 50, 50, 51, 70], // restarted in round 5: its one sample is not a run
  ]
  const inc = [
    [1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1],
    [1, null, 2, 2, 2, 2],
    [1, 1, 1, null, null, null],
    [1, 1, 1, 1, 1, 3],
  ]
  const r = memoryFigures(series, inc, 1, 2, 3)
  t.deepEqual(
    r.hosts.map((h) => [h.fromMb, h.endMb, h.growthMb, h.slopeMbPerRound, h.samples, h.flat]),
    [
      [60, 65, 5, 1.2, 5, true],
      [55, 100, 45, 11, 5, false],
      [80, 82, 2, 1, 3, true],
      [null, null, null, null, 0, null], // 2 samples in the window: not judged
      [50, 51, 1, 0.3, 4, true],
    ],
  )
  t.false(r.flat)
  t.is(r.maxSlopeMbPerRound, 11)
  t.is(memoryFigures([[1, 2]], [[1, 1]], 0, 1).flat, null, 'nobody judged')
  t.is(memoryFigures(series, inc, 1, 2).hosts[2].flat, null, `runs shorter than ${MIN_SAMPLES} rounds are not judged by default`)
})

test('memory: noise around a level is flat; a steady leak of a little more than the bound is not', (t) => {
  const inc = [Array(10).fill(1)]
  const noisy = [120, 125, 119, 124, 120, 125, 119, 124, 120, 125]
  t.true(memoryFigures([noisy], inc, 4, 2).flat)
  const leak = Array.from({ length: 10 }, (_, r) => 100 + 2.4 * r + (r % 2 ? 1.5 : -1.5))
  const f = memoryFigures([leak], inc, 4, 2)
  t.false(f.flat, `slope ${f.maxSlopeMbPerRound}`)
  // A leak that started late in the window is still a leak.
  t.false(memoryFigures([[100, 100, 100, 100, 100, 100, 100, 104, 108, 112]], inc, 4, 2).flat)
})

test('memory: a sample splits into RSS, native (RSS less V8\'s heap) and the live heap', (t) => {
  t.deepEqual(judgedQuantities({ rss: 150e6, heapTotal: 52.4e6, heapUsed: 12.34e6, external: 11e6, arrayBuffers: 10e6 }), { rss: 150, native: 97.6, heap: 12.3 })
})

/** A summary input of `rounds` rounds, one host, from per-round samples. */
function summaryInput(rss: number[], heapTotal: number[], heapUsed: number[]): SummaryInput {
  const c = config([`--rounds=${rss.length}`, '--hosts=2'])
  const memory = rss.map((r, i) => ({ rss: r * 1e6, heapTotal: heapTotal[i] * 1e6, heapUsed: heapUsed[i] * 1e6, external: 0, arrayBuffers: 0 }))
  return {
    config: c,
    durationS: 1,
    stoppedAt: 1e15,
    totals: newCounters(),
    kills: [],
    fails: [],
    ups: [],
    mismatches: [],
    peerLost: [],
    peerRecovered: 0,
    memory: [memory, memory],
    incarnations: [rss.map(() => 1), rss.map(() => 2)],
    floods: [],
    etcdPauses: [],
    restartFailures: 0,
    hostErrors: [],
    misdeliveredSamples: [],
  }
}

test('summary: memory that the engine holds growing is reported as growth, whatever V8\'s heap does', (t) => {
  const rounds = 10
  const flat = Array(rounds).fill(50)
  // Native memory (RSS less the heap) grows 3 MB a round; the heap is flat.
  const leaking = summarize(summaryInput(Array.from({ length: rounds }, (_, r) => 150 + 3 * r), flat, Array(rounds).fill(20)))
  t.false(leaking.goals.rss_flat)
  t.false(leaking.goals.native_memory_flat)
  t.true(leaking.goals.js_heap_flat)
  t.is(leaking.memory.native.max_slope_mb_per_round, 3)
  // Live objects pile up in the JS heap, slower than RSS may wander but faster than its bound: reported too.
  const slowPile = summarize(summaryInput(Array(rounds).fill(150), flat, Array.from({ length: rounds }, (_, r) => 20 + 0.8 * r)))
  t.false(slowPile.goals.js_heap_flat)
  t.true(slowPile.goals.rss_flat)
  // Live objects pile up in the JS heap: reported too.
  const piling = summarize(summaryInput(Array.from({ length: rounds }, (_, r) => 150 + 4 * r), Array.from({ length: rounds }, (_, r) => 50 + 4 * r), Array.from({ length: rounds }, (_, r) => 20 + 4 * r)))
  t.false(piling.goals.js_heap_flat)
  t.true(piling.goals.native_memory_flat)
  t.false(piling.goals.rss_flat)
  // Flat everywhere: flat.
  const steady = summarize(summaryInput(Array(rounds).fill(150), flat, Array(rounds).fill(20)))
  t.deepEqual([steady.goals.rss_flat, steady.goals.native_memory_flat, steady.goals.js_heap_flat], [true, true, true])
  t.deepEqual(steady.rss_mb_by_round[0], Array(rounds).fill(150))
})

// ---------------------------------------------------------------------------------------
// A host's per-call deadline.

test('deadline: one signal per lane until it fires; a call that ended leaves no timer behind', async (t) => {
  const d = new CallDeadline()
  const a = d.arm(60_000)
  d.disarm()
  t.is(d.arm(60_000), a, 'the same signal while it has not fired')
  d.disarm()
  const fired = d.arm(1)
  const aborted = await new Promise<boolean>((resolve) => {
    const bound = setTimeout(() => resolve(false), 10_000)
    fired.addEventListener('abort', () => {
      clearTimeout(bound)
      resolve(true)
    })
  })
  t.true(aborted, 'aborted within the bound')
  t.is((fired.reason as { code?: string }).code, 'ABORT_ERR')
  d.disarm()
  const fresh = d.arm(60_000)
  t.not(fresh, fired, 'a fired signal is never reused')
  t.false(fresh.aborted)
  d.disarm()
})

test('deadline: calls that ended retain no memory (the host heap stays bounded)', (t) => {
  v8.setFlagsFromString('--expose-gc')
  const gc = vm.runInNewContext('gc') as () => void
  const d = new CallDeadline()
  const noop = () => {}
  const call = () => {
    // As the library does with a call's signal.
    const s = d.arm(30_000)
    s.addEventListener('abort', noop, { once: true })
    s.removeEventListener('abort', noop)
    d.disarm()
  }
  for (let i = 0; i < 1000; i++) call()
  gc()
  const before = process.memoryUsage().heapUsed
  // A host makes about this many calls in a 30 s hang bound.
  for (let i = 0; i < 30_000; i++) call()
  gc()
  const grown = (process.memoryUsage().heapUsed - before) / 1e6
  t.true(grown < 2, `the heap grew ${grown.toFixed(1)} MB over 30,000 calls`)
})

test('counters add up, code by code', (t) => {
  const a = { ...newCounters(), writesOk: 2, failures: { X: 1 } }
  const b = { ...newCounters(), writesOk: 3, failures: { X: 2, Y: 1 }, misdeliveredBy: { zeros: 1 } }
  const s = addCounters(a, b)
  t.is(s.writesOk, 5)
  t.deepEqual(s.failures, { X: 3, Y: 1 })
  t.deepEqual(s.misdeliveredBy, { zeros: 1 })
})

// ---------------------------------------------------------------------------------------
// One short run: 3 hosts in namespaces, etcd, one round with a kill and a restart.

const SOAK = path.join(__dirname, '..', 'bench', 'cluster-soak.ts')
const skip = netnsUnavailable() ?? etcdUnavailable()

/** Runs the soak to its end, bounded: SIGTERM past `limitMs` (its cleanup runs), SIGKILL 20 s later. */
function runSoak(args: string[], limitMs: number): Promise<{ proc: ChildProcess; code: number | null; stdout: string; stderr: string }> {
  const proc = spawnNode(SOAK, {}, args)
  let stdout = ''
  let stderr = ''
  proc.stdout?.on('data', (d) => (stdout += d))
  proc.stderr?.on('data', (d) => (stderr += d))
  return new Promise((resolve) => {
    const term = setTimeout(() => proc.pid && process.kill(proc.pid, 'SIGTERM'), limitMs)
    const kill = setTimeout(() => proc.pid && process.kill(proc.pid, 'SIGKILL'), limitMs + 20_000)
    proc.once('close', (code) => {
      clearTimeout(term)
      clearTimeout(kill)
      resolve({ proc, code, stdout, stderr })
    })
  })
}

if (skip) {
  test.skip(`cluster soak smoke run skipped: ${skip}`, (t) => t.pass())
} else {
  test('smoke: 3 hosts, one round with a kill and a restart: JSON records, 0 mismatches, everything removed', async (t) => {
    t.timeout(240_000)
    const r = await runSoak(['--hosts=3', '--rounds=1', '--warmup-rounds=0', '--round-ms=1000', '--storm', '--kill=1', '--down-ms=200', '--lease-ttl-ms=1000', '--peer-timeout-ms=1000'], 200_000)
    t.teardown(() => sweepClusters(r.proc.pid))
    t.is(r.code, 0, r.stderr.slice(-3000))
    const records = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>)
    t.deepEqual(
      records.map((x) => x.record),
      ['start', 'round', 'summary'],
    )
    const round = records[1]
    t.is((round.rss_mb as unknown[]).length, 3)
    const storm = round.storm as Array<Record<string, unknown>>
    t.is(storm.length, 1)
    t.is(typeof storm[0].t_kill, 'number')
    const s = records[2]
    for (const k of ['time_to_failed_ms', 'restart_to_first_success_ms']) {
      const d = s[k] as Record<string, unknown>
      for (const q of ['n', 'never', 'p50', 'p90', 'p99']) t.true(q in d, `${k}.${q}`)
    }
    for (const k of ['bytes_verified', 'bytes_verified_at_target', 'mismatches', 'misdelivered', 'peer_lost', 'false_peer_lost', 'kills', 'writes_ok']) {
      t.is(typeof s[k], 'number', k)
    }
    const memory = s.memory as Record<string, Record<string, unknown>>
    for (const k of ['rss', 'native', 'heap']) {
      const flat = memory[k].flat
      t.true(flat === null || typeof flat === 'boolean', `memory.${k}.flat: ${flat}`)
    }
    t.is((round.heap_used_mb as unknown[]).length, 3)
    const restarts = s.restart_ms as Record<string, Record<string, unknown>>
    t.is(restarts.kill_to_ready.n, 1, 'the restart is measured from the kill to its ready')
    t.is(s.kills, 1)
    t.true((s.bytes_verified as number) > 0, 'bytes were verified')
    t.is(s.mismatches, 0)
    t.regex(r.stderr, /time-to-FAILED/)
    t.deepEqual(clusterNamespaces(r.proc.pid!), [], 'the namespaces are removed')
  })
}
