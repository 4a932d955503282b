/**
 * The RDMA transport across processes. No machine here has a NIC, so both ends run on the
 * emulated verbs device (selected explicitly: FERRY_RDMA_PROVIDER in the target's env,
 * `rdma.provider` here). The device executes one-sided WRITE/READ in the target process
 * against its registered memory, with rkey and bounds checks.
 */
import test from 'ava'
import { createHash } from 'node:crypto'
import * as fs from 'node:fs'
import { Engine, FerryError, TransferStatus, type EngineEvent } from '../index'
import { delay, killAll, startTarget, startWriters } from './helpers'
import { pattern } from './fixtures/pattern'

test.after.always(killAll)

const MiB = 1 << 20
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')
const EMULATED_TARGET = { FERRY_RDMA_PROVIDER: 'emulated', FERRY_TARGET_TRANSPORTS: 'rdma,tcp' }

test('256 MiB WRITE then READ across processes over rdma, bytes verified', async (t) => {
  t.timeout(120_000)
  const size = 256 * MiB
  const target = await startTarget({ ...EMULATED_TARGET, FERRY_TARGET_BYTES: String(size) })
  const engine = await Engine.create({ transports: ['rdma', 'tcp'], rdma: { provider: 'emulated' } })
  try {
    const src = engine.allocate(size)
    pattern(41, size).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    t.deepEqual(seg.buffers[0].transports, ['rdma', 'tcp'])
    const chunk = 8 * MiB
    const pieces = Array.from({ length: size / chunk }, (_, i) => i * chunk)
    const writes = await Promise.all(
      pieces.map((off) =>
        engine.write({ local: src, localOffset: off, remote: seg, remoteBuffer: target.buffer, remoteOffset: off, length: chunk, requireTransport: 'rdma' }),
      ),
    )
    for (const w of writes) t.is(w.tasks[0].transport, 'rdma')
    t.is((await target.ask('hash')).hash, sha256(src.buffer), 'the target holds what was written')
    const back = engine.allocate(size)
    const reads = await Promise.all(
      pieces.map((off) =>
        engine.read({ local: back, localOffset: off, remote: seg, remoteBuffer: target.buffer, remoteOffset: off, length: chunk, requireTransport: 'rdma' }),
      ),
    )
    for (const r of reads) t.is(r.tasks[0].transport, 'rdma')
    t.true(back.buffer.equals(src.buffer), 'what was read back is what was written')
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('SIGKILL of the target during rdma writes: every writer fails within 1 s, the batch ends FAILED', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ ...EMULATED_TARGET, FERRY_TARGET_BYTES: String(64 * MiB) })
  const engine = await Engine.create({ transports: ['rdma'], rdma: { provider: 'emulated' } })
  try {
    const src = engine.allocate(64 * MiB)
    const seg = await engine.openSegment(target.segment)
    const batch = engine.allocateBatch(1 << 16)
    const writers = startWriters(engine, { local: src, remote: seg, remoteBuffer: target.buffer })
    const { outcomes } = writers
    while (writers.completed() < 50) await delay(2)
    await target.kill('SIGKILL')
    const killedAt = Date.now()
    // Work submitted after the kill never completes: refused at once if the loss is
    // already known, else it ends FAILED.
    let submitted = true
    try {
      engine.submitTransfer(batch, [{ opcode: 'write', local: src, remote: seg, remoteBuffer: target.buffer, length: MiB }])
    } catch (e) {
      t.is((e as FerryError).code, 'ERR_FERRY_PEER_LOST')
      submitted = false
    }
    await Promise.race([writers.done, delay(5000)])
    writers.stop()
    const failures = outcomes.filter((o) => !o.ok)
    t.is(failures.length, 8, 'every writer saw its write fail')
    for (const f of failures) t.true(f.at - killedAt <= 1000, `failed ${f.at - killedAt} ms after the kill (${f.code})`)
    if (submitted) {
      let s = engine.getBatchStatus(batch)
      while (s.status === TransferStatus.PENDING && Date.now() - killedAt < 2000) {
        await delay(5)
        s = engine.getBatchStatus(batch)
      }
      t.is(s.status, TransferStatus.FAILED)
    }
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('a silently lost data path (no completion at all) hits the slice deadline and completes over tcp', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ ...EMULATED_TARGET, FERRY_TARGET_BYTES: String(16 * MiB) })
  // No attempt deadline: only the rdma slice deadline can end the silent attempt.
  const engine = await Engine.create({
    transports: ['rdma', 'tcp'],
    attemptTimeoutMs: 0,
    rdma: { provider: 'emulated', emulatedFaults: 'silent_loss=1', sliceTimeoutMs: 400 },
  })
  const events: EngineEvent[] = []
  engine.on('failover', (e) => events.push(e))
  try {
    const src = engine.allocate(16 * MiB)
    pattern(43, 16 * MiB).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    const started = Date.now()
    const r = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 16 * MiB, transport: 'rdma' })
    const took = Date.now() - started
    t.is(r.tasks[0].transport, 'tcp')
    t.true(r.tasks[0].attempts >= 2)
    t.log(`completed over tcp ${took} ms after submission (sliceTimeoutMs 400)`)
    // ≈ 0.42 s here when the machine is quiet; the bound leaves room for a loaded CI box.
    t.true(took >= 400 && took < 10_000, `took ${took} ms`)
    t.is((await target.ask('hash')).hash, sha256(src.buffer))
    t.true(events.some((e) => e.kind === 'failover' && e.from === 'rdma' && e.to === 'tcp'), JSON.stringify(events))
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('where no RDMA device exists, requireTransport rdma fails with the reason and tcp still works', async (t) => {
  t.timeout(30_000)
  const devices = fs.existsSync('/sys/class/infiniband') ? fs.readdirSync('/sys/class/infiniband') : []
  if (devices.length > 0) {
    t.log(`skipped: this machine has RDMA devices (${devices.join(', ')})`)
    t.pass()
    return
  }
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  const engine = await Engine.create({ transports: ['rdma', 'tcp'], rdma: { provider: 'ibverbs' } })
  try {
    const disabled = await new Promise<{ transport: string; reason: string }>((resolve, reject) => {
      // A hang guard, not a timing check: the event crosses to JS on the event loop, which a
      // loaded machine (concurrent tests in this worker) can hold up for seconds.
      const timer = setTimeout(() => reject(new Error('no transportDisabled event for rdma')), 20_000)
      engine.once('transportDisabled', (e) => {
        clearTimeout(timer)
        resolve(e)
      })
    })
    t.is(disabled.transport, 'rdma')
    t.regex(disabled.reason, /no RDMA device|libibverbs/)
    const src = engine.allocate(MiB)
    const seg = await engine.openSegment(target.segment)
    const err = await t.throwsAsync(
      engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: MiB, requireTransport: 'rdma' }),
    )
    t.is((err as FerryError).code, 'ERR_FERRY_TRANSPORT_UNAVAILABLE')
    t.regex(err!.message, /rdma is disabled on this engine: .*(no RDMA device|libibverbs)/)
    const ok = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: MiB })
    t.is(ok.tasks[0].transport, 'tcp')
  } finally {
    await engine.close()
    await target.kill()
  }
})
