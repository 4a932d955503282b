import test from 'ava'
import { createHash } from 'node:crypto'
import { Engine, FerryError, TransferStatus, type BlocksResult, type FerryErrorCode } from '../index'
import { killAll, startTarget, type TargetProcess } from './helpers'
import { pattern } from './fixtures/pattern'

test.after.always(killAll)

const KiB = 1024
const MiB = 1 << 20
const TARGET_BYTES = 4 * MiB
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

/**
 * A KV-cache-like block list: `n` 4 KiB blocks, local pages in order, remote pages in a
 * seeded shuffle of runs of 1–4 pages (so some neighbours are contiguous on both sides and
 * merge, most do not). Returns the lists and the merged count expected.
 */
function layout(n: number, seed: number) {
  const page = 4 * KiB
  const runs: number[][] = []
  for (let i = 0; i < n; ) {
    const len = Math.min(n - i, 1 + ((i * 7 + seed) % 4))
    runs.push(Array.from({ length: len }, (_, k) => i + k))
    i += len
  }
  // Deterministic shuffle of the runs (remote side).
  let x = seed
  for (let i = runs.length - 1; i > 0; i--) {
    x = (x * 1103515245 + 12345) & 0x7fffffff
    const j = x % (i + 1)
    ;[runs[i], runs[j]] = [runs[j], runs[i]]
  }
  const remotePage = new Array<number>(n)
  let at = 0
  for (const run of runs) for (const b of run) remotePage[b] = at++
  const localOffsets = new Float64Array(n)
  const remoteOffsets = new Float64Array(n)
  let merged = 0
  for (let b = 0; b < n; b++) {
    localOffsets[b] = b * page
    remoteOffsets[b] = remotePage[b] * page
    if (b === 0 || remotePage[b] !== remotePage[b - 1] + 1) merged++
  }
  return { localOffsets, remoteOffsets, page, merged }
}

async function rig(t: { teardown(fn: () => void | Promise<void>): void }, transports: Array<'tcp' | 'shm'>, options: Parameters<typeof Engine.create>[0] = {}) {
  const target: TargetProcess = await startTarget({ FERRY_TARGET_BYTES: String(TARGET_BYTES), FERRY_TARGET_TRANSPORTS: transports.join(',') })
  const engine = await Engine.create({ transports, ...options })
  t.teardown(async () => {
    await engine.close()
    await target.kill()
  })
  const remote = await engine.openSegment(target.segment)
  return { target, engine, remote }
}

for (const transport of ['shm', 'tcp'] as const) {
  test(`writeBlocks and readBlocks move every block over ${transport}, merged and gathered`, async (t) => {
    t.timeout(60_000)
    const { target, engine, remote } = await rig(t, [transport])
    const n = 512
    const { localOffsets, remoteOffsets, page, merged } = layout(n, 11)
    t.true(merged > n / 8 && merged < n, `the layout merges some blocks (${merged} of ${n})`)
    const src = engine.allocate(n * page)
    pattern(5, n * page).copy(src.buffer)
    const w = await engine.writeBlocks({ local: src, remote, remoteBuffer: target.buffer, localOffsets, remoteOffsets, lengths: page, requireTransport: transport })
    t.is(w.requests, 1, `${merged} merged runs of 4 KiB pages (2 MiB in all) gather into one task`)
    t.deepEqual(w.failed, [])
    t.true(w.status instanceof Uint8Array)
    t.is(w.status.length, n)
    t.true(w.status.every((s) => s === TransferStatus.COMPLETED))
    // The target holds each block at its remote page (and zeros past them).
    const expected = Buffer.alloc(TARGET_BYTES)
    for (let b = 0; b < n; b++) src.buffer.copy(expected, remoteOffsets[b], localOffsets[b], localOffsets[b] + page)
    t.is((await target.ask('hash')).hash, sha256(expected))
    // Read them back into reversed local pages, with BigUint64Array offsets and per-block lengths.
    const back = engine.allocate(n * page)
    const rev = new BigUint64Array(n)
    for (let b = 0; b < n; b++) rev[b] = BigInt((n - 1 - b) * page)
    const r = await engine.readBlocks({
      local: back,
      remote,
      remoteBuffer: target.buffer,
      localOffsets: rev,
      remoteOffsets: BigUint64Array.from(remoteOffsets, (v) => BigInt(v)),
      lengths: new Float64Array(n).fill(page),
    })
    t.true(r.status.every((s) => s === TransferStatus.COMPLETED))
    t.is(r.requests, 1, 'reversed local pages never merge; all 512 gather into one task')
    for (let b = 0; b < n; b++) {
      const got = back.buffer.subarray((n - 1 - b) * page, (n - b) * page)
      if (!got.equals(src.buffer.subarray(b * page, (b + 1) * page))) t.fail(`block ${b} differs`)
    }
  })
}

test('per-block regions and segments: arrays of one entry per block', async (t) => {
  t.timeout(60_000)
  const { target, engine, remote } = await rig(t, ['shm'])
  const a = engine.allocate(64 * KiB).fill(0xa1)
  const b = engine.allocate(64 * KiB).fill(0xb2)
  const res = await engine.writeBlocks({
    local: [a, a, b, b],
    remote: [remote, remote, remote, remote],
    remoteBuffer: [target.buffer, target.buffer, target.buffer, target.buffer],
    localOffsets: new Float64Array([0, 4096, 0, 4096]),
    remoteOffsets: new Float64Array([0, 4096, 8192, 12288]),
    lengths: 4096,
  })
  t.is(res.requests, 2, 'contiguous on both sides but another region: not merged across')
  const expected = Buffer.alloc(TARGET_BYTES)
  expected.fill(0xa1, 0, 8192)
  expected.fill(0xb2, 8192, 16384)
  t.is((await target.ask('hash')).hash, sha256(expected))
})

test('a block whose request fails is reported per block; the others complete', async (t) => {
  t.timeout(60_000)
  // The third submission to shm fails, with no failover: the third task fails.
  const { target, engine, remote } = await rig(t, ['shm'], { faults: [{ transport: 'shm', failAfterSubmits: 2 }], maxFailoverAttempts: 0 })
  const [a, b, c] = [1, 2, 3].map(() => engine.allocate(64 * KiB).fill(7))
  // Tasks: blocks 0–1 (merged), block 2 (another region), blocks 3–4 (merged, a third region).
  const res: BlocksResult = await engine.writeBlocks({
    local: [a, a, b, c, c],
    remote,
    remoteBuffer: target.buffer,
    localOffsets: new Float64Array([0, 4096, 16384, 32768, 36864]),
    remoteOffsets: new Float64Array([0, 4096, 65536, 131072, 135168]),
    lengths: 4096,
  })
  t.is(res.requests, 3)
  t.deepEqual([...res.status], [4, 4, 4, 6, 6])
  t.deepEqual(
    res.failed.map((f) => [f.block, f.status]),
    [
      [3, TransferStatus.FAILED],
      [4, TransferStatus.FAILED],
    ],
  )
  t.true(res.failed.every((f) => f.code.startsWith('ERR_FERRY_') && f.message.length > 0), JSON.stringify(res.failed))
})

test('bad block lists are refused with typed errors and move nothing', async (t) => {
  t.timeout(60_000)
  const { target, engine, remote } = await rig(t, ['shm'])
  const src = engine.allocate(64 * KiB).fill(9)
  const before = (await target.ask('hash')).hash
  const f = (...v: number[]) => new Float64Array(v)
  const base = { local: src, remote, remoteBuffer: target.buffer, localOffsets: f(0, 4096), remoteOffsets: f(0, 4096), lengths: 4096 as number | Float64Array }
  const other = await Engine.create({ transports: ['shm'] })
  t.teardown(() => other.close())
  const cases: Array<[string, Record<string, unknown>, FerryErrorCode, RegExp]> = [
    ['zero length', { lengths: f(4096, 0) }, 'ERR_FERRY_INVALID_ARGUMENT', /block 1: length must be > 0/],
    ['last block out of range', { remoteOffsets: f(0, TARGET_BYTES - 100) }, 'ERR_FERRY_OUT_OF_RANGE', /block 1: remote buffer/],
    ['local out of range', { localOffsets: f(0, 64 * KiB - 1) }, 'ERR_FERRY_OUT_OF_RANGE', /block 1: local region/],
    ['plain array', { localOffsets: [0, 4096] }, 'ERR_FERRY_INVALID_ARGUMENT', /localOffsets must be a Float64Array or a BigUint64Array/],
    ['other typed array', { remoteOffsets: new Uint32Array([0, 4096]) }, 'ERR_FERRY_INVALID_ARGUMENT', /remoteOffsets must be a Float64Array/],
    ['fraction', { localOffsets: f(0, 0.5) }, 'ERR_FERRY_INVALID_ARGUMENT', /localOffsets\[1\] must be a non-negative integer/],
    ['2^53', { remoteOffsets: f(0, 2 ** 53) }, 'ERR_FERRY_INVALID_ARGUMENT', /remoteOffsets\[1\]/],
    ['negative', { remoteOffsets: f(0, -4096) }, 'ERR_FERRY_INVALID_ARGUMENT', /remoteOffsets\[1\]/],
    ['length count', { lengths: f(4096) }, 'ERR_FERRY_INVALID_ARGUMENT', /lengths has 1 entries for 2 blocks/],
    ['offset count', { remoteOffsets: f(0) }, 'ERR_FERRY_INVALID_ARGUMENT', /remoteOffsets has 1 entries/],
    ['missing offsets', { localOffsets: undefined }, 'ERR_FERRY_INVALID_ARGUMENT', /localOffsets is required/],
    ['no blocks', { localOffsets: f(), remoteOffsets: f() }, 'ERR_FERRY_INVALID_ARGUMENT', /no blocks given/],
    ['unknown buffer', { remoteBuffer: 999 }, 'ERR_FERRY_UNKNOWN_BUFFER', /999/],
    ['typo', { lenghts: 4096 }, 'ERR_FERRY_INVALID_ARGUMENT', /no field "lenghts"/],
    ['region array count', { local: [src] }, 'ERR_FERRY_INVALID_ARGUMENT', /local has 1 entries for 2 blocks/],
    ['not a region', { local: [src, {}] }, 'ERR_FERRY_INVALID_ARGUMENT', /local\[1\] must be a Region/],
    ['foreign region', { local: other.allocate(64 * KiB) }, 'ERR_FERRY_FOREIGN_HANDLE', /another engine/],
    ['bad transport', { requireTransport: 'udp' }, 'ERR_FERRY_INVALID_ARGUMENT', /requireTransport/],
  ]
  for (const [name, change, code, message] of cases) {
    const err = await t.throwsAsync(engine.writeBlocks({ ...base, ...change } as never), { instanceOf: FerryError }, name)
    t.is((err as FerryError).code, code, `${name}: ${err?.message}`)
    t.regex(err!.message, message, name)
  }
  t.throws(() => engine.submitBlocks(engine.allocateBatch(4), { ...base, opcode: 'copy' } as never), { instanceOf: FerryError })
  t.is((await target.ask('hash')).hash, before, 'nothing moved')
  t.is(engine.metrics().tasksSubmitted, 0, 'nothing was submitted')
})

test('an AbortSignal cancels a block list: aborted before, or while in flight', async (t) => {
  t.timeout(60_000)
  // Every shm submission waits 60 s in the fault layer: the abort lands while it is pending.
  const { target, engine, remote } = await rig(t, ['shm'], { faults: [{ transport: 'shm', delayMs: 60_000 }], attemptTimeoutMs: 0 })
  const src = engine.allocate(64 * KiB)
  const blocks = { local: src, remote, remoteBuffer: target.buffer, localOffsets: new Float64Array([0, 8192]), remoteOffsets: new Float64Array([0, 8192]), lengths: 4096 }
  const early = new AbortController()
  early.abort()
  const e1 = await t.throwsAsync(engine.writeBlocks({ ...blocks, signal: early.signal }))
  t.is((e1 as FerryError).code, 'ABORT_ERR')
  t.is(engine.metrics().tasksSubmitted, 0)
  const ctl = new AbortController()
  const pending = engine.writeBlocks({ ...blocks, signal: ctl.signal })
  ctl.abort()
  const e2 = await t.throwsAsync(pending)
  t.is((e2 as FerryError).code, 'ABORT_ERR')
  t.is((e2 as FerryError).name, 'AbortError')
  t.is(engine.metrics().transfers.canceled, 1, 'the two scattered blocks were one gathered task')
})

test('the batch form: submitBlocks, then poll statuses into caller memory', async (t) => {
  t.timeout(60_000)
  const { target, engine, remote } = await rig(t, ['shm'])
  const n = 64
  const { localOffsets, remoteOffsets, page, merged } = layout(n, 3)
  const src = engine.allocate(n * page)
  pattern(9, n * page).copy(src.buffer)
  t.true(merged > 1)
  // Two regions: the list's first and second halves are a gather each.
  const half = engine.allocate(n * page)
  pattern(10, n * page).copy(half.buffer)
  const local = Array.from({ length: n }, (_, b) => (b < n / 2 ? src : half))
  const tasks = 2
  const batch = engine.allocateBatch(tasks)
  const sub = engine.submitBlocks(batch, { opcode: 'write', local, remote, remoteBuffer: target.buffer, localOffsets, remoteOffsets, lengths: page })
  t.is(sub.firstTask, 0)
  t.is(sub.tasks, tasks)
  t.deepEqual([...sub.starts], [0, n / 2, n])
  t.is(sub.blocks, n)
  const status = new Uint8Array(n)
  const deadline = Date.now() + 20_000
  let open = engine.getBlockStatusInto(batch, sub, status)
  while (open > 0 && Date.now() < deadline) {
    await new Promise((r) => setImmediate(r))
    open = engine.getBlockStatusInto(batch, sub, status)
  }
  t.is(open, 0)
  t.true(status.every((s) => s === TransferStatus.COMPLETED))
  const perTask = new Uint8Array(tasks + 8).fill(255)
  t.is(engine.getTransferStatusInto(batch, perTask), tasks)
  t.true(perTask.subarray(0, tasks).every((s) => s === TransferStatus.COMPLETED))
  t.is(perTask[tasks], 255, 'bytes past the tasks are left alone')
  t.is(engine.getTransferStatusInto(batch, perTask, tasks - 1), 1)
  // A full batch refuses the whole list.
  const e = t.throws(() => engine.submitBlocks(batch, { opcode: 'write', local, remote, remoteBuffer: target.buffer, localOffsets, remoteOffsets, lengths: page }))
  t.is((e as FerryError).code, 'ERR_FERRY_BATCH_FULL')
  const expected = Buffer.alloc(TARGET_BYTES)
  for (let b = 0; b < n; b++) local[b].buffer.copy(expected, remoteOffsets[b], localOffsets[b], localOffsets[b] + page)
  t.is((await target.ask('hash')).hash, sha256(expected))
  t.throws(() => engine.getBlockStatusInto(batch, { ...sub, starts: new Uint32Array([0, 5, 2]) }, status), { message: /never decrease/ })
  const notBytes = t.throws(() => engine.getTransferStatusInto(batch, [0, 0] as never))
  t.is((notBytes as FerryError).code, 'ERR_FERRY_INVALID_ARGUMENT')
  engine.freeBatch(batch)
})
