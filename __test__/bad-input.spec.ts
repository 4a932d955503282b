import test from 'ava'
import { Engine, FerryError, type Region, type Segment } from '../index'
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
