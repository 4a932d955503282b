import test from 'ava'
import * as fs from 'node:fs'
import * as net from 'node:net'
import { Engine, FerryError } from '../index'

// Node runs this suite without --expose-gc, and nothing here forces a collection: what
// close() releases, it releases by itself.

const openFds = () => fs.readdirSync('/proc/self/fd').length

test.serial('200 create/allocate/close cycles give back every descriptor without a GC', async (t) => {
  t.timeout(120_000)
  const buffers: Buffer[] = []
  const cycle = async () => {
    const e = await Engine.create()
    // Kept reachable on purpose: a Buffer over engine memory that outlives its engine.
    buffers.push(e.allocate(1 << 20).buffer)
    await e.close()
  }
  // A first cycle loads the addon and lets libuv and V8 open what they open once.
  await cycle()
  const before = openFds()
  for (let i = 0; i < 200; i++) await cycle()
  const after = openFds()
  // Slack of 4: Node may open a descriptor or two of its own during 200 awaits (libuv's
  // thread pool and signal pipes are created lazily); an engine that kept any of its own
  // (listener, epoll, eventfd, memfd) would add at least 200.
  t.true(after <= before + 4, `${before} descriptors before, ${after} after 200 cycles`)
  t.is(buffers.length, 201)
  t.true(buffers.every((b) => b.length === 1 << 20))
})

test.serial('a Buffer from allocate() stays readable after close and reads zeros', async (t) => {
  t.timeout(30_000)
  const e = await Engine.create()
  const region = e.allocate(1 << 16)
  region.buffer.fill(0xab)
  t.is(region.buffer[100], 0xab)
  await e.close()
  const b = region.buffer
  t.is(b.length, 1 << 16)
  t.true(b.every((x) => x === 0), 'engine memory is gone; the Buffer views zeros')
  // Writable still (private memory now), and nothing crashes.
  b.fill(0x11)
  t.is(b[b.length - 1], 0x11)
  const closed = { instanceOf: FerryError, code: 'ERR_FERRY_CLOSED' }
  t.throws(() => region.release(), closed)
  t.throws(() => e.allocate(4096), closed)
  t.throws(() => e.allocateBatch(1), closed)
  t.true(e.closed)
  t.is(typeof e.metrics().tasksSubmitted, 'number', 'counters stay readable')
})

test.serial('close() during an openSegment that the peer never answers rejects with ERR_FERRY_CLOSED', async (t) => {
  t.timeout(30_000)
  // A listener that accepts and never replies.
  const held: net.Socket[] = []
  let accepted!: () => void
  const connected = new Promise<void>((resolve) => (accepted = resolve))
  const server = net.createServer((s) => {
    held.push(s)
    accepted()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as net.AddressInfo
  const e = await Engine.create({ connectTimeoutMs: 20_000 })
  try {
    const opening = e.openSegment(`127.0.0.1:${port}`)
    const outcome = opening.then(
      () => 'opened',
      (err: FerryError) => err,
    )
    await connected
    const started = Date.now()
    await e.close()
    const err = await outcome
    const ms = Date.now() - started
    t.true(err instanceof FerryError, `rejected, got ${String(err)}`)
    t.is((err as FerryError).code, 'ERR_FERRY_CLOSED')
    t.true(ms < 5_000, `settled ${ms} ms after close (connect timeout 20 s)`)
  } finally {
    await e.close()
    for (const s of held) s.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  }
})
