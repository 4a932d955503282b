/** Cluster mode through a real etcd: logical names, lease-bound records, clear errors. */
import test from 'ava'
import { createHash } from 'node:crypto'
import * as net from 'node:net'
import { Engine, type EngineEvent, type FerryError } from '../index'
import { startEtcd, stopAllEtcd } from './etcd'
import { delay, killAll, startTarget } from './helpers'
import { pattern } from './fixtures/pattern'

test.after.always(() => {
  killAll()
  stopAllEtcd()
})

const MiB = 1 << 20
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

test('a target process registered under a logical name is opened through etcd, written and verified', async (t) => {
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

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port
      srv.close(() => resolve(port))
    })
  })
}

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
  const port = await freePort()
  const started = Date.now()
  const err = await t.throwsAsync<FerryError>(Engine.create({ metadata: `etcd://127.0.0.1:${port}`, connectTimeoutMs: 500 }))
  t.is(err?.code, 'ERR_FERRY_METADATA')
  t.regex(err?.message ?? '', new RegExp(String(port)))
  t.true(Date.now() - started < 5000)
})
