/**
 * The perf suites' round runner (bench/lib/rounds.ts) with fake measurements: the order of
 * the steps in odd and even rounds, warm-up in round 1 only, errors kept per round, the
 * method choice when the budget is exceeded, and the comparison of figures with baselines.
 */
import test from 'ava'
import { compare, figures, perMethod, roundErrors, runRounds, type Method, type RoundContext } from '../bench/lib/rounds'
import { parseCpuTimes, stealPercent } from '../bench/lib/steal'
import type { SuiteOptions } from '../bench/suites/types'

function options(over: Partial<SuiteOptions> = {}): SuiteOptions {
  return {
    durationSeconds: 1,
    warmupSeconds: 2,
    latencyOps: 1,
    latencyMaxSeconds: 1,
    window: 1,
    batchTasks: 1,
    batchesInFlight: 1,
    workingSetBytes: 1 << 20,
    coldWorkingSetBytes: 1 << 20,
    cold: false,
    shmWorkingSetBytes: 1 << 20,
    failoverWorkingSetBytes: 1 << 20,
    faultRate: 0,
    faultSeed: 0,
    repeat: 3,
    // Far more than these runs take: both methods every round.
    budgetSeconds: 1e9,
    trials: 1,
    peerTimeoutMs: 100,
    soakWarmup: 1,
    soakTransfers: 1,
    soakSampleEvery: 1,
    cases: [],
    scaleThreads: [],
    scaleSizes: [4096],
    scaleOps: ['write'],
    scaleTransports: ['tcp'],
    scaleCompanion: true,
    ioThreads: 0,
    lanes: 0,
    stormEngines: 2,
    stormProcs: 1,
    stormTimeoutSeconds: 1,
    stormTransports: 'tcp',
    stormNofile: 0,
    ...over,
  }
}

/** A plan over `entries` whose measurements return `fig(entry, method, round)` and note each step. */
function plan<K extends string>(o: SuiteOptions, entries: readonly K[], fig: (e: K, m: Method, r: number) => number) {
  const steps: string[] = []
  const warms: number[] = []
  return {
    steps,
    warms,
    plan: {
      suite: 'fake',
      options: o,
      entries,
      measure: async (e: K, m: Method, ctx: RoundContext) => {
        steps.push(`${ctx.round + 1}:${e}:${m}`)
        warms.push(ctx.warm)
        return fig(e, m, ctx.round)
      },
      starting: (e: K, m: Method, { tag }: RoundContext) => `${tag}: ${e} ${m}`,
      finished: (e: K, m: Method, x: number, { tag }: RoundContext) => `${tag}: ${e} ${m} ${x}`,
      others: [
        async (ctx: RoundContext) => {
          steps.push(`${ctx.round + 1}:baseline`)
          warms.push(ctx.warm)
        },
      ],
      figure: (x: number) => x,
      higherIsBetter: true,
    },
  }
}

test('odd rounds run entries then baselines, even rounds the reverse; warm-up in round 1 only', async (t) => {
  const p = plan(options(), ['a', 'b'] as const, () => 1)
  const out = await runRounds(p.plan)
  t.deepEqual(p.steps, [
    '1:a:promise', '1:a:batch', '1:b:promise', '1:b:batch', '1:baseline',
    '2:baseline', '2:b:batch', '2:b:promise', '2:a:batch', '2:a:promise',
    '3:a:promise', '3:a:batch', '3:b:promise', '3:b:batch', '3:baseline',
  ])
  t.deepEqual(p.warms, [2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
  t.is(out.chosen, undefined)
  t.deepEqual(out.engine.a.promise, [1, 1, 1])
})

test('a failed measurement is kept as that round\'s error and the rounds go on', async (t) => {
  const p = plan(options(), ['a', 'b'] as const, (e, m, r) => {
    if (e === 'b' && m === 'batch' && r === 1) throw new Error('boom')
    return r
  })
  const out = await runRounds(p.plan)
  t.true(out.engine.b.batch[1] instanceof Error)
  t.deepEqual(out.engine.b.promise, [0, 1, 2])
  t.deepEqual(roundErrors(out.engine.b.batch, 'batch'), ['round 2 batch: boom'])
  t.deepEqual(figures(out.engine.b.batch, 3, (x) => x, 3), [0, null, 2])
  t.is(p.steps.length, 15)
})

test('over the budget, rounds 2.. measure only the method each entry did better with in round 1', async (t) => {
  // a: batch better; b: promise better (higher is better).
  const fig = (e: string, m: Method) => (e === 'a' ? (m === 'batch' ? 2 : 1) : m === 'batch' ? 1 : 3)
  const p = plan(options({ budgetSeconds: -1 }), ['a', 'b'] as const, fig)
  const out = await runRounds(p.plan)
  t.deepEqual(out.chosen, { a: 'batch', b: 'promise' })
  t.deepEqual(p.steps.slice(5), ['2:baseline', '2:b:promise', '2:a:batch', '3:a:batch', '3:b:promise', '3:baseline'])
  // Unmeasured rounds stay empty, and their figures null.
  t.deepEqual(figures(out.engine.a.promise, 3, (x) => x, 3), [1, null, null])
})

test('with chooseBy, one entry\'s round 1 picks the method of every entry; lower may be better', async (t) => {
  const fig = (e: string, m: Method) => (e === 'faulty' ? (m === 'batch' ? 5 : 9) : m === 'batch' ? 9 : 5)
  const p = plan(options({ budgetSeconds: -1, repeat: 2 }), ['clean', 'faulty'] as const, fig)
  const out = await runRounds({ ...p.plan, chooseBy: 'faulty' as const, higherIsBetter: false })
  t.deepEqual(out.chosen, { clean: 'batch', faulty: 'batch' })
  t.deepEqual(p.steps.slice(5), ['2:baseline', '2:faulty:batch', '2:clean:batch'])
})

test('one round never triggers the method choice', async (t) => {
  const p = plan(options({ budgetSeconds: -1, repeat: 1 }), ['a'] as const, () => 1)
  const out = await runRounds(p.plan)
  t.is(out.chosen, undefined)
  t.deepEqual(p.steps, ['1:a:promise', '1:a:batch', '1:baseline'])
})

test('compare: the better median (or the chosen method) against its baseline, per round and as medians', (t) => {
  const byMethod = { promise: [1, 2, 3], batch: [2, 4, null] }
  const base = [2, 2, 2]
  const better = compare(byMethod, undefined, true, () => base, 3)
  t.is(better.method, 'batch')
  t.deepEqual(better.rounds, [2, 4, null])
  t.is(better.value, 3)
  t.is(better.baselineValue, 2)
  t.is(better.ratio, 1.5)
  t.deepEqual(better.ratioPerRound, [1, 2, null])
  t.is(better.ratioMedian, 1.5)
  const chosen = compare(byMethod, 'promise', true, (m) => (m === 'promise' ? [1, 1, 1] : base), 3)
  t.deepEqual([chosen.method, chosen.value, chosen.baselineValue, chosen.ratio], ['promise', 2, 1, 2])
  // Lower is better (latency): promise's median 2 beats batch's 3.
  t.is(compare(byMethod, undefined, false, () => base, 1).method, 'promise')
  // No baseline: no ratios.
  const none = compare(byMethod, undefined, true, () => [], 3)
  t.deepEqual([none.baselineValue, none.ratio, none.ratioMedian], [null, null, null])
})

test('perMethod rounds each method\'s figures and leaves unmeasured rounds null', (t) => {
  const series = { promise: [1.23456, new Error('x'), undefined], batch: [2.5, 3.5, 4.5] }
  t.deepEqual(perMethod(series, 3, (x) => x, 2), { promise: [1.23, null, null], batch: [2.5, 3.5, 4.5] })
})

test('steal is read from /proc/stat as a share of all CPU time between two readings', (t) => {
  // user nice system idle iowait irq softirq steal guest guest_nice
  const a = parseCpuTimes('cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 1 2 3\n')
  const b = parseCpuTimes('cpu  200 0 100 1500 0 0 0 200 0 0\n')
  t.deepEqual(a, { steal: 50, total: 1000 })
  // 1000 jiffies passed, 150 of them stolen.
  t.is(stealPercent(a, b), 15)
  t.is(stealPercent(b, a), null, 'no progress: no figure')
  t.is(stealPercent(null, b), null)
  t.is(parseCpuTimes('intr 1 2 3'), null)
  t.is(parseCpuTimes('cpu 1 2 x 4 5 6 7 8'), null)
})
