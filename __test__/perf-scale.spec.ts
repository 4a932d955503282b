/**
 * perf's scale suite (bench/suites/scale.ts) and the C baselines it and the tcp suite's
 * write-4KiB-rtt case use: the thread sweep and iperf3 lengths, the report's speed-ups and
 * table, the C round trip and memcpy on N threads, bad usage refused before anything runs,
 * and `--suite scale` in its shortest form, whose JSON lines are checked for their shape.
 */
import test from 'ava'
import * as path from 'node:path'
import * as os from 'node:os'
import { haveIperf3 } from '../bench/baselines/iperf3'
import { allowedCores, crossCoreAffinity, parseCpuList, type Iperf3Group } from '../bench/baselines/iperf3_group'
import { startMemcpyBaseline } from '../bench/baselines/memcpy'
import { startTcpRttBaseline } from '../bench/baselines/tcp_rtt'
import { addSpeedups, scalePointsOf, scaleTable, type ScalePoint } from '../bench/lib/scale-report'
import { companionFigures, crossCoreCompanion, iperf3Length, threadSweep } from '../bench/suites/scale'
import { killAll, spawnNode } from './helpers'

const PERF = path.join(__dirname, '..', 'bench', 'perf.ts')

test.after.always(() => {
  killAll()
})

function runPerf(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const proc = spawnNode(PERF, {}, args)
  let stdout = ''
  let stderr = ''
  proc.stdout?.on('data', (d) => (stdout += d))
  proc.stderr?.on('data', (d) => (stderr += d))
  return new Promise((resolve) => proc.once('close', (code) => resolve({ code, stdout, stderr })))
}

test('the default thread sweep doubles from 1 and ends at the cores', (t) => {
  t.deepEqual(threadSweep(1), [1])
  t.deepEqual(threadSweep(2), [1, 2])
  t.deepEqual(threadSweep(6), [1, 2, 4, 6])
  t.deepEqual(threadSweep(16), [1, 2, 4, 8, 16])
})

test("iperf3's -l is the block size, at most iperf3's largest (1M)", (t) => {
  t.is(iperf3Length(4096), '4K')
  t.is(iperf3Length(65536), '64K')
  t.is(iperf3Length(1 << 20), '1M')
  t.is(iperf3Length(16 << 20), '1M')
})

test('cross-core iperf3 streams each receive on another core than the one that sends', (t) => {
  for (const cores of [[0, 1], [0, 1, 2], [4, 5, 6, 7], Array.from({ length: 16 }, (_, i) => i)]) {
    for (let i = 0; i < 2 * cores.length; i++) {
      const a = crossCoreAffinity(i, cores)
      t.not(a.client, a.server, `stream ${i} of cores ${cores.join(',')}`)
      t.true(cores.includes(a.client) && cores.includes(a.server))
    }
  }
  t.deepEqual([0, 1].map((i) => crossCoreAffinity(i, [0, 1])), [
    { client: 0, server: 1 },
    { client: 1, server: 0 },
  ])
  t.deepEqual(crossCoreAffinity(1, [4, 6, 7]), { client: 6, server: 7 }, 'only the cores this process may use')
})

test('CPU lists parse as Linux writes them; the allowed cores are as many as Node counts', (t) => {
  t.deepEqual(parseCpuList('0-1'), [0, 1])
  t.deepEqual(parseCpuList('0-3,8,10-11\n'), [0, 1, 2, 3, 8, 10, 11])
  t.deepEqual(parseCpuList('4-7'), [4, 5, 6, 7])
  for (const bad of ['', 'x', '3-1', '1,,2', '0-']) t.is(parseCpuList(bad), null, JSON.stringify(bad))
  t.is(allowedCores().length, os.availableParallelism())
})

test("tcp's companion baseline is the same group pinned cross-core, and only where there are 2 cores", async (t) => {
  const asked: unknown[] = []
  const group: Pick<Iperf3Group, 'label' | 'run'> = {
    label: (n, placement) => `${n} streams ${placement ?? 'free'}`,
    run: async (n, seconds, warm, placement) => {
      asked.push([n, seconds, warm, placement])
      return { gbps: 5, streams: [] }
    },
  }
  t.is(crossCoreCompanion(group, 1, 1), undefined)
  const c = crossCoreCompanion(group, 2, 2)
  t.is(c?.label, '2 streams cross-core')
  t.deepEqual(await c?.run(3, 0), { gbps: 5, streams: [] })
  t.deepEqual(asked, [[2, 3, 0, 'cross-core']])
})

test("a record's companion figures are medians over the rounds that have them", (t) => {
  t.deepEqual(
    companionFigures(
      [
        { gbps: 8, companion: 10 },
        { gbps: 6, companion: null },
        { gbps: null, companion: 9 },
        { gbps: 7, companion: 10 },
      ],
      'x',
    ),
    { companion_baseline: 'x', companion_value: 10, companion_ratio: 0.75 },
  )
  t.deepEqual(companionFigures([{ gbps: 8 }], 'x'), { companion_baseline: 'x', companion_value: null, companion_ratio: null })
})

test('speed-ups are over the same series at its fewest threads; the table has a row per point', (t) => {
  const point = (threads: number, value: number | null, base: number, block = 4096): ScalePoint => ({
    suite: 'scale',
    transport: 'tcp',
    opcode: 'write',
    block_bytes: block,
    threads,
    value,
    baseline_value: base,
    ratio: value === null ? null : value / base,
  })
  const points = addSpeedups([point(2, 3, 8), point(1, 2, 5), point(1, 10, 10, 1 << 20), point(4, null, 20)])
  t.deepEqual(
    points.map((p) => [p.engine_speedup, p.baseline_speedup]),
    [
      [1.5, 1.6],
      [1, 1],
      [1, 1],
      [null, 4],
    ],
  )
  const table = scaleTable(points)
  t.is(table.length, 2 + points.length)
  t.regex(table[0], /^transport\s+op\s+block\s+threads\s+engine GB\/s.*\bratio\s+x-core ratio\s+Avg Tx us$/)
  t.regex(table[4], /^tcp\s+write\s+1 MiB\s+1\s+10\.000/)
  t.regex(table[5], /^tcp\s+write\s+4 KiB\s+4\s+-/)
  t.deepEqual(
    scalePointsOf('{"suite":"tcp","case":"x"}\n\n' + JSON.stringify(points[0]) + '\n').map((p) => p.threads),
    [2],
  )
})

test('the C round trip answers in both forms', async (t) => {
  t.timeout(30_000)
  const rtt = startTcpRttBaseline(4096, 16)
  try {
    for (const mode of ['blocking', 'polling'] as const) {
      const r = await rtt.run(mode, 0.2, 0)
      t.true(r.ops > 0, mode)
      t.true(r.avgUs > 0 && r.p50Us > 0 && r.p99Us >= r.p50Us, `${mode}: ${JSON.stringify(r)}`)
      t.regex(rtt.label(mode), /two processes \(fork\)/)
    }
  } finally {
    rtt.close()
  }
})

test('memcpy on N threads reports the sum and each thread', async (t) => {
  t.timeout(30_000)
  const memcpy = await startMemcpyBaseline(65536, 65536, undefined, 2)
  try {
    const r = await memcpy.run(0.2, 0)
    t.true(typeof r.gbps === 'number' && r.gbps > 0, JSON.stringify(r))
    t.true(r.threadGbps !== undefined && r.threadGbps.min > 0 && r.threadGbps.max >= r.threadGbps.min, JSON.stringify(r))
    t.regex(memcpy.label, /^memcpy, 2 thread\(s\) side by side/)
  } finally {
    await memcpy.close()
  }
})

test('bad scale flags exit 2 before anything runs', async (t) => {
  t.timeout(60_000)
  for (const [flag, message] of [
    [['--threads', '0'], /^perf: --threads: expected thread counts 1\.\.1024, got "0"/],
    [['--sizes', '4X'], /^perf: --sizes: expected a whole number of bytes/],
    [['--ops', 'write,mix'], /^perf: --ops: expected write, read/],
    [['--transports', 'rdma'], /^perf: --transports: expected tcp, shm/],
  ] as const) {
    const r = await runPerf(['--suite', 'scale', ...flag])
    t.is(r.code, 2, r.stderr)
    t.regex(r.stderr, message)
    t.is(r.stdout, '')
  }
})

test('--suite scale in its shortest form: one JSON line per transport × threads, with figures and ratios', async (t) => {
  t.timeout(60_000)
  const r = await runPerf(['--suite', 'scale', '--threads', '1,2', '--sizes', '4K', '--repeat', '1', '--duration', '0.2', '--warmup', '0'])
  t.is(r.code, 0, r.stderr)
  const records = r.stdout
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as Record<string, unknown>)
  t.deepEqual(
    records.map((x) => [x.suite, x.case, x.transport, x.opcode, x.block_bytes, x.threads, x.unit]),
    [
      ['scale', 'tcp-write-4KiB-1t', 'tcp', 'write', 4096, 1, 'GB/s'],
      ['scale', 'tcp-write-4KiB-2t', 'tcp', 'write', 4096, 2, 'GB/s'],
      ['scale', 'shm-write-4KiB-1t', 'shm', 'write', 4096, 1, 'GB/s'],
      ['scale', 'shm-write-4KiB-2t', 'shm', 'write', 4096, 2, 'GB/s'],
    ],
    r.stderr,
  )
  const iperf3 = haveIperf3()
  if (!iperf3) t.log('iperf3 is not installed: the tcp records have no baseline')
  for (const x of records) {
    t.is(x.error, undefined, `${x.case}: ${String(x.error)}`)
    t.true(typeof x.value === 'number' && x.value > 0, `${x.case} value ${String(x.value)}`)
    t.true(typeof x.avg_tx_us === 'number' && x.avg_tx_us > 0, `${x.case} avg_tx_us`)
    t.is(typeof x.baseline, 'string')
    t.is((x.rounds as unknown[]).length, 1)
    if (x.transport === 'tcp' && !iperf3) continue
    t.true(typeof x.baseline_value === 'number' && x.baseline_value > 0, `${x.case} baseline_value ${String(x.baseline_value)}`)
    t.true(typeof x.ratio === 'number' && Number.isFinite(x.ratio), `${x.case} ratio ${String(x.ratio)}`)
    t.true(typeof x.engine_speedup === 'number' && typeof x.baseline_speedup === 'number', `${x.case} speed-ups`)
    if (x.transport === 'tcp' && os.availableParallelism() >= 2) {
      t.true(typeof x.companion_baseline === 'string' && /pinned/.test(x.companion_baseline), `${x.case} companion_baseline`)
      t.true(typeof x.companion_ratio === 'number' && Number.isFinite(x.companion_ratio), `${x.case} companion_ratio ${String(x.companion_ratio)}`)
    } else {
      t.is(x.companion_ratio, undefined, `${x.case}: no companion`)
    }
  }
  if (iperf3 && os.availableParallelism() >= 2) t.regex(r.stderr, /iperf3 -c 127\.0\.0\.1 .* -A 1,0/, 'stream 2 of 2 pinned apart')
  t.regex(r.stderr, /transport\s+op\s+block\s+threads\s+engine GB\/s/)
  t.regex(r.stderr, /shm\s+write\s+4 KiB\s+2\s+\d/)
})
