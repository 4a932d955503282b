/** Cluster mode through a real etcd: logical names, lease-bound records, clear errors. */
import test from 'ava'
import { createHash } from 'node:crypto'
import * as net from 'node:net'
import { Engine, type EngineEvent, type FerryError, type PeerLostEvent, type Region, type Segment } from '../index'
import { etcdRecords, startEtcd, stopAllEtcd, testWithEtcd, type EtcdServer } from './etcd'
import { delay, killAll, startTarget } from './helpers'
import { pattern } from './fixtures/pattern'
import { unusedPort } from '../support/ports'
import { startEtcd as startEtcdProcess } from '../support/etcd'

test.after.always(() => {
  killAll()
  stopAllEtcd()
})

const MiB = 1 << 20
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')
const etcdTest = testWithEtcd()

etcdTest('an etcd whose picked port was taken before it bound it starts again on fresh ports', async (t) => {
  t.timeout(60_000)
  // Another test's pick of the same port, listening by the time etcd binds it.
  // Connections to it (etcd's health check of the first start) are cut at once, so that
  // closing it waits for none.
  const taken = net.createServer((socket) => socket.destroy())
  const port = await unusedPort()
  await new Promise<void>((resolve) => taken.listen(port, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => taken.close(() => resolve())))
  const pids: number[] = []
  const etcd = await startEtcdProcess({
    name: 'ferry-test-port',
    firstPorts: [port, await unusedPort(), await unusedPort()],
    onStart: (proc) => pids.push(proc.pid ?? 0),
  })
  t.teardown(() => etcd.stop())
  t.is(pids.length, 2, 'the first start failed on the taken port, the second one started')
  t.not(new URL(etcd.clientUrl).port, String(port))
  const health = await fetch(`${etcd.clientUrl}/health`, { signal: AbortSignal.timeout(5000) })
  t.regex(await health.text(), /"health":"true"/)
})

etcdTest('a target process registered under a logical name is opened through etcd, written and verified', async (t) => {
  t.timeout(60_000)
  const etcd = await startEtcd()
  const target = await startTarget({
    FERRY_TARGET_BYTES: String(4 * MiB),
    FERRY_TARGET_METADATA: etcd.url,
    FERRY_TARGET_SEGMENT_NAME: 'prefill-0',
    FERRY_TARGET_LEASE_TTL_MS: '2000',
  })
  const engine = await Engine.create({ transports: ['tcp'], metadata: etcd.url, leaseTtlMs: 2000 })
  const lost: EngineEvent[] = []
  engine.on('peerLost', (e: EngineEvent) => lost.push(e))
  try {
    t.is(target.segment, 'prefill-0')
    t.regex(engine.segmentName, /^127\.0\.0\.1:\d+$/, 'published under host:port by default')
    const seg = await engine.openSegment('prefill-0')
    t.is(seg.name, 'prefill-0')
    const src = engine.allocate(4 * MiB)
    pattern(21, 4 * MiB).copy(src.buffer)
    const r = await engine.write({ local: src, remote: seg, remoteBuffer: target.buffer, length: 4 * MiB })
    t.is(r.bytes, 4 * MiB)
    t.is((await target.ask('hash')).hash, sha256(src.buffer), 'target memory equals what was written')

    const missing = await t.throwsAsync<FerryError>(engine.openSegment('nobody'))
    t.is(missing?.code, 'ERR_FERRY_UNKNOWN_SEGMENT')

    // The target dies: its peer is reported lost (control link or lease, whichever first).
    await target.kill()
    const started = Date.now()
    while (lost.length === 0 && Date.now() - started < 5000) await delay(20)
    t.is(lost[0]?.segment, 'prefill-0')
  } finally {
    await engine.close()
    await target.kill()
    await etcd.stop()
  }
})

etcdTest('SIGKILL in etcd mode: peerLost through the control connection at once, and the lease expires too', async (t) => {
  t.timeout(60_000)
  const etcd = await startEtcd()
  const target = await startTarget({
    FERRY_TARGET_BYTES: String(MiB),
    FERRY_TARGET_METADATA: etcd.url,
    FERRY_TARGET_SEGMENT_NAME: 'decode-1',
    FERRY_TARGET_LEASE_TTL_MS: '2000',
  })
  const engine = await Engine.create({ transports: ['tcp'], metadata: etcd.url })
  const lost: Array<{ at: number; reason?: string }> = []
  engine.on('peerLost', (e) => lost.push({ at: Date.now(), reason: e.reason }))
  try {
    await engine.openSegment('decode-1')
    await target.kill('SIGKILL')
    const killedAt = Date.now()
    while (lost.length === 0 && Date.now() - killedAt < 5000) await delay(10)
    t.true(lost.length === 1 && lost[0].at - killedAt < 1000, `peerLost ${lost[0]?.at - killedAt} ms after the kill`)
    t.is(lost[0]?.reason, 'crashed', 'seen by its control connection, closed without a goodbye')
    // The dead engine cannot keep its lease: its record goes within the TTL (2 s), so a
    // fresh engine no longer finds the name.
    const fresh = await Engine.create({ transports: ['tcp'], metadata: etcd.url })
    try {
      let code: string | undefined
      while (Date.now() - killedAt < 6000) {
        try {
          await fresh.openSegment('decode-1')
        } catch (e) {
          code = (e as FerryError).code
          if (code === 'ERR_FERRY_UNKNOWN_SEGMENT') break
        }
        await delay(100)
      }
      t.is(code, 'ERR_FERRY_UNKNOWN_SEGMENT', 'the record expired with the lease')
      t.log(`record gone ${Date.now() - killedAt} ms after the kill (lease TTL 2000 ms)`)
    } finally {
      await fresh.close()
    }
  } finally {
    await engine.close()
    await target.kill()
    await etcd.stop()
  }
})

etcdTest('a hung target (SIGSTOP) that the control link would not notice for a minute is lost through lease expiry and a direct check', async (t) => {
  t.timeout(60_000)
  const etcd = await startEtcd()
  const target = await startTarget({
    FERRY_TARGET_BYTES: String(MiB),
    FERRY_TARGET_METADATA: etcd.url,
    FERRY_TARGET_SEGMENT_NAME: 'decode-2',
    FERRY_TARGET_LEASE_TTL_MS: '2000',
  })
  const engine = await Engine.create({ transports: ['tcp'], metadata: etcd.url, peerTimeoutMs: 60_000 })
  const lost: Array<{ at: number; reason?: string; message?: string }> = []
  engine.on('peerLost', (e) => lost.push({ at: Date.now(), reason: e.reason, message: e.message }))
  try {
    await engine.openSegment('decode-2')
    process.kill(target.pid, 'SIGSTOP')
    const stoppedAt = Date.now()
    while (lost.length === 0 && Date.now() - stoppedAt < 10_000) await delay(20)
    t.is(lost.length, 1, 'peerLost through the lease')
    t.is(lost[0]?.reason, 'timeout', 'an unanswered check after the lease expired is silence')
    t.regex(lost[0]?.message ?? '', /etcd/)
    // The lease (2 s), etcd's expiry check, then the direct check that the record's removal
    // starts (1.5 s without an answer), with a margin.
    t.true(lost[0].at - stoppedAt < 2000 + 1500 + 3000, `lost ${lost[0]?.at - stoppedAt} ms after SIGSTOP (TTL 2000 ms)`)
    t.log(`peerLost ${lost[0].at - stoppedAt} ms after SIGSTOP: ${lost[0].message}`)
  } finally {
    process.kill(target.pid, 'SIGCONT')
    await engine.close()
    await target.kill()
    await etcd.stop()
  }
})

/** Waits (bounded) until `done()` holds; how long it took, in ms. */
async function waitUntil(what: string, withinMs: number, done: () => boolean | Promise<boolean>): Promise<number> {
  const started = Date.now()
  while (!(await done())) {
    if (Date.now() - started > withinMs) throw new Error(`${what}: not within ${withinMs} ms`)
    await delay(20)
  }
  return Date.now() - started
}

/** Pauses etcd (SIGSTOP, by pid) until `resume` (SIGCONT), which cleanup calls too. */
function pauseEtcd(etcd: EtcdServer) {
  process.kill(etcd.pid, 'SIGSTOP')
  let paused = true
  return {
    resume() {
      if (paused) process.kill(etcd.pid, 'SIGCONT')
      paused = false
    },
  }
}

/** Writers that each loop 64 KiB writes into their own slot of a peer's buffer, paced. */
function startPairWriters(pairs: Array<{ engine: Engine; local: Region; remote: Segment; remoteBuffer: number; slot: number }>) {
  const SLOT = 64 << 10
  let running = true
  const completed = pairs.map(() => 0)
  const failures: string[] = []
  const pump = async (i: number) => {
    const { engine, local, remote, remoteBuffer, slot } = pairs[i]
    while (running) {
      try {
        await engine.write({ local, remote, remoteBuffer, remoteOffset: slot * SLOT, length: SLOT })
        completed[i]++
      } catch (e) {
        failures.push(`${remote.name}: ${(e as FerryError).code} ${(e as Error).message}`)
      }
      await delay(10)
    }
  }
  const done = Promise.all(pairs.map((_, i) => pump(i)))
  return {
    failures,
    /** Waits (bounded) until every writer completed `more` writes beyond what it had. */
    async progress(more: number, withinMs: number, when: string) {
      const from = [...completed]
      await waitUntil(`writes ${when}`, withinMs, () => completed.every((c, i) => c >= from[i] + more))
    },
    async stop() {
      running = false
      await done
    },
  }
}

etcdTest('a paused etcd loses no peer: links and writes go on, every record is published again within 10 s', async (t) => {
  t.timeout(90_000)
  const etcd = await startEtcd()
  const TTL = 2000
  const target = await startTarget({
    FERRY_TARGET_BYTES: String(MiB),
    FERRY_TARGET_METADATA: etcd.url,
    FERRY_TARGET_SEGMENT_NAME: 'pause-t',
    FERRY_TARGET_LEASE_TTL_MS: String(TTL),
  })
  const names = ['pause-0', 'pause-1', 'pause-2']
  const engines: Engine[] = []
  let pause: { resume(): void } | undefined
  let writers: ReturnType<typeof startPairWriters> | undefined
  const lost: string[] = []
  try {
    for (const segmentName of names) {
      const e = await Engine.create({ transports: ['tcp'], metadata: etcd.url, segmentName, leaseTtlMs: TTL })
      e.on('peerLost', (ev: PeerLostEvent) => lost.push(`${segmentName} lost ${ev.segment}: ${ev.reason}`))
      engines.push(e)
    }
    const inboxes = engines.map((e) => e.allocate(MiB))
    const pairs = []
    for (const [i, engine] of engines.entries()) {
      const local = engine.allocate(64 << 10)
      local.buffer.fill(i + 1)
      pairs.push({ engine, local, remote: await engine.openSegment('pause-t'), remoteBuffer: target.buffer, slot: i })
      for (const [j, name] of names.entries()) {
        if (j !== i) pairs.push({ engine, local, remote: await engine.openSegment(name), remoteBuffer: inboxes[j].id, slot: i })
      }
    }
    writers = startPairWriters(pairs)
    await writers.progress(3, 20_000, 'before the pause')
    const before = await etcdRecords(etcd)
    t.truthy(before, 'etcd answers')
    t.deepEqual([...before!.created.keys()].filter((n) => n.startsWith('pause-')).sort(), ['pause-0', 'pause-1', 'pause-2', 'pause-t'])

    // Paused three times the lease: every lease has expired when etcd runs again.
    pause = pauseEtcd(etcd)
    const pausedAt = Date.now()
    await writers.progress(3, 3 * TTL, 'while etcd is paused')
    await delay(Math.max(0, 3 * TTL - (Date.now() - pausedAt)))
    pause.resume()
    const took = await waitUntil('every record published again', 10_000, async () => {
      const now = await etcdRecords(etcd)
      return ['pause-t', ...names].every((n) => (now?.created.get(n) ?? 0) > before!.revision)
    })
    t.log(`every record published again ${took} ms after etcd resumed`)
    await writers.progress(3, 10_000, 'after etcd resumed')
    // A direct check that failed would show by now (its bound is 1.5 s).
    await delay(3000)
    await writers.stop()
    t.deepEqual(lost, [], 'no peerLost')
    t.deepEqual(writers.failures.slice(0, 3), [], `${writers.failures.length} writes failed`)
  } finally {
    pause?.resume()
    await writers?.stop()
    for (const e of engines) await e.close()
    await target.kill()
    await etcd.stop()
  }
})

etcdTest('during an etcd outage a peer that dies or hangs is still lost through its control link', async (t) => {
  t.timeout(60_000)
  const etcd = await startEtcd()
  const PEER_TIMEOUT = 2000
  const start = (name: string) =>
    startTarget({
      FERRY_TARGET_BYTES: String(MiB),
      FERRY_TARGET_METADATA: etcd.url,
      FERRY_TARGET_SEGMENT_NAME: name,
      FERRY_TARGET_LEASE_TTL_MS: '2000',
    })
  const killed = await start('outage-killed')
  const hung = await start('outage-hung')
  const engine = await Engine.create({ transports: ['tcp'], metadata: etcd.url, peerTimeoutMs: PEER_TIMEOUT })
  const lost = new Map<string, { at: number; reason: string; message: string }>()
  engine.on('peerLost', (e: PeerLostEvent) => lost.set(e.segment, { at: Date.now(), reason: e.reason, message: e.message }))
  let pause: { resume(): void } | undefined
  let hungStopped = false
  try {
    await engine.openSegment('outage-killed')
    await engine.openSegment('outage-hung')
    pause = pauseEtcd(etcd)
    const killedAt = Date.now()
    await killed.kill('SIGKILL')
    process.kill(hung.pid, 'SIGSTOP')
    hungStopped = true
    const stoppedAt = Date.now()
    await waitUntil('both peers lost', PEER_TIMEOUT + 5000, () => lost.size === 2)
    const k = lost.get('outage-killed')!
    const h = lost.get('outage-hung')!
    t.log(`killed: lost ${k.at - killedAt} ms after SIGKILL (${k.reason}: ${k.message}); hung: ${h.at - stoppedAt} ms after SIGSTOP (${h.reason}: ${h.message})`)
    t.true(k.at - killedAt < PEER_TIMEOUT, `the killed peer was lost ${k.at - killedAt} ms after the kill`)
    t.is(k.reason, 'crashed')
    t.notRegex(k.message, /etcd/)
    t.true(h.at - stoppedAt < PEER_TIMEOUT + 1500, `the hung peer was lost ${h.at - stoppedAt} ms after SIGSTOP (peer timeout ${PEER_TIMEOUT} ms)`)
    t.is(h.reason, 'timeout')
    t.regex(h.message, /no heartbeat answer/)
  } finally {
    pause?.resume()
    if (hungStopped) process.kill(hung.pid, 'SIGCONT')
    await engine.close()
    await killed.kill()
    await hung.kill()
    await etcd.stop()
  }
})

etcdTest('a name is one engine\'s: a second live engine cannot take it, a restarted one takes over at once', async (t) => {
  t.timeout(60_000)
  const etcd = await startEtcd()
  const target = await startTarget({
    FERRY_TARGET_BYTES: String(MiB),
    FERRY_TARGET_METADATA: etcd.url,
    FERRY_TARGET_SEGMENT_NAME: 'kv-7',
  })
  try {
    const clash = await t.throwsAsync<FerryError>(Engine.create({ metadata: etcd.url, segmentName: 'kv-7' }))
    t.is(clash?.code, 'ERR_FERRY_METADATA')
    t.regex(clash?.message ?? '', /"kv-7" is held by another live engine/)
    // The holder dies without revoking its lease (default TTL 5 s); a replacement started
    // right away takes the name because the dead engine no longer answers.
    await target.kill('SIGKILL')
    const killedAt = Date.now()
    const successor = await Engine.create({ metadata: etcd.url, segmentName: 'kv-7' })
    const took = Date.now() - killedAt
    try {
      t.true(took < 3000, `took over ${took} ms after the kill`)
      const opener = await Engine.create({ metadata: etcd.url })
      try {
        const seg = await opener.openSegment('kv-7')
        t.is(seg.name, 'kv-7')
        const src = opener.allocate(4096)
        const dst = successor.allocate(4096)
        const info = await opener.openSegment('kv-7')
        const w = await opener.write({ local: src, remote: info, remoteBuffer: dst.id, length: 4096 })
        t.is(w.bytes, 4096, 'the name now leads to the successor')
      } finally {
        await opener.close()
      }
    } finally {
      await successor.close()
    }
  } finally {
    await target.kill()
    await etcd.stop()
  }
})

etcdTest('a successor on the dead holder\'s own address takes the name without waiting for it', async (t) => {
  // A restarted worker comes back on the same host:port. Its name's record still names the
  // dead engine there; the successor already holds that port, so the dead engine cannot be
  // answering at it and there is nothing to wait for (the probe's bound is 1 s).
  t.timeout(60_000)
  const etcd = await startEtcd()
  const listen = `127.0.0.1:${await unusedPort()}`
  const target = await startTarget({
    FERRY_TARGET_BYTES: String(MiB),
    FERRY_TARGET_METADATA: etcd.url,
    FERRY_TARGET_SEGMENT_NAME: 'kv-8',
    FERRY_TARGET_LISTEN: listen,
  })
  try {
    await target.kill('SIGKILL')
    const started = Date.now()
    const successor = await Engine.create({ metadata: etcd.url, segmentName: 'kv-8', listen })
    const took = Date.now() - started
    try {
      t.true(took < 1000, `Engine.create took ${took} ms; the dead holder was not probed at our own address`)
      const opener = await Engine.create({ metadata: etcd.url })
      try {
        const src = opener.allocate(4096)
        const dst = successor.allocate(4096)
        const info = await opener.openSegment('kv-8')
        const w = await opener.write({ local: src, remote: info, remoteBuffer: dst.id, length: 4096 })
        t.is(w.bytes, 4096, 'the name leads to the successor')
      } finally {
        await opener.close()
      }
    } finally {
      await successor.close()
    }
  } finally {
    await target.kill()
    await etcd.stop()
  }
})

etcdTest('a survivor whose link is backing off reaches the restarted peer at once: a notification does not wait for the next try', async (t) => {
  // Notifications ride on the link. After a crash the link retries with a growing backoff
  // (0.1, 0.2, 0.4 … s) against an address that refuses; the restarted engine's etcd record
  // tells the survivor it is back, and the link must not sleep out its backoff then.
  t.timeout(60_000)
  const etcd = await startEtcd()
  const listen = `127.0.0.1:${await unusedPort()}`
  const env = { FERRY_TARGET_BYTES: String(MiB), FERRY_TARGET_METADATA: etcd.url, FERRY_TARGET_SEGMENT_NAME: 'kv-10', FERRY_TARGET_LISTEN: listen }
  const target = await startTarget(env)
  const opener = await Engine.create({ metadata: etcd.url })
  let successor: Engine | undefined
  try {
    const lost: number[] = []
    const back: number[] = []
    opener.on('peerLost', () => lost.push(Date.now()))
    opener.on('peerRecovered', () => back.push(Date.now()))
    const seg = await opener.openSegment('kv-10')
    const src = opener.allocate(4096)
    await target.kill('SIGKILL')
    for (const until = Date.now() + 10_000; lost.length === 0 && Date.now() < until;) await delay(10)
    t.is(lost.length, 1, 'the crash is seen')
    // Not ordering a race: the link's tries grow apart (with ±20 % jitter the 5th is done by
    // 3.72 s, the 6th comes 5.04 s or later after the loss).
    await delay(Math.max(0, lost[0]! + 4000 - Date.now()))
    successor = await Engine.create({ metadata: etcd.url, segmentName: 'kv-10', listen })
    const dst = successor.allocate(4096)
    for (const until = Date.now() + 10_000; back.length === 0 && Date.now() < until;) await delay(5)
    t.is(back.length, 1, 'the restart is seen through etcd')
    const started = Date.now()
    const w = await opener.write({ local: src, remote: seg, remoteBuffer: dst.id, length: 4096, notify: 'back' })
    const took = Date.now() - started
    t.is(w.bytes, 4096)
    t.true(took < 600, `the write and its notification took ${took} ms after the peer was seen back (the link's next try was at least 1 s away)`)
  } finally {
    await opener.close()
    await successor?.close()
    await target.kill()
    await etcd.stop()
  }
})

test('metadata options: bad URL and etcd-only options throw INVALID_ARGUMENT; unreachable etcd throws ERR_FERRY_METADATA', async (t) => {
  t.timeout(30_000)
  for (const options of [
    { metadata: 'etcd://nohost' as const },
    { metadata: 'zk://h:1' as unknown as 'p2p' },
    { segmentName: 'x' },
    { metadata: 'etcd://127.0.0.1:2379' as const, leaseTtlMs: 1500 },
  ]) {
    const err = await t.throwsAsync<FerryError>(Engine.create(options))
    t.is(err?.code, 'ERR_FERRY_INVALID_ARGUMENT', JSON.stringify(options))
  }
  const port = await unusedPort()
  const refused = await t.throwsAsync<FerryError>(Engine.create({ metadata: `etcd://127.0.0.1:${port}`, connectTimeoutMs: 500 }))
  t.is(refused?.code, 'ERR_FERRY_METADATA')
  t.regex(refused?.message ?? '', new RegExp(String(port)))
  // An etcd that accepts but never answers: the wait happens off the JS thread, so timers
  // keep firing meanwhile.
  const sockets = new Set<net.Socket>()
  const silent = net.createServer((s) => void sockets.add(s))
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', () => resolve()))
  const silentPort = (silent.address() as net.AddressInfo).port
  const started = Date.now()
  let ticks = 0
  const ticker = setInterval(() => ticks++, 20)
  const err = await t.throwsAsync<FerryError>(Engine.create({ metadata: `etcd://127.0.0.1:${silentPort}`, connectTimeoutMs: 500 }))
  clearInterval(ticker)
  for (const s of sockets) s.destroy()
  silent.close()
  t.is(err?.code, 'ERR_FERRY_METADATA')
  const waited = Date.now() - started
  t.true(waited >= 400 && waited < 5000, `waited ${waited} ms`)
  t.true(ticks >= Math.floor(waited / 20 / 3), `${ticks} timer ticks in ${waited} ms: the event loop was blocked`)
})
