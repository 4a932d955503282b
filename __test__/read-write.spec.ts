import test from 'ava'
import { Engine, FerryError, TransferStatus } from '../index'
import { killAll, startTarget } from './helpers'

test.after.always(killAll)

const MiB = 1 << 20

// engine.read/write without a signal or a notification take the binding's all-numbers call
// (`transferOne`); engine.transfer takes the general one. Both must report the same.

for (const transports of [['tcp'], ['shm', 'tcp']] as const) {
  test(`read/write report what transfer() reports for the same request (${transports.join('+')})`, async (t) => {
    t.timeout(60_000)
    const target = await startTarget({ FERRY_TARGET_BYTES: String(4 * MiB) })
    const engine = await Engine.create({ transports: [...transports] })
    try {
      const local = engine.allocate(4 * MiB)
      local.buffer.fill(0x5a)
      const seg = await engine.openSegment(target.segment)
      for (const length of [1, 4096, 65_536, 65_537, MiB]) {
        const req = { local, localOffset: 8, remote: seg, remoteBuffer: target.buffer, remoteOffset: 16, length }
        const w1 = await engine.write(req)
        const w2 = await engine.transfer([{ ...req, opcode: 'write' }])
        t.deepEqual(w1, w2, `write ${length}`)
        t.is(w1.bytes, length)
        t.is(w1.tasks[0].status, TransferStatus.COMPLETED)
        t.is(w1.tasks[0].transport, transports[0])
        const r1 = await engine.read(req)
        const r2 = await engine.transfer([{ ...req, opcode: 'read' }])
        t.deepEqual(r1, r2, `read ${length}`)
      }
      // A pinned transport is honoured the same way.
      const pinned = { local, remote: seg, remoteBuffer: target.buffer, length: 4096, requireTransport: 'tcp' as const }
      t.deepEqual(await engine.read(pinned), await engine.transfer([{ ...pinned, opcode: 'read' }]))
      // A request the target refuses fails alike: same code, status and task.
      const beyond = { local, remote: seg, remoteBuffer: target.buffer, remoteOffset: 4 * MiB - 10, length: 4096 }
      const e1 = await t.throwsAsync(engine.read(beyond), { instanceOf: FerryError })
      const e2 = await t.throwsAsync(engine.transfer([{ ...beyond, opcode: 'read' }]), { instanceOf: FerryError })
      t.is(e1?.code, e2?.code)
      t.is(e1?.status, e2?.status)
      t.deepEqual(e1?.tasks, e2?.tasks)
    } finally {
      await engine.close()
    }
  })
}
