/**
 * The shm sweep's dip judgment (bench/lib/sweep-dips.ts): a fall counts as a dip only where
 * the engine falls more than 10 % from the next smaller size and more than 10 % below
 * memcpy's step at the same sizes in the same run.
 */
import test from 'ava'
import { sweepSteps, type SweepPoint } from '../bench/lib/sweep-dips'

const K = 1024
const M = K * K

test('a fall that memcpy makes too is no dip: the caches bound it', (t) => {
  // 1 thread at the L2's edge: memcpy −22 %, the engine −23 %.
  const steps = sweepSteps([
    { size: 256 * K, engine: 20, memcpy: 25 },
    { size: 512 * K, engine: 15.4, memcpy: 19.5 },
  ])
  t.deepEqual(
    steps.map((s) => s.dip),
    [false, false],
  )
  t.is(steps[0].engineStep, null)
  t.is(Math.round(steps[1].engineStep! * 100), 77)
  t.is(Math.round(steps[1].memcpyStep! * 100), 78)
})

test('a fall more than 10 % below memcpy’s is a dip', (t) => {
  const points: SweepPoint[] = [
    { size: 256 * K, engine: 20, memcpy: 25 },
    // memcpy −5 %, the engine −20 %.
    { size: 512 * K, engine: 16, memcpy: 23.75 },
    // memcpy −40 %, the engine −45 %: within 10 % of memcpy's step.
    { size: 1 * M, engine: 8.8, memcpy: 14.25 },
  ]
  t.deepEqual(
    sweepSteps(points).map((s) => s.dip),
    [false, true, false],
  )
})

test('memcpy rising asks only that the engine not fall', (t) => {
  const points: SweepPoint[] = [
    { size: 4 * K, engine: 10, memcpy: 20 },
    // memcpy +50 %, the engine +2 %: not a dip, it did not fall.
    { size: 8 * K, engine: 10.2, memcpy: 30 },
    // memcpy +50 %, the engine −15 %: a dip.
    { size: 16 * K, engine: 8.67, memcpy: 45 },
  ]
  t.deepEqual(
    sweepSteps(points).map((s) => s.dip),
    [false, false, true],
  )
})

test('without memcpy the plain rule holds: more than 10 % below the next smaller size', (t) => {
  const points: SweepPoint[] = [
    { size: 4 * M, engine: 10, memcpy: null },
    { size: 8 * M, engine: 9.1, memcpy: null },
    { size: 16 * M, engine: 8, memcpy: Number.NaN },
  ]
  t.deepEqual(
    sweepSteps(points).map((s) => [s.dip, s.memcpyStep]),
    [
      [false, null],
      [false, null],
      [true, null],
    ],
  )
})

test('a fall to the memory’s limit, memcpy on every core at that size, is no dip', (t) => {
  // 1 thread, its copies shared with the idle core: the cliff comes a size later than
  // one-thread memcpy's, where the engine still copies as fast as memcpy on both cores.
  const points: SweepPoint[] = [
    { size: 512 * K, engine: 55, memcpy: 25, memoryLimit: 42 },
    { size: 1 * M, engine: 30, memcpy: 24, memoryLimit: 23.5 },
    // Below the limit: a dip.
    { size: 2 * M, engine: 20, memcpy: 23.3, memoryLimit: 23 },
  ]
  t.deepEqual(
    sweepSteps(points).map((s) => s.dip),
    [false, false, true],
  )
})

test('a fall to within 5 % of memcpy on every core is the memory’s limit; further below it is a dip', (t) => {
  // Measured on a 2-core VM: one thread's 4 MiB WRITE at 28.6 GB/s, memcpy on both cores
  // 29.0, after 55.4 at 2 MiB (copies shared over both cores' caches).
  const step = (engine: number) =>
    sweepSteps([
      { size: 2 * M, engine: 55.4, memcpy: 13.8, memoryLimit: 29.9 },
      { size: 4 * M, engine, memcpy: 13.5, memoryLimit: 29.0 },
    ])[1].dip
  t.false(step(28.6))
  t.false(step(27.6))
  t.true(step(27.4))
})

