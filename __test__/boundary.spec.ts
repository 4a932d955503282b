/**
 * The JS boundary: nothing from JS can abort, corrupt or mis-target memory. Large regions,
 * memory JS could detach, handles of another engine, budgets, and values of the wrong type.
 */
import { constants as bufferConstants } from 'node:buffer'
import { spawnSync } from 'node:child_process'
import * as os from 'node:os'
import * as path from 'node:path'
import test from 'ava'
import { Engine, FerryError, MAX_VIEW_BYTES, type Region, type Segment } from '../index'
import { OPCODE_NUMBERS } from '../lib/tables'
import { killAll, startTarget } from './helpers'

test.after.always(killAll)

const GiB = 2 ** 30
const NODE_MAJOR = Number(process.versions.node.split('.')[0])

/** WebAssembly.Memory (the project's TS lib has no WebAssembly types). */
const WasmMemory = (globalThis as unknown as {
  WebAssembly: { Memory: new (d: { initial: number; maximum?: number; shared?: boolean }) => { buffer: ArrayBufferLike } }
}).WebAssembly.Memory

/** Writes `bytes` at the last page of `remote`'s buffer, reads it back, compares. */
async function lastPageRoundTrip(
  t: import('ava').ExecutionContext,
  engine: Engine,
  peer: Segment,
  remote: Region,
  transport: 'shm' | 'tcp',
) {
  const page = 4096
  const at = remote.length - page
  const src = engine.allocate(page)
  const back = engine.allocate(page)
  src.fill(0xc3)
  const w = await engine.write({ local: src, remote: peer, remoteBuffer: remote.id, remoteOffset: at, length: page, requireTransport: transport })
  t.is(w.tasks[0].transport, transport)
  t.true(remote.view(at, page).equals(src.buffer), `${transport}: the target's last page holds the bytes`)
  const r = await engine.read({ local: back, remote: peer, remoteBuffer: remote.id, remoteOffset: at, length: page, requireTransport: transport })
  t.is(r.bytes, page)
  t.true(back.buffer.equals(src.buffer), `${transport}: read back equal`)
}

test('regions beyond 4 GiB: allocated, viewed in windows, a verified transfer at the last page', async (t) => {
  t.timeout(120_000)
  const target = await Engine.create()
  const engine = await Engine.create()
  try {
    const peer = await engine.openSegment(target.segmentName)
    for (const size of [4 * GiB + 8192, 16 * GiB]) {
      const big = target.allocate(size)
      t.is(big.length, size)
      if (size > MAX_VIEW_BYTES) {
        t.throws(() => big.buffer, { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT', message: /region\.view/ })
        t.throws(() => big.view(0, MAX_VIEW_BYTES + 1), { code: 'ERR_FERRY_INVALID_ARGUMENT' })
      } else {
        t.is(big.buffer.length, size, 'one Buffer over all of it where Node allows one that long')
      }
      t.throws(() => big.view(size - 10, 11), { code: 'ERR_FERRY_OUT_OF_RANGE' })
      t.is(big.view(size - 4096).length, 4096)
      const reopened = await engine.openSegment(target.segmentName) // sees the new buffer
      for (const transport of ['shm', 'tcp'] as const) await lastPageRoundTrip(t, engine, reopened, big, transport)
      big.release()
    }
    void peer
  } finally {
    await engine.close()
    await target.close()
  }
})

test("the view limit is the runtime's: buffer.constants.MAX_LENGTH (4 GiB on Node 20, 2^53 - 1 from Node 22)", (t) => {
  t.is(MAX_VIEW_BYTES, bufferConstants.MAX_LENGTH)
  if (NODE_MAJOR >= 22) t.is(MAX_VIEW_BYTES, Number.MAX_SAFE_INTEGER)
  else t.is(MAX_VIEW_BYTES, 2 ** 32)
})

test('a 5 GiB region: one Buffer where Node allows it (22+), a typed error and windows where it does not (20)', async (t) => {
  t.timeout(60_000)
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const size = 5 * GiB
    const page = 4096
    const big = engine.allocate(size) // a memfd touched lazily: only the pages written below are backed
    if (NODE_MAJOR >= 22) {
      const whole = big.buffer
      t.true(Buffer.isBuffer(whole))
      t.is(whole.length, size)
      // The last page round-trips: written through the whole Buffer, read through a window ...
      whole.fill(0x5a, size - page)
      t.true(big.view(size - page, page).every((b) => b === 0x5a), 'a window sees what the whole Buffer wrote')
      // ... and written through a window, read through the whole Buffer.
      big.view(size - 2 * page, page).fill(0xa5)
      t.true(whole.subarray(size - 2 * page, size - page).every((b) => b === 0xa5), 'the whole Buffer sees what a window wrote')
      t.is(whole[size - 2 * page - 1], 0, 'nothing else written')
      t.is(big.view(0, 4 * GiB + page).length, 4 * GiB + page, 'a window over 4 GiB')
    } else {
      const err = t.throws(() => big.buffer, { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT' })
      t.true(err!.message.includes(`MAX_LENGTH = ${2 ** 32}`), `names the limit: ${err!.message}`)
      t.regex(err!.message, /region\.view\(offset, length\)/)
      t.throws(() => big.view(0, 2 ** 32 + 1), { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT', message: /4294967296/ })
      t.is(big.view(0, 2 ** 32).length, 2 ** 32, 'a window of exactly the limit')
      big.view(size - page, page).fill(0x5a)
      t.true(big.view(size - 2 * page).subarray(page).every((b) => b === 0x5a), 'the last page round-trips through windows')
      t.is(big.view(size - 2 * page)[page - 1], 0, 'nothing else written')
    }
    // The binding itself refuses a view over the runtime's limit with a typed error (past
    // the TS layer, which would turn Node's own RangeError into one too): on Node 20 the
    // limit is in reach; from Node 22 on it is 2^53 - 1, which no region reaches, so a
    // lower one is faked in a child below.
    if (MAX_VIEW_BYTES < size) {
      const raw = engine.native((n) => {
        try {
          n.regionView(big.handle, 0, MAX_VIEW_BYTES + 1)
          return undefined
        } catch (e) {
          return e as { code?: string; message?: string }
        }
      })
      t.is(raw?.code, 'ERR_FERRY_INVALID_ARGUMENT', String(raw?.message))
    }
    big.release()
  } finally {
    await engine.close()
  }
})

/**
 * Runs, in a child of this Node, a binding that reads `limit` as the runtime's Buffer limit
 * (`process.getBuiltinModule` replaced before the binding first reads it; index.ts keeps the
 * real one), and asks it for views of `asks` bytes over a region of `size` bytes.
 */
function viewsWithLimit(t: import('ava').ExecutionContext, limit: string, size: number, asks: number[]) {
  const script = `
    const real = process.getBuiltinModule
    process.getBuiltinModule = (id) => (id === 'node:buffer' ? { constants: { MAX_LENGTH: ${limit} } } : real(id))
    const { Engine } = require('./index')
    Engine.create({ transports: ['tcp'] }).then(async (engine) => {
      const out = engine.native((n) => {
        const region = n.allocate(${size})
        return ${JSON.stringify(asks)}.map((len) => {
          try {
            return { len, ok: n.regionView(region.handle, 0, len).length }
          } catch (e) {
            return { len, code: e.code, message: e.message }
          }
        })
      })
      await engine.close()
      console.log(JSON.stringify(out))
    })`
  const run = spawnSync(process.execPath, ['--import=tsx', '-e', script], {
    cwd: path.join(__dirname, '..'),
    encoding: 'utf8',
    timeout: 30_000,
  })
  t.is(run.signal, null, `the child ended by a signal (an abort?): ${run.stderr}`)
  t.is(run.status, 0, run.stderr)
  return JSON.parse(run.stdout.trim().split('\n').pop() ?? 'null') as Array<{ len: number; ok?: number; code?: string; message?: string }>
}

test("the binding reads Node's limit itself: a view over it is a typed error, under it a Buffer", (t) => {
  t.timeout(60_000)
  const [under, at, over] = viewsWithLimit(t, '65536', 1 << 20, [4096, 65536, 65537])
  t.is(under.ok, 4096)
  t.is(at.ok, 65536)
  t.is(over.code, 'ERR_FERRY_INVALID_ARGUMENT', JSON.stringify(over))
  t.regex(over.message ?? '', /at most 65536 bytes .*MAX_LENGTH.*region\.view/)
})

test("an unreadable limit (getBuiltinModule throws) falls back to Node 20's 4 GiB; the exception does not leak", (t) => {
  t.timeout(60_000)
  const [small, over] = viewsWithLimit(t, '(() => { throw new Error("no limit here") })()', 4 * GiB + 8192, [4096, 4 * GiB + 4096])
  t.is(small.ok, 4096, `a pending exception would fail this view: ${JSON.stringify(small)}`)
  t.is(over.code, 'ERR_FERRY_INVALID_ARGUMENT', JSON.stringify(over))
  t.regex(over.message ?? '', /at most 4294967296 bytes/)
})

/** Node's own refusal is in reach where its limit is one a region can pass (Node 20's 4 GiB). */
const nodeRefusalReachable = bufferConstants.MAX_LENGTH <= 64 * GiB
const LIE = 'a limit that lies (above what Node makes) still ends in a typed error, never an abort'
if (nodeRefusalReachable) {
  test(LIE, (t) => {
    t.timeout(60_000)
    const ask = bufferConstants.MAX_LENGTH + 4096
    const [small, over] = viewsWithLimit(t, String(2 ** 40), ask, [4096, ask])
    t.is(small.ok, 4096)
    t.is(over.code, 'ERR_FERRY_INVALID_ARGUMENT', `Node's refusal comes back typed: ${JSON.stringify(over)}`)
    t.regex(over.message ?? '', /refused a Buffer/)
  })
} else {
  // From Node 22 on Node's limit (2^53 - 1) is beyond any region: the binding's check
  // below it is what the faked-limit test above covers.
  test.skip(`${LIE} (skipped: Node ${process.version} makes Buffers up to ${bufferConstants.MAX_LENGTH} bytes, beyond any region)`, (t) => t.pass())
}

test('memory JS can detach is refused; shared memory registers and moves bytes', async (t) => {
  t.timeout(60_000)
  const target = await Engine.create()
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const remote = target.allocate(1 << 20)
    const peer = await engine.openSegment(target.segmentName)
    const ab = new ArrayBuffer(1 << 16)
    for (const plain of [Buffer.from(ab), new Uint8Array(ab), new DataView(ab), Buffer.alloc(64), new Float64Array(8)]) {
      const err = t.throws(() => engine.registerMemory(plain), { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT' })
      t.regex(err!.message, /SharedArrayBuffer/)
    }
    // The same refusal natively, past the TS layer.
    t.throws(() => engine.native((n) => n.registerMemory(new Uint8Array(ab))), { code: 'ERR_FERRY_INVALID_ARGUMENT' })
    t.throws(() => engine.registerMemory('nope' as never), { code: 'ERR_FERRY_INVALID_ARGUMENT' })
    t.is(engine.metrics().regions, 0, 'no region was registered')

    // A detach attempt cannot happen on shared memory: structuredClone refuses to transfer it.
    const sab = new SharedArrayBuffer(1 << 16)
    const region = engine.registerMemory(new Uint32Array(sab, 4096, 1024))
    t.is(region.length, 4096)
    t.throws(() => structuredClone(sab, { transfer: [sab as unknown as ArrayBuffer] }))
    new Uint8Array(sab, 4096, 4096).fill(0x7e)
    await engine.write({ local: region, remote: peer, remoteBuffer: remote.id, length: 4096 })
    t.true(remote.view(0, 4096).every((b) => b === 0x7e))
    // A shared WebAssembly.Memory's buffer is a SharedArrayBuffer: accepted.
    const wasm = new WasmMemory({ initial: 1, maximum: 2, shared: true })
    const wr = engine.registerMemory(new Uint8Array(wasm.buffer))
    await engine.read({ local: wr, remote: peer, remoteBuffer: remote.id, length: 4096 })
    t.is(new Uint8Array(wasm.buffer)[4095], 0x7e)
    t.throws(() => engine.registerMemory(new Uint8Array(new WasmMemory({ initial: 1 }).buffer)), { code: 'ERR_FERRY_INVALID_ARGUMENT' })
  } finally {
    await engine.close()
    await target.close()
  }
})

test("handles belong to their engine: another engine's region or segment is refused and moves nothing", async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(1 << 20) })
  const a = await Engine.create()
  const b = await Engine.create()
  try {
    await target.ask('fill 9')
    const before = (await target.ask('hash')).hash
    const regionA = a.allocate(4096).fill(0xaa)
    const regionB = b.allocate(4096).fill(0xbb)
    const segA = await a.openSegment(target.segment)
    const segB = await b.openSegment(target.segment)
    t.not(regionA.handle, regionB.handle)
    const req = { remoteBuffer: target.buffer, length: 4096 }
    await t.throwsAsync(() => a.write({ ...req, local: regionB, remote: segA }), { code: 'ERR_FERRY_FOREIGN_HANDLE' })
    await t.throwsAsync(() => a.write({ ...req, local: regionA, remote: segB }), { code: 'ERR_FERRY_FOREIGN_HANDLE' })
    t.throws(() => a.closeSegment(segB), { code: 'ERR_FERRY_FOREIGN_HANDLE' })
    // Natively too: the binding decodes every handle against its engine.
    const native = (local: Region, seg: Segment) => ({ opcode: OPCODE_NUMBERS.write, local: local.handle, segment: seg.handle, remoteBuffer: target.buffer, length: 4096 })
    const batch = a.allocateBatch(2)
    t.throws(() => a.native((n) => n.submitTransfer(batch, [native(regionB, segA)])), { code: 'ERR_FERRY_FOREIGN_HANDLE', message: /another engine/ })
    t.throws(() => a.native((n) => n.submitTransfer(batch, [native(regionA, segB)])), { code: 'ERR_FERRY_FOREIGN_HANDLE' })
    // A handle of another kind is not a region.
    t.throws(() => a.native((n) => n.submitTransfer(batch, [{ ...native(regionA, segA), local: segA.handle }])), { code: 'ERR_FERRY_FOREIGN_HANDLE', message: /segment handle/ })
    t.throws(() => a.native((n) => n.release(regionB.handle)), { code: 'ERR_FERRY_FOREIGN_HANDLE' })
    t.throws(() => a.native((n) => n.regionView(regionB.handle, 0, 16)), { code: 'ERR_FERRY_FOREIGN_HANDLE' })
    t.throws(() => a.getBatchStatus(b.allocateBatch(1)), { code: 'ERR_FERRY_INVALID_BATCH' })
    t.is(a.getBatchStatus(batch).tasks, 0)
    t.is((await target.ask('hash')).hash, before, 'target memory unchanged')
    // The engine's own handles still work.
    await a.write({ ...req, local: regionA, remote: segA })
    t.not((await target.ask('hash')).hash, before)
  } finally {
    await a.close()
    await b.close()
    await target.kill()
  }
})

test('failover budgets: out of range refused at create; the largest one runs iteratively', async (t) => {
  t.timeout(60_000)
  for (const bad of [100_000, -1, 1.5, 1001]) {
    await t.throwsAsync(() => Engine.create({ maxFailoverAttempts: bad }), { code: 'ERR_FERRY_INVALID_ARGUMENT', message: /maxFailoverAttempts/ })
  }
  const target = await Engine.create()
  // Both transports fail every submission at once: each failover resubmits on the other and
  // fails again inside submit — 1000 switches, none of them on a deeper stack.
  const engine = await Engine.create({
    maxFailoverAttempts: 1000,
    faults: [
      { transport: 'tcp', submitFailureRate: 1 },
      { transport: 'shm', submitFailureRate: 1 },
    ],
  })
  try {
    const remote = target.allocate(4096)
    const peer = await engine.openSegment(target.segmentName)
    const local = engine.allocate(4096)
    const err = await t.throwsAsync(() => engine.write({ local, remote: peer, remoteBuffer: remote.id, length: 4096 }), { instanceOf: FerryError })
    t.is(err!.attempts, 1001)
    t.is(engine.metrics().failovers, 1000)
  } finally {
    await engine.close()
    await target.close()
  }
})

test('numbers are checked, never truncated; options are checked by name', async (t) => {
  t.timeout(60_000)
  const engine = await Engine.create()
  try {
    const code = 'ERR_FERRY_INVALID_ARGUMENT'
    for (const bad of [1.5, 2 ** 32 + 1, -1, Number.NaN, '4' as unknown as number, 4n as unknown as number, null as unknown as number]) {
      t.throws(() => engine.allocateBatch(bad), { instanceOf: FerryError, code }, `allocateBatch(${String(bad)})`)
    }
    const batch = engine.allocateBatch(1)
    for (const bad of [0.9, Number.NaN, -1, '0' as unknown as number]) {
      t.throws(() => engine.getTransferStatus(batch, bad), { code }, `task ${String(bad)}`)
    }
    t.throws(() => engine.getTransferStatus(batch, 2 ** 32), { code: 'ERR_FERRY_INVALID_TASK' })
    t.throws(() => engine.getBatchStatus(batch + 0.5), { code })
    t.throws(() => engine.submitTransfer(batch + 0.5, []), { code })
    for (const bad of [-1, 2 ** 53, 1.5, '4096' as unknown as number, 4096n as unknown as number]) {
      t.throws(() => engine.allocate(bad), { code }, `allocate(${String(bad)})`)
    }
  } finally {
    await engine.close()
  }
  const options: Array<[Record<string, unknown>, RegExp]> = [
    [{ peerTimeoutMs: -1 }, /peerTimeoutMs/],
    [{ peerTimeoutMs: '3000' }, /peerTimeoutMs must be a number, got a string/],
    [{ attemptTimeoutMs: -5 }, /attemptTimeoutMs/],
    [{ peerTimeoutMS: 3000 }, /"peerTimeoutMS"/],
    [{ rdma: { qpsPerPeer: 'two' } }, /rdma\.qpsPerPeer must be a number/],
    [{ rdma: { qpsPerPer: 2 } }, /"rdma\.qpsPerPer"/],
    [{ faults: [{ transport: 'tcp', sed: 1 }] }, /"faults\[0\]\.sed"/],
    [{ transports: 'tcp' }, /transports must be an array/],
    [{ transports: ['tcp', 'smoke'] }, /transports/],
    [{ ioThreads: 0 }, /ioThreads/],
    [{ ioThreads: 'many' }, /ioThreads must be a whole number or 'auto', got "many"/],
    [{ connectionsPerPeer: 'Auto' }, /connectionsPerPeer must be a whole number or 'auto'/],
    [{ connectionsPerPeer: 65 }, /connectionsPerPeer/],
    [{ connectionsPerPeer: 2.5 }, /connectionsPerPeer/],
    [{ listen: 7 }, /listen must be a string, got a number/],
    [{ enableAutoFailoverOnPoll: 'yes' }, /enableAutoFailoverOnPoll must be a boolean/],
    [{ leaseTtlMs: 1500, metadata: 'etcd://127.0.0.1:1' }, /leaseTtlMs/],
  ]
  for (const [o, message] of options) {
    await t.throwsAsync(() => Engine.create(o as never), { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT', message }, JSON.stringify(o))
  }
  for (const o of [null, 5, 'x', [], () => 1]) {
    await t.throwsAsync(() => Engine.create(o as never), { code: 'ERR_FERRY_INVALID_ARGUMENT' }, `options ${String(o)}`)
  }
})

test('ioThreads and connectionsPerPeer take a number or auto; spread() reports what the engine uses', async (t) => {
  t.timeout(60_000)
  const fixed = await Engine.create({ ioThreads: 3, connectionsPerPeer: 5, transports: ['tcp', 'shm'] })
  try {
    t.deepEqual({ ...fixed.spread(), shmCopyThreads: null }, { ioThreads: 3, tcpLanes: 5, shmCopyThreads: null })
    t.true(Number.isInteger(fixed.spread().shmCopyThreads))
  } finally {
    await fixed.close()
  }
  const auto = await Engine.create({ ioThreads: 'auto', connectionsPerPeer: 'auto', transports: ['tcp'] })
  const byDefault = await Engine.create({ transports: ['tcp'] })
  try {
    const cores = os.availableParallelism()
    // Documented: one I/O thread per core within 2..32, one lane per core within 2..32.
    const want = { ioThreads: Math.min(32, Math.max(2, cores)), tcpLanes: Math.min(32, Math.max(2, cores)), shmCopyThreads: null }
    t.deepEqual(auto.spread(), want)
    t.deepEqual(byDefault.spread(), want)
  } finally {
    await auto.close()
    await byDefault.close()
  }
})

test('Promise methods reject, never throw, on bad input; bench after close is refused', async (t) => {
  t.timeout(60_000)
  const engine = await Engine.create()
  const code = 'ERR_FERRY_INVALID_ARGUMENT'
  const calls: Array<[string, () => Promise<unknown>]> = [
    ['write(undefined)', () => engine.write(undefined as never)],
    ['write(null)', () => engine.write(null as never)],
    ['read(5)', () => engine.read(5 as never)],
    ['transfer(undefined)', () => engine.transfer(undefined as never)],
    ['transfer([null])', () => engine.transfer([null as never])],
    ['openSegment(7)', () => engine.openSegment(7 as never)],
  ]
  for (const [what, call] of calls) {
    let p: Promise<unknown> | undefined
    t.notThrows(() => {
      p = call()
    }, `${what} throws synchronously`)
    await t.throwsAsync(() => p!, { instanceOf: FerryError, code }, what)
  }
  const local = engine.allocate(4096)
  const target = await Engine.create()
  const peer = await engine.openSegment(target.segmentName)
  const remote = target.allocate(4096)
  await t.throwsAsync(() => engine.write({ local, remote: peer, remoteBuffer: remote.id, length: 4096, signal: 'x' as never }), { code, message: /AbortSignal/ })
  await t.throwsAsync(() => engine.write({ local, remote: peer, remoteBuffer: remote.id, lenght: 4096 } as never), { code, message: /"lenght"/ })
  await target.close()
  await engine.close()
  t.throws(() => engine.bench(2), { code: 'ERR_FERRY_CLOSED' })
})

test('Node idioms: await using, segment.close(), TypedArrays, FERRY_LOG without colour in a pipe', async (t) => {
  t.timeout(60_000)
  const target = await Engine.create()
  let kept: Engine | undefined
  {
    await using engine = await Engine.create()
    kept = engine
    const remote = target.allocate(4096)
    const peer = await engine.openSegment(target.segmentName)
    const local = engine.registerMemory(new Float64Array(new SharedArrayBuffer(4096)).fill(1.5))
    await engine.write({ local, remote: peer, remoteBuffer: remote.id, length: 4096 })
    t.is(new Float64Array(remote.view(0, 4096).buffer, remote.view(0, 4096).byteOffset, 512)[511], 1.5)
    peer.close()
    await t.throwsAsync(() => engine.write({ local, remote: peer, remoteBuffer: remote.id, length: 4096 }), { code: 'ERR_FERRY_UNKNOWN_SEGMENT' })
  }
  t.true(kept!.closed, 'await using closed the engine')
  await target.close()

  const script = "require('./index').Engine.create().then((e) => e.close())"
  const run = spawnSync(process.execPath, ['--import=tsx', '-e', script], {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, FERRY_LOG: 'debug' },
    encoding: 'utf8',
    timeout: 30_000,
  })
  t.is(run.status, 0, run.stderr)
  t.regex(run.stderr, /engine started/)
  t.false(run.stderr.includes('\u001b['), 'no ANSI escape codes on a pipe')
})
