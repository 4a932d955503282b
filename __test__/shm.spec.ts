import test from 'ava'
import { createHash } from 'node:crypto'
import * as fs from 'node:fs'
import { Engine, FerryError, TransferStatus, type EngineEvent } from '../index'
import { delay, killAll, startTarget, startWriters } from './helpers'
import { pattern } from './fixtures/pattern'

test.after.always(killAll)

const MiB = 1 << 20
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

test('same-host peers move bytes over shm, mapped once, verified both ways', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(16 * MiB) })
  const engine = await Engine.create()
  try {
    const src = engine.allocate(16 * MiB)
    pattern(21, 16 * MiB).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    t.deepEqual(seg.buffers[0].transports, ['shm', 'tcp'])
    const small = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 4096 })
    t.is(small.tasks[0].transport, 'shm')
    const big = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 16 * MiB })
    t.is(big.tasks[0].transport, 'shm')
    t.is((await target.ask('hash')).hash, sha256(src.buffer))
    const back = engine.allocate(16 * MiB)
    const r = await engine.read({ local: back, remote: seg, remoteBuffer: target.buffer, length: 16 * MiB })
    t.is(r.tasks[0].transport, 'shm')
    t.true(back.buffer.equals(src.buffer))
    // a transport hint still wins for the first attempt
    const viaTcp = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: MiB, transport: 'tcp' })
    t.is(viaTcp.tasks[0].transport, 'tcp')
    // The target's memfd is mapped here exactly once while the segment is open. Identify it
    // by inode (read from the target's own maps), so other engines in this process don't count.
    const inodeOf = (line: string) => line.trim().split(/\s+/)[4]
    const targetLine = fs
      .readFileSync(`/proc/${target.pid}/maps`, 'utf8')
      .split('\n')
      .find((l) => l.includes('ferry-region-'))
    t.truthy(targetLine, 'the target maps its region')
    const inode = inodeOf(targetLine!)
    const maps = () =>
      fs.readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('ferry-region-') && inodeOf(l) === inode).length
    const fds = () =>
      fs.readdirSync('/proc/self/fd').filter((f) => {
        try {
          return String(fs.statSync(`/proc/self/fd/${f}`).ino) === inode
        } catch {
          return false
        }
      }).length
    t.is(maps(), 1, 'the remote buffer is mapped once')
    t.is(fds(), 1, 'and its fd is held once')
    engine.closeSegment(seg)
    t.is(maps(), 0, 'closeSegment unmaps the remote buffer')
    t.is(fds(), 0, 'closeSegment closes its fd')
    // Reopen (maps again), then close the engine with the segment open: close unmaps it.
    await engine.openSegment(target.segment)
    t.is(maps(), 1)
    await engine.close()
    t.is(maps(), 0, 'close unmaps remote buffers')
    t.is(fds(), 0, 'close closes the remote fds')
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('shm completions corrupted: the transfer completes over tcp, with a failover event', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(4 * MiB) })
  const engine = await Engine.create({ faults: [{ transport: 'shm', corruptCompletionRate: 1, seed: 1 }] })
  const events: EngineEvent[] = []
  engine.on('failover', (e) => events.push(e))
  try {
    const src = engine.allocate(4 * MiB)
    pattern(3, 4 * MiB).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    const r = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 4 * MiB })
    t.is(r.tasks[0].transport, 'tcp')
    t.is(r.tasks[0].attempts, 2)
    t.is((await target.ask('hash')).hash, sha256(src.buffer))
    await delay(20)
    t.is(events.length, 1)
    t.like(events[0], { kind: 'failover', from: 'shm', to: 'tcp', attempt: 1, segment: seg.name })
    t.is(engine.metrics().failovers, 1)
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('both transports failing: FAILED after exactly the budget', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  for (const budget of [0, 1, 3]) {
    const engine = await Engine.create({
      maxFailoverAttempts: budget,
      faults: [
        { transport: 'shm', corruptCompletionRate: 1 },
        { transport: 'tcp', submitFailureRate: 1 },
      ],
    })
    try {
      const src = engine.allocate(MiB)
      const seg = await engine.openSegment(target.segment)
      const err = await t.throwsAsync<FerryError>(() => engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: MiB }))
      t.is(err!.status, TransferStatus.FAILED)
      t.is(err!.attempts, budget + 1, `budget ${budget}`)
      t.is(engine.metrics().failovers, budget)
    } finally {
      await engine.close()
    }
  }
  await target.kill()
})

test("requireTransport: 'shm' towards a peer on another host fails with a clear error", async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  const engine = await Engine.create({ machineId: 'another-host/another-boot' })
  try {
    const src = engine.allocate(MiB)
    const seg = await engine.openSegment(target.segment)
    const err = await t.throwsAsync<FerryError>(() =>
      engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 4096, requireTransport: 'shm' }),
    )
    t.is(err!.code, 'ERR_FERRY_TRANSPORT_UNAVAILABLE')
    t.regex(err!.message, /another host/)
    // without the requirement, tcp serves it
    const r = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 4096 })
    t.is(r.tasks[0].transport, 'tcp')
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('writes done inline still let the event loop turn between awaits', async (t) => {
  t.timeout(60_000)
  // A same-host 4 KiB write is copied before write() returns, and its outcome handed back
  // without a Promise from the binding: a loop of awaited writes must still let timers run.
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  const engine = await Engine.create()
  try {
    const src = engine.allocate(MiB)
    const seg = await engine.openSegment(target.segment)
    const blocks = { local: src, remote: seg, remoteBuffer: target.buffer, localOffsets: new Float64Array([0, 8192]), remoteOffsets: new Float64Array([16384, 0]), lengths: 4096 }
    for (const op of ['write', 'writeBlocks'] as const) {
      let fired = false
      setTimeout(() => (fired = true), 5)
      let calls = 0
      const giveUp = Date.now() + 5000
      while (!fired && Date.now() < giveUp) {
        if (op === 'write') t.is((await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 4096 })).tasks[0].transport, 'shm')
        else t.true((await engine.writeBlocks(blocks)).status.every((s) => s === TransferStatus.COMPLETED))
        calls++
      }
      t.true(fired, `${op}: a 5 ms timer fired while ${calls} calls ran back to back`)
    }
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('SIGKILL of a target during shm writes: FAILED within 1 s, never a silent success', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(64 * MiB) })
  const engine = await Engine.create()
  try {
    const src = engine.allocate(64 * MiB)
    const seg = await engine.openSegment(target.segment)
    const batch = engine.allocateBatch(1 << 16)
    const writers = startWriters(engine, { local: src, remote: seg, remoteBuffer: target.buffer })
    const { outcomes } = writers
    while (writers.completed() < 100) await delay(2)
    await target.kill('SIGKILL')
    const killedAt = Date.now()
    // Batch work submitted after the kill must never complete.
    engine.submitTransfer(batch, [{ opcode: 'write', local: src, remote: seg, remoteBuffer: target.buffer, length: MiB }])
    await Promise.race([writers.done, delay(3000)])
    writers.stop()
    const failures = outcomes.filter((o) => !o.ok)
    t.is(failures.length, 8, 'every writer saw its write fail')
    for (const f of failures) t.true(f.at - killedAt <= 1000, `failed ${f.at - killedAt} ms after the kill`)
    t.true(outcomes.filter((o) => o.ok && o.at > killedAt + 50).length === 0, 'no success long after the kill')
    let s = engine.getBatchStatus(batch)
    while (s.status === TransferStatus.PENDING && Date.now() - killedAt < 1000) {
      await delay(5)
      s = engine.getBatchStatus(batch)
    }
    t.is(s.status, TransferStatus.FAILED)
  } finally {
    await engine.close()
    await target.kill()
  }
})
