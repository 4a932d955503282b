// Peer incarnations as users see them: a segment handle follows its name across the
// target's restart (the target allocating its buffer after it started, as every real one
// does), each loss says why, and closeSegment is no loss.
import { createHash } from 'node:crypto'
import test from 'ava'
import { Engine, FerryError, type PeerLostEvent } from '../index'
import { delay, killAll, startTarget } from './helpers'
import { unusedPort } from '../support/ports'

test.after.always(killAll)

const MiB = 1 << 20
const BOUND_MS = 20_000

/** Resolves with the first event `pick` accepts, within the bound. */
async function until<T>(what: string, pick: () => T | undefined): Promise<T> {
  const deadline = Date.now() + BOUND_MS
  for (;;) {
    const found = pick()
    if (found !== undefined) return found
    if (Date.now() > deadline) throw new Error(`never saw ${what}`)
    await delay(5)
  }
}

function record(engine: Engine) {
  const lost: PeerLostEvent[] = []
  let recovered = 0
  engine.on('peerLost', (e) => lost.push(e))
  engine.on('peerRecovered', () => recovered++)
  return {
    lost,
    get recovered() {
      return recovered
    },
  }
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

test('a target SIGKILLed and restarted on its address, allocating after it started: the old handle writes to it', async (t) => {
  t.timeout(120_000)
  const bytes = 4 * MiB
  const first = await startTarget({ FERRY_TARGET_BYTES: String(bytes) })
  const engine = await Engine.create({ peerTimeoutMs: 3000 })
  const seen = record(engine)
  let second: Awaited<ReturnType<typeof startTarget>> | undefined
  try {
    const local = engine.allocate(bytes)
    const seg = await engine.openSegment(first.segment)
    await engine.write({ local, remote: seg, remoteBuffer: first.buffer, length: bytes })
    await first.kill('SIGKILL')
    const loss = await until('peerLost', () => seen.lost[0])
    t.is(loss.reason, 'crashed', loss.message)
    second = await startTarget({ FERRY_TARGET_BYTES: String(bytes), FERRY_TARGET_LISTEN: first.segment, FERRY_TARGET_LATE: '1' })
    t.is(second.segment, first.segment)
    await until('peerRecovered', () => (seen.recovered > 0 ? true : undefined))
    const { buffer } = (await second.ask('alloc')) as { buffer: number }
    t.is(buffer, first.buffer, 'the first allocation of each incarnation has the same id')
    for (const [i, transport] of (['shm', 'tcp'] as const).entries()) {
      local.fill(0x30 + i)
      const r = await engine.write({ local, remote: seg, remoteBuffer: buffer, length: bytes, requireTransport: transport })
      t.is(r.tasks[0].transport, transport)
      const { hash } = (await second.ask('hash')) as { hash: string }
      t.is(hash, sha256(local.buffer), `${transport}: the bytes landed in the new incarnation`)
    }
    t.is(seen.lost.length, 1)
  } finally {
    await engine.close()
    await first.kill()
    await second?.kill()
  }
})

test('a target whose engine closes is lost as closed: it said goodbye', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  const engine = await Engine.create({ peerTimeoutMs: 3000 })
  const seen = record(engine)
  try {
    await engine.openSegment(target.segment)
    target.proc.stdin!.write('exit\n')
    const loss = await until('peerLost', () => seen.lost[0])
    t.is(loss.reason, 'closed', loss.message)
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('closeSegment during shm copies ends them as ERR_FERRY_SEGMENT_CLOSED, with no peerLost; reopened it works, and a real death later is emitted', async (t) => {
  t.timeout(120_000)
  const bytes = 64 * MiB
  const target = await startTarget({ FERRY_TARGET_BYTES: String(bytes) })
  const engine = await Engine.create({ peerTimeoutMs: 3000, transports: ['shm'] })
  const seen = record(engine)
  try {
    const local = engine.allocate(bytes)
    let cut = 0
    for (let round = 0; round < 20 && cut === 0; round++) {
      const seg = await engine.openSegment(target.segment)
      const writes = Array.from({ length: 32 }, (_, i) =>
        engine.write({ local, localOffset: (i % 8) * 8 * MiB, remote: seg, remoteBuffer: target.buffer, remoteOffset: (i % 8) * 8 * MiB, length: 8 * MiB, requireTransport: 'shm' }),
      )
      engine.closeSegment(seg)
      for (const outcome of await Promise.allSettled(writes)) {
        if (outcome.status === 'fulfilled') continue
        cut++
        const e = outcome.reason as FerryError
        t.is(e.code, 'ERR_FERRY_SEGMENT_CLOSED', e.message)
      }
    }
    t.true(cut > 0, 'a copy was in flight at a close')
    t.deepEqual(seen.lost, [], 'closing a segment is no loss')
    const seg = await engine.openSegment(target.segment)
    await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB, requireTransport: 'shm' })
    await target.kill('SIGKILL')
    const loss = await until('peerLost', () => seen.lost[0])
    t.is(loss.segment, target.segment)
    t.is(loss.reason, 'crashed', loss.message)
  } finally {
    await engine.close()
    await target.kill()
  }
})

test('a Segment shows the peer as the engine knows it now: buffers allocated later, and the new incarnation after a restart', async (t) => {
  t.timeout(120_000)
  // A port the kernel does not hand to outgoing connections, so it is still free when the
  // peer comes back on it (support/ports.ts).
  const first = await Engine.create({ listen: `127.0.0.1:${await unusedPort()}` })
  const engine = await Engine.create({ peerTimeoutMs: 3000 })
  const seen = record(engine)
  let second: Engine | undefined
  const probe = await Engine.create()
  try {
    const local = engine.allocate(MiB)
    const seg = await engine.openSegment(first.segmentName)
    t.deepEqual(seg.buffers, [])
    const oldId = seg.engineId
    // Allocated after the open: a request naming it lists it.
    const late = first.allocate(MiB)
    await engine.write({ local, remote: seg, remoteBuffer: late.id, length: MiB, requireTransport: 'tcp' })
    t.deepEqual(
      seg.buffers.map((b) => b.id),
      [late.id],
    )
    // Another, listed by asking the peer.
    const later = first.allocate(MiB)
    t.is(await seg.refresh(), seg)
    t.deepEqual(
      seg.buffers.map((b) => b.id),
      [late.id, later.id],
    )
    // The peer restarts on its address: the same object shows the new incarnation.
    const name = first.segmentName
    await first.close()
    await until('peerLost', () => seen.lost[0])
    second = await Engine.create({ listen: name })
    await until('peerRecovered', () => (seen.recovered > 0 ? true : undefined))
    t.not(seg.engineId, oldId)
    t.is(seg.engineId, (await probe.openSegment(name)).engineId)
    t.deepEqual(seg.buffers, [], 'the new incarnation has allocated nothing yet')
    const again = second.allocate(MiB)
    await seg.refresh()
    t.deepEqual(
      seg.buffers.map((b) => b.id),
      [again.id],
    )
    // Closed, it keeps what it knew last.
    seg.close()
    t.is(seg.engineId, (await probe.openSegment(name)).engineId)
    t.is(seg.buffers.length, 1)
    await t.throwsAsync(seg.refresh(), { instanceOf: FerryError })
  } finally {
    await engine.close()
    await probe.close()
    await first.close()
    await second?.close()
  }
})
