/**
 * Node idioms: an engine holds the event loop as a listening net.Server does (`ref()`,
 * `unref()`), AbortSignals on the calls that wait, unknown option keys refused, and
 * `using`/`await using`.
 */
import test from 'ava'
import { once } from 'node:events'
import { readdirSync } from 'node:fs'
import * as net from 'node:net'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { Engine, FerryError } from '../index'
import { killAll, spawnNode } from './helpers'

test.after.always(killAll)

/** A `serve-only.ts` child: its lines as they come, and its exit. */
async function serveOnly(mode: 'serve' | 'notes') {
  const proc = spawnNode(path.join(__dirname, 'fixtures', 'serve-only.ts'), { FERRY_SERVE_MODE: mode })
  let stderr = ''
  proc.stderr?.on('data', (d) => (stderr += d))
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)))
  const lines: Array<Record<string, unknown>> = []
  const waiters: Array<() => void> = []
  readline.createInterface({ input: proc.stdout! }).on('line', (l) => {
    lines.push(JSON.parse(l))
    for (const w of waiters.splice(0)) w()
  })
  /** The `i`-th line, within 20 s. */
  const line = async (i: number): Promise<Record<string, unknown>> => {
    const deadline = Date.now() + 20_000
    while (lines.length <= i) {
      if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`no line ${i} (exit ${proc.exitCode}): ${stderr}`)
      await Promise.race([new Promise<void>((r) => waiters.push(r)), exited, sleep(100)])
    }
    return lines[i]
  }
  return { proc, exited, line, stderr: () => stderr }
}

/** Whether `exited` settles within `ms`: 'exited', else 'alive'. */
const aliveAfter = async (exited: Promise<unknown>, ms: number) => Promise.race([exited.then(() => 'exited'), sleep(ms).then(() => 'alive')])

const openFds = () => readdirSync('/proc/self/fd').length

/** A loopback port free now. */
async function freePort(): Promise<number> {
  const probe = net.createServer().listen(0, '127.0.0.1')
  await once(probe, 'listening')
  const port = (probe.address() as net.AddressInfo).port
  probe.close()
  await once(probe, 'close')
  return port
}

/** Whether `port` can be listened on within 20 s (an engine there closed). */
async function portFreed(port: number): Promise<boolean> {
  const deadline = Date.now() + 20_000
  while (Date.now() < deadline) {
    const s = net.createServer()
    const ok = await new Promise<boolean>((resolve) => {
      s.once('error', () => resolve(false))
      s.listen(port, '127.0.0.1', () => resolve(true))
    })
    if (ok) {
      s.close()
      await once(s, 'close')
      return true
    }
    await sleep(50)
  }
  return false
}

test('a target that only serves stays up with no timer, serves, and exits by itself once unref()', async (t) => {
  t.timeout(60_000)
  const child = await serveOnly('serve')
  const hello = await child.line(0)
  t.false((hello.resources as string[]).includes('Timeout'), `no timer in the child: ${hello.resources}`)
  t.is(await aliveAfter(child.exited, 5_000), 'alive', `the serving target exited by itself: ${child.stderr()}`)
  // It still serves.
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const seg = await engine.openSegment(String(hello.segment))
    const local = engine.allocate(4096)
    await engine.read({ local, remote: seg, remoteBuffer: Number(hello.buffer), length: 4096 })
    t.is(local.buffer[4095], 7)
  } finally {
    await engine.close()
  }
  process.kill(child.proc.pid!, 'SIGUSR2')
  t.is(await aliveAfter(child.exited, 20_000), 'exited', 'unref() let the process exit')
  t.is(child.proc.exitCode, 0, child.stderr())
})

test('a `for await` over notifications keeps its process up; closing the engine lets it exit', async (t) => {
  t.timeout(60_000)
  const child = await serveOnly('notes')
  const hello = await child.line(0)
  t.is(await aliveAfter(child.exited, 5_000), 'alive', `the waiting loop's process exited by itself: ${child.stderr()}`)
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const seg = await engine.openSegment(String(hello.segment))
    t.deepEqual(await engine.notify(seg, 'one'), { outcome: 'queued' })
    t.deepEqual(await child.line(1), { note: 'one' })
    await engine.notify(seg, 'stop')
  } finally {
    await engine.close()
  }
  t.is(await aliveAfter(child.exited, 20_000), 'exited', 'the closed engine held nothing')
  t.is(child.proc.exitCode, 0, child.stderr())
})

test('ref() and unref() return the engine, and are harmless after close()', async (t) => {
  const engine = await Engine.create({ transports: ['tcp'] })
  t.is(engine.unref(), engine)
  t.is(engine.ref(), engine)
  t.is(engine.ref(), engine, 'twice is once')
  await engine.close()
  t.is(engine.ref(), engine)
  t.is(engine.unref(), engine)
})

const isAbort = (e: unknown, reason: unknown) => {
  const f = e as FerryError
  return f instanceof FerryError && f.name === 'AbortError' && f.code === 'ABORT_ERR' && f.cause === reason
}

test.serial('a signal that already fired rejects Engine.create at once: nothing listens, no descriptor is left', async (t) => {
  // A port that is free now: the engine would listen there.
  const port = await freePort()
  const before = openFds()
  const reason = new Error('no longer wanted')
  const err = await t.throwsAsync(Engine.create({ listen: `127.0.0.1:${port}`, signal: AbortSignal.abort(reason) }))
  t.true(isAbort(err, reason), `an AbortError with the signal's reason as cause: ${err?.name} ${(err as FerryError)?.code} ${err?.message}`)
  t.is(openFds(), before, 'no descriptor opened')
  // Nothing listens there: the port can be taken.
  const again = net.createServer().listen(port, '127.0.0.1')
  await once(again, 'listening')
  again.close()
  // The reason defaults as AbortSignal's own does.
  const plain = await t.throwsAsync(Engine.create({ signal: AbortSignal.abort() }))
  t.is((plain as FerryError).code, 'ABORT_ERR')
  t.is((plain?.cause as Error).name, 'AbortError')
})

test('an engine that starts after its create() was aborted is closed, not left listening', async (t) => {
  t.timeout(60_000)
  const port = await freePort()
  const ac = new AbortController()
  // The start is under way once create() returns its Promise; the abort comes before it ends.
  const creating = Engine.create({ listen: `127.0.0.1:${port}`, transports: ['tcp'], signal: ac.signal })
  ac.abort()
  const err = await t.throwsAsync(creating)
  t.is((err as FerryError).code, 'ABORT_ERR')
  t.true(await portFreed(port), 'the engine that started all the same was closed')
})

test('a signal that fires while the engine starts rejects Engine.create at once', async (t) => {
  t.timeout(60_000)
  // An "etcd" that accepts and never answers: the start waits on it.
  const silent = net.createServer((s) => s.on('error', () => {}))
  const sockets: net.Socket[] = []
  silent.on('connection', (s) => sockets.push(s))
  silent.listen(0, '127.0.0.1')
  await once(silent, 'listening')
  const { port } = silent.address() as net.AddressInfo
  const ac = new AbortController()
  const reason = new Error('stop starting')
  silent.once('connection', () => ac.abort(reason))
  const started = Date.now()
  const err = await t.throwsAsync(Engine.create({ metadata: `etcd://127.0.0.1:${port}`, connectTimeoutMs: 20_000, signal: ac.signal }))
  t.true(isAbort(err, reason), `${err?.name}: ${err?.message}`)
  t.true(Date.now() - started < 15_000, 'rejected before the start gave up by itself')
  for (const s of sockets) s.destroy()
  silent.close()
})

test.serial('openSegment: a fired signal rejects before anything starts; one that fires while it connects rejects at once and stops the attempt', async (t) => {
  t.timeout(60_000)
  const engine = await Engine.create({ transports: ['tcp'], connectTimeoutMs: 30_000 })
  // A peer that accepts, reads, and never answers the handshake.
  const silent = net.createServer((s) => s.on('error', () => {}).resume())
  const sockets: net.Socket[] = []
  silent.on('connection', (s) => sockets.push(s))
  silent.listen(0, '127.0.0.1')
  await once(silent, 'listening')
  const name = `127.0.0.1:${(silent.address() as net.AddressInfo).port}`
  try {
    const reason = new Error('fired')
    const before = openFds()
    const early = await t.throwsAsync(engine.openSegment(name, { signal: AbortSignal.abort(reason) }))
    t.true(isAbort(early, reason), `${early?.name}: ${early?.message}`)
    t.is(openFds(), before, 'no connection made')
    t.is(sockets.length, 0)

    const ac = new AbortController()
    const late = new Error('late')
    silent.once('connection', () => ac.abort(late))
    const started = Date.now()
    const err = await t.throwsAsync(engine.openSegment(name, { signal: ac.signal }))
    t.true(isAbort(err, late), `${err?.name}: ${err?.message}`)
    t.true(Date.now() - started < 20_000, 'rejected before the connect timeout')
    // The attempt stopped: its connection is closed long before the connect timeout.
    const closed = Promise.all(sockets.map((s) => (s.destroyed || s.readableEnded ? undefined : Promise.race([once(s, 'end'), once(s, 'close')]))))
    t.is(await aliveAfter(closed, 10_000), 'exited', 'the aborted attempt let go of its connection')
  } finally {
    await engine.close()
    for (const s of sockets) s.destroy()
    silent.close()
  }
})

test('notify: a fired signal rejects and sends nothing; waiting for notifications takes a signal', async (t) => {
  t.timeout(60_000)
  const target = await Engine.create({ transports: ['tcp'] })
  const sender = await Engine.create({ transports: ['tcp'] })
  try {
    const seg = await sender.openSegment(target.segmentName)
    const reason = new Error('never mind')
    const err = await t.throwsAsync(sender.notify(seg, 'not sent', { signal: AbortSignal.abort(reason) }))
    t.true(isAbort(err, reason), `${err?.name}: ${err?.message}`)
    t.deepEqual(await sender.notify(seg, 'sent', { signal: new AbortController().signal }), { outcome: 'queued' })
    const it = target.notifications()
    const first = await it.next()
    t.is(first.value?.data.toString(), 'sent', 'the aborted notification never left')
    await it.return?.()
    // Waiting, aborted.
    const ac = new AbortController()
    const waiting = target.notifications({ signal: ac.signal }).next()
    const why = new Error('done waiting')
    ac.abort(why)
    const e = await t.throwsAsync(waiting)
    t.true(isAbort(e, why), `${e?.name}: ${e?.message}`)
  } finally {
    await sender.close()
    await target.close()
  }
})

test('every options object refuses an unknown key, naming it', async (t) => {
  const engine = await Engine.create({ transports: ['tcp'] })
  const peer = await Engine.create({ transports: ['tcp'] })
  try {
    const seg = await engine.openSegment(peer.segmentName)
    const local = engine.allocate(4096)
    const refused = (key: string) => ({ code: 'ERR_FERRY_INVALID_ARGUMENT', message: new RegExp(`"${key}"`) })
    await t.throwsAsync(Engine.create({ transports: ['tcp'], singal: 1 } as never), refused('singal'))
    await t.throwsAsync(engine.openSegment(peer.segmentName, { sigal: 1 } as never), refused('sigal'))
    await t.throwsAsync(engine.openSegment(peer.segmentName, 'x' as never), { code: 'ERR_FERRY_INVALID_ARGUMENT' })
    await t.throwsAsync(engine.notify(seg, 'x', { timeout: 1 } as never), refused('timeout'))
    t.throws(() => engine.registerMemory(Buffer.from(new SharedArrayBuffer(64)), { readonly: true } as never), refused('readonly'))
    await t.throwsAsync(engine.transfer([{ opcode: 'read', local, remote: seg, length: 64 }], { signl: 1 } as never), refused('signl'))
    t.throws(() => engine.submitTransfer(engine.allocateBatch(1), [{ opcode: 'read', local, remote: seg, length: 64 }], { notfy: 'x' } as never), refused('notfy'))
    t.throws(() => engine.notifications({ sgnal: 1 } as never), refused('sgnal'))
    await t.throwsAsync(engine.read({ local, remote: seg, length: 64, lenght: 1 } as never), refused('lenght'))
    await t.throwsAsync(engine.readBlocks({ local, remote: seg, localOffsets: [0], remoteOffsets: [0], lengths: [64], oops: 1 } as never), refused('oops'))
  } finally {
    await engine.close()
    await peer.close()
  }
})

test('`using` releases a region, `await using` closes an engine; both idempotent', async (t) => {
  const engine = await Engine.create({ transports: ['tcp'] })
  const region = engine.allocate(4096)
  region[Symbol.dispose]()
  t.true(region.released)
  region[Symbol.dispose]()
  const other = engine.allocate(4096)
  await other[Symbol.asyncDispose]()
  t.true(other.released)
  const last = engine.allocate(4096)
  await engine[Symbol.asyncDispose]()
  t.true(engine.closed)
  // A region of a closed engine disposes quietly.
  t.notThrows(() => last[Symbol.dispose]())
  await engine[Symbol.asyncDispose]()
})
