import test from 'ava'
import { createHash } from 'node:crypto'
import { Engine, TransferStatus } from '../index'
import { killAll, startTarget } from './helpers'
import { pattern } from './fixtures/pattern'

test.after.always(killAll)

const MiB = 1 << 20
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

test('WRITE then READ 64 MiB in 1 MiB requests across processes, bytes compared', async (t) => {
  t.timeout(90_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(64 * MiB) })
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const src = engine.allocate(64 * MiB)
    pattern(11).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    t.is(seg.buffers.find((b) => b.id === target.buffer)?.length, 64 * MiB)

    const writes = []
    for (let i = 0; i < 64; i++) {
      writes.push(
        engine.write({ local: src, localOffset: i * MiB, remote: seg, remoteBuffer: target.buffer, remoteOffset: i * MiB, length: MiB }),
      )
    }
    const results = await Promise.all(writes)
    for (const r of results) {
      t.is(r.bytes, MiB)
      t.is(r.tasks[0].status, TransferStatus.COMPLETED)
      t.is(r.tasks[0].transport, 'tcp')
      t.is(r.tasks[0].attempts, 1)
    }
    t.is((await target.ask('hash')).hash, sha256(src.buffer), 'target memory equals what was written')

    const dst = engine.allocate(64 * MiB)
    const reads = []
    for (let i = 0; i < 64; i++) {
      reads.push(engine.read({ local: dst, localOffset: i * MiB, remote: seg, remoteBuffer: target.buffer, remoteOffset: i * MiB, length: MiB }))
    }
    await Promise.all(reads)
    t.true(dst.buffer.equals(src.buffer), 'read-back equals the source')
    const m = engine.metrics()
    t.is(m.tasksCompleted, 128)
    t.is(m.bytesTransferred, 128 * MiB)
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('batch API: submit, poll per task, list and overall, free', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(16 * MiB) })
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const src = engine.allocate(16 * MiB)
    pattern(5, 16 * MiB).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    const batch = engine.allocateBatch(32)
    const reqs = Array.from({ length: 16 }, (_, i) => ({
      opcode: 'write' as const,
      local: src,
      localOffset: i * MiB,
      remote: seg,
      remoteBuffer: target.buffer,
      remoteOffset: i * MiB,
      length: MiB,
    }))
    t.is(engine.submitTransfer(batch, reqs), 0)
    t.is(engine.submitTransfer(batch, reqs.slice(0, 2)), 16)
    const deadline = Date.now() + 20_000
    let overall = engine.getBatchStatus(batch)
    while (overall.status === TransferStatus.PENDING && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 2))
      overall = engine.getBatchStatus(batch)
    }
    t.is(overall.status, TransferStatus.COMPLETED)
    t.is(overall.tasks, 18)
    t.is(overall.transferredBytes, 18 * MiB)
    const list = engine.getTransferStatusList(batch)
    t.is(list.length, 18)
    t.true(list.every((s) => s.status === TransferStatus.COMPLETED && s.transport === 'tcp'))
    t.deepEqual(engine.getTransferStatus(batch, 3).transferredBytes, MiB)
    engine.freeBatch(batch)
    t.is((await target.ask('hash')).hash, sha256(src.buffer))
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('registered user memory (over a SharedArrayBuffer) moves bytes too', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const mine = Buffer.from(new SharedArrayBuffer(MiB)).fill(0x5a)
    const region = engine.registerMemory(mine)
    t.is(region.buffer, mine)
    const seg = await engine.openSegment(target.segment)
    await engine.write({ local: region, remote: seg, remoteBuffer: target.buffer, length: MiB })
    t.is((await target.ask('hash')).hash, sha256(mine))
    const back = Buffer.from(new SharedArrayBuffer(MiB))
    const backRegion = engine.registerMemory(new DataView(back.buffer))
    await engine.read({ local: backRegion, remote: seg, remoteBuffer: target.buffer, length: MiB })
    t.true(back.equals(mine))
  } finally {
    await engine.close()
    await target.kill()
  }
})
