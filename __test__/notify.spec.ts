import test from 'ava'
import { createHash, randomBytes } from 'node:crypto'
import * as net from 'node:net'
import { Engine, FerryError, TransferStatus, type EngineOptions, type TransportName } from '../index'
import { killAll, spawnNode, startTarget, type TargetProcess } from './helpers'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { type Note } from './fixtures/notes'

test.after.always(killAll)

// One test at a time: each starts a target and an engine or two whose threads move 1 MiB
// blocks and hash them; fourteen side by side on a 2-core machine took over 20 s to answer
// a target's `notes` (Node 24: 6 of 14 failed "no answer to notes", each passing alone in
// under a second).

const MiB = 1 << 20
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')


const notifyTarget = (env: Record<string, string> = {}) => startTarget(env, 20_000, [], 'notify-target.ts')

/** The target's notes once it has `n` (bounded: a missing one fails the test). */
async function notesWhen(target: TargetProcess, n: number): Promise<{ notes: Note[]; dropped: Array<{ total: number; from: string }> }> {
  const deadline = Date.now() + 20_000
  for (;;) {
    const r = (await target.ask('notes')) as { notes: Note[]; dropped: Array<{ total: number; from: string }> }
    if (r.notes.length >= n || Date.now() > deadline) return r
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

/** The payload naming `[off, off+len)` of `src` by its hash, for the target to check. */
const range = (src: Buffer, off: number, len: number) => JSON.stringify({ off, len, sha: sha256(src.subarray(off, off + len)) })

// rdma runs on the emulated verbs device at both ends (no NIC here).
const EMULATED_TARGET = { FERRY_RDMA_PROVIDER: 'emulated', FERRY_TARGET_TRANSPORTS: 'rdma,tcp' }
const setups: Record<TransportName, { target: Record<string, string>; sender: EngineOptions }> = {
  tcp: { target: {}, sender: {} },
  shm: { target: {}, sender: {} },
  rdma: { target: EMULATED_TARGET, sender: { transports: ['rdma', 'tcp'], rdma: { provider: 'emulated' } } },
}

for (const transport of ['tcp', 'shm', 'rdma'] as TransportName[]) {
  for (const mode of ['event', 'iterator']) {
    test.serial(`${transport}, ${mode}: the target's handler finds the data, from the sender's name, in order; once per transfer, batch and block list`, async (t) => {
      t.timeout(60_000)
      const target = await notifyTarget({ ...setups[transport].target, FERRY_NOTIFY_MODE: mode })
      const engine = await Engine.create(setups[transport].sender)
      try {
        const seg = await engine.openSegment(target.segment)
        const src = engine.allocate(8 * MiB)
        src.buffer.set(randomBytes(8 * MiB))
        for (let i = 0; i < 8; i++) {
          const off = i * MiB
          const r = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, localOffset: off, remoteOffset: off, length: MiB, requireTransport: transport, notify: range(src.buffer, off, MiB) })
          t.is(r.tasks[0].transport, transport)
        }
        // The batch below rewrites the last single write's range: the target checks that
        // write's bytes when its notification arrives, so that must have happened first.
        await notesWhen(target, 8)
        // A batch and a multi-request transfer notify once each, after all their bytes.
        const batch = engine.allocateBatch(4)
        const quarter = (i: number) => ({ opcode: 'write' as const, local: src, remote: seg, remoteBuffer: target.buffer, localOffset: i * 2 * MiB, remoteOffset: i * 2 * MiB, length: 2 * MiB, requireTransport: transport })
        src.buffer.set(randomBytes(8 * MiB))
        engine.submitTransfer(batch, [0, 1, 2, 3].map(quarter), { notify: Buffer.from(range(src.buffer, 0, 8 * MiB)) })
        const { notes } = await notesWhen(target, 9)
        src.buffer.set(randomBytes(8 * MiB))
        await engine.transfer([0, 1, 2, 3].map(quarter), { notify: new TextEncoder().encode(range(src.buffer, 0, 8 * MiB)) })
        // Block lists: 8 blocks in reverse order (nothing merges: 8 requests), one notification
        // for the list, after all of it; the same submitted to a batch.
        const reversed = Float64Array.from([7, 6, 5, 4, 3, 2, 1, 0], (i) => i * MiB)
        const blockList = { local: src, remote: seg, remoteBuffer: target.buffer, localOffsets: reversed, remoteOffsets: reversed, lengths: MiB, requireTransport: transport }
        await notesWhen(target, 10)
        src.buffer.set(randomBytes(8 * MiB))
        const viaBlocks = await engine.writeBlocks({ ...blockList, notify: range(src.buffer, 0, 8 * MiB) })
        t.is(viaBlocks.requests, 8)
        t.deepEqual(viaBlocks.failed, [])
        await notesWhen(target, 11)
        src.buffer.set(randomBytes(8 * MiB))
        const blockBatch = engine.allocateBatch(8)
        engine.submitBlocks(blockBatch, { ...blockList, opcode: 'write', notify: range(src.buffer, 0, 8 * MiB) })
        const all = (await notesWhen(target, 12)).notes
        t.is(notes.length, 9)
        t.is(all.length, 12, 'exactly one per call')
        for (const [i, n] of all.entries()) {
          t.true(n.landed, `notification ${i}: every byte was in place when it came`)
          t.is(n.from, engine.segmentName)
          t.regex(n.engineId, /^\d+$/)
          t.is(n.engineId, all[0].engineId, 'one sender engine')
        }
        t.deepEqual(all.slice(0, 8).map((n) => JSON.parse(n.data).off), [0, 1, 2, 3, 4, 5, 6, 7].map((i) => i * MiB), 'in the order sent')
        t.deepEqual(all.map((n) => n.bytes), [...Array(8).fill(MiB), 8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB])
        t.is(engine.metrics().notificationsSent, 12)
        t.is(engine.getBatchStatus(blockBatch).status, TransferStatus.COMPLETED)
        t.is(engine.getBatchStatus(batch).status, TransferStatus.COMPLETED)
      } finally {
        await engine.close()
        await target.kill()
      }
    })
  }
}

// Probe: the target is SIGKILLed and restarted on the same address while writes with
// notifications are in flight. Each of 4 workers writes its own 1 MiB slot with fresh bytes
// and a numbered notification naming them (by hash), one call at a time. A call made
// before the kill planned its data for the old instance: the new one must never get its
// notification.
for (const transport of ['tcp', 'shm'] as TransportName[]) {
  test.serial(`${transport}: a target restarted mid-stream gets no notification for data its predecessor took; the sender's calls end OK or with a typed error`, async (t) => {
    t.timeout(180_000)
    const env = { FERRY_PEER_TIMEOUT_MS: '1000' }
    let target = await notifyTarget(env)
    const address = target.segment
    const engine = await Engine.create({ peerTimeoutMs: 1000 })
    const slots = 4
    const src = engine.allocate(slots * MiB)
    const codes: Record<string, number> = {}
    let made = 0
    let ended = 0
    let misdelivered = 0
    let notLanded = 0
    let stop = false
    try {
      const seg = await engine.openSegment(address)
      const buffer = target.buffer
      const worker = async (i: number) => {
        while (!stop) {
          src.buffer.set(randomBytes(MiB), i * MiB)
          const off = i * MiB
          const note = JSON.stringify({ off, len: MiB, sha: sha256(src.buffer.subarray(off, off + MiB)), call: ++made })
          try {
            await engine.write({ local: src, remote: seg, remoteBuffer: buffer, localOffset: off, remoteOffset: off, length: MiB, requireTransport: transport, notify: note })
            codes.OK = (codes.OK ?? 0) + 1
          } catch (e) {
            const code = (e as FerryError).code
            codes[code] = (codes[code] ?? 0) + 1
            await new Promise((resolve) => setTimeout(resolve, 5))
          }
          ended++
        }
      }
      const workers = Array.from({ length: slots }, (_, i) => worker(i))
      /** Waits (bounded) until `n` more calls ended. */
      const calls = async (n: number) => {
        const until = ended + n
        const deadline = Date.now() + 30_000
        while (ended < until && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5))
        t.true(ended >= until, `${n} calls ended in time`)
      }
      for (let round = 0; round < 6; round++) {
        await calls(8)
        const madeBeforeKill = made
        await target.kill()
        target = await notifyTarget({ ...env, FERRY_TARGET_LISTEN: address })
        // Writes go on against the restarted instance (they may fail until the handle
        // follows it).
        await calls(24)
        const { notes } = (await target.ask('notes')) as { notes: Note[] }
        misdelivered += notes.filter((n) => (JSON.parse(n.data) as { call: number }).call <= madeBeforeKill).length
        notLanded += notes.filter((n) => n.landed !== true).length
      }
      stop = true
      await Promise.all(workers)
      t.log(transport, codes, { notLanded })
      t.is(misdelivered, 0, 'no notification of a call made before the kill reached the new instance')
      for (const code of Object.keys(codes)) t.regex(code, /^(OK|ERR_FERRY_[A-Z_]+)$/)
    } finally {
      stop = true
      await engine.close()
      await target.kill()
    }
  })
}

test.serial('a call that fails without failover notifies nothing; one that fails over mid-way notifies exactly once', async (t) => {
  t.timeout(60_000)
  const target = await notifyTarget()
  const failing = await Engine.create({ transports: ['tcp'], maxFailoverAttempts: 0, faults: [{ transport: 'tcp', submitFailureRate: 1, seed: 1 }] })
  // Every shm attempt copies its bytes and then reads as failed: each task fails over to tcp.
  const flaky = await Engine.create({ transports: ['shm', 'tcp'], faults: [{ transport: 'shm', corruptCompletionRate: 1, seed: 2 }] })
  try {
    const seg = await failing.openSegment(target.segment)
    const src = failing.allocate(MiB)
    const err = await t.throwsAsync(failing.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: MiB, notify: 'failed' }))
    t.not((err as FerryError).code, 'ERR_FERRY_NOTIFY_FAILED')
    t.is(failing.metrics().notificationsSent, 0)

    const seg2 = await flaky.openSegment(target.segment)
    const src2 = flaky.allocate(4 * MiB)
    src2.buffer.set(randomBytes(4 * MiB))
    const reqs = [0, 1, 2, 3].map((i) => ({ opcode: 'write' as const, local: src2, remote: seg2, remoteBuffer: target.buffer, localOffset: i * MiB, remoteOffset: i * MiB, length: MiB }))
    const r = await flaky.transfer(reqs, { notify: range(src2.buffer, 0, 4 * MiB) })
    t.deepEqual(r.tasks.map((x) => x.transport), ['tcp', 'tcp', 'tcp', 'tcp'])
    t.true(flaky.metrics().failovers >= 4)
    // Barriers: each sender's later notification comes after anything it sent before.
    await failing.notify(seg, 'barrier-1')
    await flaky.notify(seg2, 'barrier-2')
    // Both barriers came, so anything either sender sent before them came too.
    const { notes } = await notesWhen(target, 3)
    t.deepEqual(notes.map((n) => (n.landed === null ? n.data : 'range')).sort(), ['barrier-1', 'barrier-2', 'range'])
    t.true(notes.find((n) => n.landed !== null)?.landed, 'all 4 MiB were in place')
    t.is(notes.filter((n) => n.from === failing.segmentName).length, 1, 'the failed call sent nothing')
  } finally {
    await failing.close()
    await flaky.close()
    await target.kill()
  }
})

test.serial('a write whose target dies mid-way fails with its own error and sends no notification', async (t) => {
  t.timeout(60_000)
  const target = await notifyTarget({ FERRY_PEER_TIMEOUT_MS: '1000' })
  // Request 1 is held before shm gets it for longer than the test may run: it cannot land
  // before the target dies, however slow request 0 is; the loss fails it (the fault layer
  // fails what it holds towards a lost peer). A delay of a few seconds raced request 0
  // under load: both had landed when the loop below first looked.
  const engine = await Engine.create({ peerTimeoutMs: 1000, faults: [{ transport: 'shm', delayMs: 600_000 }] })
  try {
    const seg = await engine.openSegment(target.segment)
    const src = engine.allocate(2 * MiB)
    const call = engine.transfer(
      [
        { opcode: 'write', local: src, remote: seg, remoteBuffer: target.buffer, length: MiB, requireTransport: 'tcp' },
        { opcode: 'write', local: src, remote: seg, remoteBuffer: target.buffer, localOffset: MiB, remoteOffset: MiB, length: MiB, requireTransport: 'shm' },
      ],
      { notify: 'never' },
    )
    const settled = call.then(
      () => undefined,
      (e: FerryError) => e,
    )
    // Request 0 landed (its task completed) before the target dies.
    const deadline = Date.now() + 20_000
    while (engine.metrics().tasksCompleted < 1 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5))
    t.is(engine.metrics().tasksCompleted, 1)
    await target.kill()
    const err = await settled
    t.truthy(err, 'the call failed')
    t.not(err?.code, 'ERR_FERRY_NOTIFY_FAILED', 'the data did not all land: a transfer error, not a notification one')
    t.is(engine.metrics().notificationsSent, 0)
  } finally {
    await engine.close()
    await target.kill()
  }
})

test.serial('a sender that dies mid-way delivers no notification', async (t) => {
  t.timeout(60_000)
  const target = await notifyTarget()
  const proc = spawnNode(path.join(__dirname, 'fixtures', 'notify-sender.ts'), { FERRY_INIT_SEGMENT: target.segment, FERRY_INIT_BUFFER: String(target.buffer) })
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
  const engine = await Engine.create()
  try {
    const lines = readline.createInterface({ input: proc.stdout! })
    const landing = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the sender never started')), 20_000)
      lines.once('line', () => {
        clearTimeout(timer)
        resolve()
      })
    })
    await landing
    // Wait until request 0's bytes are visible in the target, then kill the sender.
    const probe = engine.allocate(MiB)
    const seg = await engine.openSegment(target.segment)
    const deadline = Date.now() + 20_000
    for (;;) {
      await engine.read({ local: probe, remote: seg, remoteBuffer: target.buffer, length: MiB })
      if (probe.buffer.every((b) => b === 0x5a) || Date.now() > deadline) break
    }
    t.true(probe.buffer.every((b) => b === 0x5a), 'half of the call landed')
    t.is(proc.exitCode, null, 'the sender still waits on the other half when it is killed')
    process.kill(proc.pid!, 'SIGKILL')
    await exited
    await engine.notify(seg, 'barrier')
    const { notes } = await notesWhen(target, 1)
    t.deepEqual(notes.map((n) => n.data), ['barrier'])
  } finally {
    await engine.close()
    if (proc.exitCode === null && proc.signalCode === null) process.kill(proc.pid!, 'SIGKILL')
    await target.kill()
  }
})

test.serial('a flood past the queue is dropped and counted, reported once, and memory stays bounded', async (t) => {
  t.timeout(60_000)
  const target = await notifyTarget({ FERRY_NOTIFY_QUEUE: '32', FERRY_NOTIFY_CONSUME: '0' })
  const engine = await Engine.create()
  try {
    const seg = await engine.openSegment(target.segment)
    const payload = 'x'.repeat(4096)
    const outcomes = await Promise.all(Array.from({ length: 400 }, () => engine.notify(seg, payload)))
    t.is(outcomes.filter((o) => o.outcome === 'queued').length, 32)
    t.is(outcomes.filter((o) => o.outcome === 'dropped').length, 368)
    t.deepEqual(outcomes.slice(0, 32).map((o) => o.outcome), Array(32).fill('queued'), 'the first 32 are kept')
    const { metrics } = (await target.ask('metrics')) as { metrics: { received: number; dropped: number; queued: number; text: string } }
    t.is(metrics.dropped, 368)
    t.is(metrics.queued, 32, 'no more than the queue size waits')
    t.regex(metrics.text, /^ferry_notifications_dropped_total 368$/m)
    await target.ask('consume')
    const { notes, dropped } = await notesWhen(target, 32)
    t.is(notes.length, 32)
    t.is(dropped.length, 1, 'one notificationsDropped event for the run')
    t.is(dropped[0].from, engine.segmentName)
    t.is(((await target.ask('metrics')) as { metrics: { queued: number } }).metrics.queued, 0)
  } finally {
    await engine.close()
    await target.kill()
  }
})

/** A frame header of Ferry's wire (`wire.rs`). */
function header(op: number, opts: { requestId?: bigint; bufferId?: bigint; length?: number } = {}): Buffer {
  const b = Buffer.alloc(56)
  b.write('FRRY', 0, 'latin1')
  b[4] = 1
  b[5] = op
  b.writeBigUInt64LE(opts.requestId ?? 0n, 8)
  b.writeBigUInt64LE(opts.bufferId ?? 0n, 16)
  b.writeBigUInt64LE(BigInt(opts.length ?? 0), 32)
  return b
}

test.serial('with a secret set, a notification without it is refused; the sender name is the one that proved it', async (t) => {
  t.timeout(60_000)
  const secret = randomBytes(32)
  const target = await notifyTarget({ FERRY_NOTIFY_SECRET: secret.toString('hex') })
  const friend = await Engine.create({ authSecret: secret })
  const stranger = await Engine.create()
  try {
    // Raw: a Notify connection that skips the proof, then a NotifyOpen and a Notify.
    const port = Number(target.segment.split(':').pop())
    const sock = net.connect(port, '127.0.0.1')
    const closed = new Promise<void>((resolve) => sock.once('close', () => resolve()))
    sock.on('error', () => undefined)
    const reply: Buffer[] = []
    sock.on('data', (d: Buffer) => reply.push(d))
    await new Promise<void>((resolve) => sock.once('connect', () => resolve()))
    const name = Buffer.from('mallory:1')
    const data = Buffer.from('forged')
    sock.write(Buffer.concat([header(1, { requestId: 7n, bufferId: 4n }), header(16, { length: name.length }), name, header(17, { requestId: 1n, length: data.length }), data]))
    await closed
    const answer = Buffer.concat(reply)
    t.is(answer[5], 7, 'an Error frame')
    t.is(answer.readUInt16LE(6), 6, 'with the auth reject code')
    t.regex(answer.subarray(56).toString(), /requires the cluster secret/)
    const err = await t.throwsAsync(stranger.openSegment(target.segment))
    t.regex((err as FerryError).code, /^ERR_FERRY_(CONNECT|REMOTE_REJECTED|PROTOCOL)$/)
    const seg = await friend.openSegment(target.segment)
    t.deepEqual(await friend.notify(seg, 'hello'), { outcome: 'queued' })
    const { notes } = await notesWhen(target, 1)
    t.deepEqual(notes.map((n) => [n.from, n.data]), [[friend.segmentName, 'hello']])
    t.regex(notes[0].engineId, /^\d+$/, 'a decimal engine id')
  } finally {
    await friend.close()
    await stranger.close()
    await target.kill()
  }
})

test.serial('bad notifications are refused with a typed error before anything moves', async (t) => {
  t.timeout(60_000)
  const target = await notifyTarget()
  const other = await Engine.create()
  const engine = await Engine.create({ notifyMaxBytes: 64 })
  try {
    const seg = await engine.openSegment(target.segment)
    const seg2 = await engine.openSegment(other.segmentName)
    const src = engine.allocate(4096)
    const req = { local: src, remote: seg, remoteBuffer: target.buffer, length: 4096 }
    const big = Buffer.alloc(65)
    t.is((await t.throwsAsync<FerryError>(engine.write({ ...req, notify: big })))?.code, 'ERR_FERRY_NOTIFY_TOO_LARGE')
    t.is((await t.throwsAsync<FerryError>(engine.notify(seg, big)))?.code, 'ERR_FERRY_NOTIFY_TOO_LARGE')
    t.is((await t.throwsAsync<FerryError>(engine.write({ ...req, notify: 42 as unknown as string })))?.code, 'ERR_FERRY_INVALID_ARGUMENT')
    const two = [
      { opcode: 'write' as const, ...req },
      { opcode: 'write' as const, local: src, remote: seg2, length: 4096 },
    ]
    t.is((await t.throwsAsync<FerryError>(engine.transfer(two, { notify: 'x' })))?.code, 'ERR_FERRY_INVALID_ARGUMENT')
    t.is(t.throws<FerryError>(() => engine.submitTransfer(engine.allocateBatch(2), two, { notify: 'x' }))?.code, 'ERR_FERRY_INVALID_ARGUMENT')
    t.is(t.throws<FerryError>(() => engine.submitTransfer(1, [], { bogus: 1 } as never))?.code, 'ERR_FERRY_INVALID_ARGUMENT')
    t.is(engine.metrics().tasksSubmitted, 0, 'nothing moved')
    await t.throwsAsync(Engine.create({ notifyMaxBytes: 65537 }), { code: 'ERR_FERRY_INVALID_ARGUMENT', message: /notifyMaxBytes/ })
    await t.throwsAsync(Engine.create({ notifyQueueSize: 0 }), { code: 'ERR_FERRY_INVALID_ARGUMENT', message: /notifyQueueSize/ })
    // An aborted iterator rejects with AbortError; one open at close ends.
    const ac = new AbortController()
    const it = engine.notifications({ signal: ac.signal })
    const next = it.next()
    ac.abort()
    t.is((await t.throwsAsync<FerryError>(next))?.code, 'ABORT_ERR')
    const open = engine.notifications()[Symbol.asyncIterator]().next()
    await engine.close()
    t.deepEqual(await open, { value: undefined, done: true })
  } finally {
    await engine.close()
    await other.close()
    await target.kill()
  }
})
