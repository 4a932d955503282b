import test from 'ava'
import { Engine, FerryError, type Region, type Segment } from '../index'
import { native } from '../lib/native'
import { OPCODE_NUMBERS, TRANSPORT_NUMBERS } from '../lib/tables'
import { killAll, startTarget, type TargetProcess } from './helpers'

test.after.always(killAll)

const SIZE = 1 << 20

interface Ctx {
  target: TargetProcess
  engine: Engine
  local: Region
  seg: Segment
  before: string
}

async function setup(): Promise<Ctx> {
  const target = await startTarget({ FERRY_TARGET_BYTES: String(SIZE) })
  await target.ask('fill 3')
  const before = String((await target.ask('hash')).hash)
  const engine = await Engine.create()
  const local = engine.allocate(SIZE)
  local.buffer.fill(0xee)
  const seg = await engine.openSegment(target.segment)
  return { target, engine, local, seg, before }
}

test('bad requests are rejected with their code and change nothing on the target', async (t) => {
  t.timeout(60_000)
  const { target, engine, local, seg, before } = await setup()
  try {
    const good = { local, remote: seg, remoteBuffer: target.buffer, remoteOffset: 0, length: 4096 }
    const cases: Array<[string, Record<string, unknown>, string]> = [
      ['remote offset outside the buffer', { remoteOffset: SIZE - 100 }, 'ERR_FERRY_OUT_OF_RANGE'],
      ['remote offset past the end', { remoteOffset: SIZE }, 'ERR_FERRY_OUT_OF_RANGE'],
      ['length larger than the buffer', { length: SIZE + 1 }, 'ERR_FERRY_OUT_OF_RANGE'],
      ['offset + length overflowing', { remoteOffset: Number.MAX_SAFE_INTEGER }, 'ERR_FERRY_OUT_OF_RANGE'],
      ['local offset outside the region', { localOffset: SIZE - 1 }, 'ERR_FERRY_OUT_OF_RANGE'],
      ['zero length', { length: 0 }, 'ERR_FERRY_INVALID_ARGUMENT'],
      ['negative length', { length: -1 }, 'ERR_FERRY_INVALID_ARGUMENT'],
      ['fractional offset', { remoteOffset: 1.5 }, 'ERR_FERRY_INVALID_ARGUMENT'],
      ['NaN length', { length: Number.NaN }, 'ERR_FERRY_INVALID_ARGUMENT'],
      ['unknown remote buffer', { remoteBuffer: 4242 }, 'ERR_FERRY_UNKNOWN_BUFFER'],
      ['unknown transport', { transport: 'carrier-pigeon' }, 'ERR_FERRY_INVALID_ARGUMENT'],
      ['not a Region', { local: { id: 0 } }, 'ERR_FERRY_INVALID_ARGUMENT'],
    ]
    for (const [what, patch, code] of cases) {
      const req = { ...good, ...patch } as Parameters<Engine['write']>[0]
      await t.throwsAsync(() => engine.write(req), { instanceOf: FerryError, code }, `write: ${what}`)
      await t.throwsAsync(() => engine.read(req), { instanceOf: FerryError, code }, `read: ${what}`)
      const batch = engine.allocateBatch(4)
      t.throws(() => engine.submitTransfer(batch, [{ ...req, opcode: 'write' }]), { code }, `batch: ${what}`)
      t.is(engine.getBatchStatus(batch).tasks, 0, 'a refused submission leaves no task')
      engine.freeBatch(batch)
    }
    // A bad request beside good ones refuses the whole submission.
    await t.throwsAsync(
      () => engine.transfer([{ ...good, opcode: 'write' }, { ...good, opcode: 'write', length: 0 }]),
      { code: 'ERR_FERRY_INVALID_ARGUMENT' },
    )

    // unknown and closed segments
    const other = await engine.openSegment(target.segment)
    t.is(other.handle, seg.handle, 'opening twice returns the same segment')
    await t.throwsAsync(() => engine.openSegment('127.0.0.1:1'), { code: 'ERR_FERRY_CONNECT' })
    await t.throwsAsync(() => engine.openSegment('no-port'), { code: 'ERR_FERRY_INVALID_ARGUMENT' })

    // released region
    const scratch = engine.allocate(4096)
    scratch.release()
    await t.throwsAsync(() => engine.write({ ...good, local: scratch }), { code: 'ERR_FERRY_UNKNOWN_REGION' })
    t.throws(() => scratch.release(), { code: 'ERR_FERRY_UNKNOWN_REGION' })
    t.is(scratch.buffer.length, 4096, 'the Buffer of a released region stays readable')
    scratch.buffer[0] = 1

    // freed, stale and foreign batches
    const batch = engine.allocateBatch(2)
    engine.freeBatch(batch)
    t.throws(() => engine.getBatchStatus(batch), { code: 'ERR_FERRY_INVALID_BATCH' })
    t.throws(() => engine.getTransferStatus(batch, 0), { code: 'ERR_FERRY_INVALID_BATCH' })
    t.throws(() => engine.getTransferStatusList(batch), { code: 'ERR_FERRY_INVALID_BATCH' })
    t.throws(() => engine.submitTransfer(batch, [{ ...good, opcode: 'write' }]), { code: 'ERR_FERRY_INVALID_BATCH' })
    t.throws(() => engine.freeBatch(batch), { code: 'ERR_FERRY_INVALID_BATCH' })
    t.throws(() => engine.getBatchStatus(12345), { code: 'ERR_FERRY_INVALID_BATCH' })
    const live = engine.allocateBatch(1)
    t.throws(() => engine.getTransferStatus(live, 5), { code: 'ERR_FERRY_INVALID_TASK' })
    t.throws(() => engine.submitTransfer(live, [{ ...good, opcode: 'write' }, { ...good, opcode: 'write' }]), {
      code: 'ERR_FERRY_BATCH_FULL',
    })
    t.throws(() => engine.allocateBatch(0), { code: 'ERR_FERRY_INVALID_ARGUMENT' })
    t.throws(() => engine.allocate(0), { code: 'ERR_FERRY_INVALID_ARGUMENT' })

    // closed segment
    engine.closeSegment(seg)
    await t.throwsAsync(() => engine.write(good), { code: 'ERR_FERRY_UNKNOWN_SEGMENT' })
    t.throws(() => engine.closeSegment(seg), { code: 'ERR_FERRY_UNKNOWN_SEGMENT' })

    t.is((await target.ask('hash')).hash, before, 'target memory unchanged')
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('the binding refuses opcode and transport numbers outside the core\'s tables with ERR_FERRY_INVALID_ARGUMENT', async (t) => {
  t.timeout(60_000)
  const { target, engine, local, seg, before } = await setup()
  try {
    const code = 'ERR_FERRY_INVALID_ARGUMENT'
    const write = OPCODE_NUMBERS.write
    const tcp = TRANSPORT_NUMBERS.tcp
    // What the binding would do with a number: a typed refusal, never a panic or a guess.
    const one = (opcode: number, transport: number, requireTransport: number) => () =>
      engine.native((n) => n.transferOne(opcode, local.handle, 0, seg.handle, target.buffer, 0, 4096, transport, requireTransport))
    for (const bad of [2, 255, -1, 0.5, Number.NaN, 2 ** 32]) {
      t.throws(one(bad, 0, 0), { code, message: /opcode must be 0 \(read\) or 1 \(write\), got/ }, `opcode ${bad}`)
    }
    for (const bad of [4, 99, -1, 1.5, 2 ** 40]) {
      t.throws(one(write, bad, 0), { code, message: /transport must be 0 \(none\), 1 \(tcp\), 2 \(shm\) or 3 \(rdma\), got/ }, `transport ${bad}`)
      t.throws(one(write, 0, bad), { code, message: /requireTransport must be/ }, `requireTransport ${bad}`)
    }
    const request = { opcode: write, local: local.handle, segment: seg.handle, remoteBuffer: target.buffer, length: 4096 }
    const batch = engine.allocateBatch(4)
    t.throws(() => engine.native((n) => n.submitTransfer(batch, [{ ...request, opcode: 7 }])), { code, message: /request 0: opcode/ })
    t.throws(() => engine.native((n) => n.submitTransfer(batch, [{ ...request, transport: 9 }])), { code, message: /request 0: transport/ })
    t.throws(() => engine.native((n) => n.transfer([request, { ...request, requireTransport: 5 }])), { code, message: /request 1: requireTransport/ })
    const list = { local: local.handle, remote: seg.handle, remoteBuffer: target.buffer, localOffsets: new Float64Array([0]), remoteOffsets: new Float64Array([0]), lengths: 4096 }
    t.throws(() => engine.native((n) => n.transferBlocks(3, list)), { code, message: /opcode must be/ })
    t.throws(() => engine.native((n) => n.submitBlocks(batch, write, { ...list, transport: 4 })), { code, message: /transport must be/ })
    t.throws(() => engine.native((n) => n.transferBlocks(write, { ...list, requireTransport: -3 })), { code, message: /requireTransport must be/ })
    t.is(engine.getBatchStatus(batch).tasks, 0, 'nothing was submitted')
    const bench = engine.native((n) => new native.NativeBench(n, 1))
    try {
      const benchCase = {
        opcode: write,
        blockSize: 4096,
        batchSize: 1,
        local: local.handle,
        segment: seg.handle,
        peer: seg.name,
        remoteBuffer: target.buffer,
        stripeBase: 0,
        stripeLen: 4096,
        durationMs: 1,
        warmupMs: 0,
        requestIntervalUs: 0,
      }
      t.throws(() => bench.runCase({ ...benchCase, opcode: 2 }), { code, message: /opcode must be/ })
      t.throws(() => bench.runCase({ ...benchCase, transport: 8 }), { code, message: /transport must be/ })
    } finally {
      bench.stop()
    }
    // The numbers of the table work.
    const done = await engine.native((n) => n.transferOne(write, local.handle, 0, seg.handle, target.buffer, 0, 4096, tcp, tcp))
    t.is(typeof done === 'number' ? done & 0xff : undefined, tcp, 'a write pinned to tcp, by number')
    t.not((await target.ask('hash')).hash, before, 'the good write landed')
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('a start that fails off the JS thread rejects with the core\'s code, which crossed as a number', async (t) => {
  const first = await Engine.create()
  try {
    // The port is taken: binding fails in the start task, after the options were accepted.
    const err = await t.throwsAsync(Engine.create({ listen: first.segmentName }), { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT' })
    t.regex(err!.message, /^invalid argument: cannot listen on /, 'the message is the core\'s, with no code in it')
    t.false(err!.message.includes('\u0000'))
  } finally {
    await first.close()
  }
})

test('every call after close() is rejected with ERR_FERRY_CLOSED', async (t) => {
  t.timeout(60_000)
  const { target, engine, local, seg, before } = await setup()
  const batch = engine.allocateBatch(4)
  await engine.close()
  await engine.close() // idempotent
  t.true(engine.closed)
  const code = 'ERR_FERRY_CLOSED'
  const req = { local, remote: seg, remoteBuffer: target.buffer, length: 4096 }
  t.throws(() => engine.allocate(4096), { code })
  t.throws(() => engine.registerMemory(Buffer.from(new SharedArrayBuffer(16))), { code })
  t.throws(() => engine.allocateBatch(1), { code })
  t.throws(() => engine.submitTransfer(batch, [{ ...req, opcode: 'write' }]), { code })
  t.throws(() => engine.getBatchStatus(batch), { code })
  t.throws(() => engine.getTransferStatus(batch, 0), { code })
  t.throws(() => engine.freeBatch(batch), { code })
  t.throws(() => engine.closeSegment(seg), { code })
  t.throws(() => local.release(), { code })
  await t.throwsAsync(() => engine.write(req), { code })
  await t.throwsAsync(() => engine.read(req), { code })
  await t.throwsAsync(() => engine.openSegment(target.segment), { code })
  t.is(local.buffer.length, SIZE, 'region Buffers stay valid after close')
  t.is((await target.ask('hash')).hash, before)
  await target.kill()
})

test('an aborted signal rejects with AbortError and moves nothing', async (t) => {
  t.timeout(60_000)
  const { target, engine, local, seg, before } = await setup()
  try {
    const ac = new AbortController()
    ac.abort()
    await t.throwsAsync(
      () => engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4096, signal: ac.signal }),
      { code: 'ABORT_ERR', name: 'AbortError' },
    )
    t.is((await target.ask('hash')).hash, before)
  } finally {
    await engine.close()
    await target.kill()
  }
})
