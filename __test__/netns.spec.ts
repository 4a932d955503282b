/**
 * Two hosts on one machine: this process (the initiator) in the root namespace and a target
 * process in its own network namespace, joined by a veth pair. Taking the target's end of
 * the link down is a silent host loss: no reset, no EOF, nothing but silence.
 */
import test, { type ExecutionContext } from 'ava'
import { Engine, FerryError, type PeerLostEvent, type PeerRecoveredEvent } from '../index'
import { delay, killAll, spawnNode, startTarget, type TargetProcess } from './helpers'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { createNetwork, ip, netnsUnavailable, sweep, type Network } from '../support/netns'
import { clusterNamespaces, sweepClusters } from '../support/netns-cluster'
import { spawn, spawnSync } from 'node:child_process'
import { startEtcd, stopAllEtcd, testWithEtcd } from './etcd'
import { createHash, randomBytes } from 'node:crypto'
import * as fs from 'node:fs'
import * as os from 'node:os'

test.after.always(killAll)
test.after.always(sweep)
test.after.always(stopAllEtcd)

const MiB = 1 << 20
// The targets listen beyond loopback, which needs the cluster secret: every engine of this
// file (here and in the children, which inherit the environment) reads it from this file.
const SECRET_FILE = path.join(os.tmpdir(), `ferry-netns-secret-${process.pid}`)
fs.writeFileSync(SECRET_FILE, randomBytes(32).toString('hex'), { mode: 0o600 })
process.env.FERRY_AUTH_SECRET_FILE = SECRET_FILE
process.on('exit', () => fs.rmSync(SECRET_FILE, { force: true }))
const skip = netnsUnavailable()
const etcdTest = testWithEtcd()

/** A network and a target inside namespace b; both removed in teardown, also on failure. */
async function setUp(t: ExecutionContext, peerTimeoutMs: number): Promise<{ net: Network; target: TargetProcess; engine: Engine }> {
  const net = createNetwork() // throws with a clear message if ip/namespaces fail
  t.teardown(() => net.destroy())
  const target = await startTarget(
    { FERRY_TARGET_BYTES: String(16 * MiB), FERRY_TARGET_LISTEN: `${net.b.address}:0`, FERRY_TARGET_MACHINE_ID: `host-b-${process.pid}` },
    20_000,
    net.prefix(net.b),
  )
  t.teardown(() => target.kill())
  const engine = await Engine.create({ peerTimeoutMs, machineId: `host-a-${process.pid}` })
  t.teardown(() => engine.close())
  return { net, target, engine }
}

if (skip) {
  test.skip(`network namespace tests skipped: ${skip}`, (t) => t.pass())
} else {
  test('across namespaces: bytes arrive intact over tcp, and the status says tcp', async (t) => {
    t.timeout(60_000)
    const { net, target, engine } = await setUp(t, 3000)
    t.true(target.segment.startsWith(net.b.address + ':'), target.segment)
    const seg = await engine.openSegment(target.segment)
    const local = engine.allocate(4 * MiB)
    for (let i = 0; i < local.length; i++) local.buffer[i] = (i * 31 + 7) & 0xff
    const w = await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4 * MiB })
    t.is(w.tasks[0].transport, 'tcp')
    const back = engine.allocate(4 * MiB)
    const r = await engine.read({ local: back, remote: seg, remoteBuffer: target.buffer, length: 4 * MiB })
    t.is(r.tasks[0].transport, 'tcp')
    t.true(back.buffer.equals(local.buffer), 'read back what was written')
    const m = engine.metrics()
    t.is(m.bytes.find((b) => b.transport === 'tcp' && b.op === 'write')?.bytes, 4 * MiB)
    t.is(m.bytes.find((b) => b.transport === 'tcp' && b.op === 'read')?.bytes, 4 * MiB)
    t.is(m.bytes.find((b) => b.transport === 'shm' && b.op === 'write')?.bytes, 0)
  })

  test('link down mid-stream: pending transfers FAIL within peerTimeoutMs + 1 s, peerLost fires; link up: transfers succeed again', async (t) => {
    t.timeout(90_000)
    const peerTimeoutMs = 1000
    const { net, target, engine } = await setUp(t, peerTimeoutMs)
    const lost: Array<PeerLostEvent & { at: number }> = []
    const recovered: PeerRecoveredEvent[] = []
    engine.on('peerLost', (e) => lost.push({ ...e, at: Date.now() }))
    engine.on('peerRecovered', (e) => recovered.push(e))
    const seg = await engine.openSegment(target.segment)
    const local = engine.allocate(16 * MiB)

    // A stream of 1 MiB writes, 8 in flight.
    let running = true
    let completed = 0
    const settled: Array<{ at: number; ok: boolean; code?: string }> = []
    const pending = new Set<Promise<void>>()
    let i = 0
    const launch = () => {
      if (!running) return
      const off = (i++ % 16) * MiB
      const p: Promise<void> = engine
        .write({ local, localOffset: off, remote: seg, remoteBuffer: target.buffer, remoteOffset: off, length: MiB })
        .then(
          () => void (completed++, settled.push({ at: Date.now(), ok: true })),
          (err: FerryError) => void settled.push({ at: Date.now(), ok: false, code: err.code }),
        )
        .finally(() => {
          pending.delete(p)
          launch()
        })
      pending.add(p)
    }
    for (let k = 0; k < 8; k++) launch()
    const warm = Date.now() + 15_000
    while (completed < 30 && Date.now() < warm) await delay(5)
    t.true(completed >= 30, 'the stream was flowing before the link went down')

    net.linkDown()
    const downAt = Date.now()
    // Keep launching for a moment: writes issued into the dead link hang (nothing answers,
    // nothing resets) until the peer is declared lost.
    await delay(200)
    running = false
    const inFlight = [...pending]
    t.true(inFlight.length > 0, 'writes were in flight')
    await Promise.race([Promise.all(inFlight), delay(peerTimeoutMs + 5000)])
    const after = settled.filter((x) => x.at >= downAt)
    const failures = after.filter((x) => !x.ok)
    t.true(failures.length > 0, 'pending writes failed')
    t.is(pending.size, 0, 'every pending write settled')
    const times = failures.map((f) => f.at - downAt).sort((x, y) => x - y)
    t.log(`time to FAILED after link down: median ${times[times.length >> 1]} ms, max ${times[times.length - 1]} ms (peerTimeoutMs ${peerTimeoutMs})`)
    for (const f of failures) t.is(f.code, 'ERR_FERRY_PEER_LOST')
    // Bound: peerTimeoutMs + 1 s, plus a small margin for scheduling on a loaded machine.
    t.true(times[times.length >> 1] < peerTimeoutMs + 1000 + 250, `median ${times[times.length >> 1]} ms`)
    t.true(times[times.length - 1] < peerTimeoutMs + 1000 + 250, `max ${times[times.length - 1]} ms`)
    while (lost.length === 0 && Date.now() - downAt < peerTimeoutMs + 3000) await delay(5)
    t.is(lost.length, 1, 'peerLost fired once')
    t.is(lost[0].segment, seg.name)
    t.true(lost[0].at - downAt < peerTimeoutMs + 1250, `peerLost ${lost[0].at - downAt} ms after link down`)
    t.true(engine.metrics().peersLost >= 1)
    const err = await t.throwsAsync<FerryError>(() => engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB }))
    t.is(err!.code, 'ERR_FERRY_PEER_LOST', 'while the link is down, new work fails fast')

    net.linkUp()
    const upAt = Date.now()
    let ok = false
    let last = ''
    while (!ok && Date.now() - upAt < 30_000) {
      try {
        const r = await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB })
        ok = r.tasks[0].transport === 'tcp'
      } catch (e) {
        last = (e as FerryError).code
        await delay(100)
      }
    }
    t.true(ok, `a write succeeded after the link came back (last error ${last})`)
    t.log(`first successful write ${Date.now() - upAt} ms after link up`)
    t.deepEqual(
      recovered.map((e) => e.segment),
      [seg.name],
      'peerRecovered fired',
    )
    // The bytes are there.
    for (let k = 0; k < MiB; k++) local.buffer[k] = (k * 7) & 0xff
    await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB })
    const back = engine.allocate(MiB)
    await engine.read({ local: back, remote: seg, remoteBuffer: target.buffer, length: MiB })
    t.true(back.buffer.equals(local.buffer.subarray(0, MiB)))
  })

  etcdTest('cluster mode across namespaces: found through etcd by name, link down → FAILED and peerLost, link up → recovered', async (t) => {
    t.timeout(90_000)
    const net = createNetwork()
    t.teardown(() => net.destroy())
    // etcd listens on host a's link address, so the target in b registers over the link.
    const etcd = await startEtcd(20_000, net.a.address)
    t.teardown(() => etcd.stop())
    const target = await startTarget(
      {
        FERRY_TARGET_BYTES: String(4 * MiB),
        FERRY_TARGET_LISTEN: '0.0.0.0:0',
        FERRY_TARGET_ADVERTISE: net.b.address,
        FERRY_TARGET_MACHINE_ID: `host-b-${process.pid}`,
        FERRY_TARGET_METADATA: etcd.url,
        FERRY_TARGET_SEGMENT_NAME: 'worker-b',
        FERRY_TARGET_LEASE_TTL_MS: '2000',
      },
      20_000,
      net.prefix(net.b),
    )
    t.teardown(() => target.kill())
    const peerTimeoutMs = 1000
    const engine = await Engine.create({ peerTimeoutMs, machineId: `host-a-${process.pid}`, metadata: etcd.url })
    t.teardown(() => engine.close())
    const lost: Array<PeerLostEvent & { at: number }> = []
    const recovered: PeerRecoveredEvent[] = []
    engine.on('peerLost', (e) => lost.push({ ...e, at: Date.now() }))
    engine.on('peerRecovered', (e) => recovered.push(e))

    const seg = await engine.openSegment('worker-b')
    const local = engine.allocate(4 * MiB)
    for (let i = 0; i < local.length; i++) local.buffer[i] = (i * 13 + 5) & 0xff
    const w = await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4 * MiB })
    t.is(w.tasks[0].transport, 'tcp')
    t.is((await target.ask('hash')).hash, createHash('sha256').update(local.buffer).digest('hex'))

    // Silent loss of host b while a write is in flight.
    const inflight = engine
      .write({ local, remote: seg, remoteBuffer: target.buffer, length: 4 * MiB, transport: 'tcp' })
      .then(
        () => ({ ok: true, at: Date.now(), code: undefined as string | undefined }),
        (e: FerryError) => ({ ok: false, at: Date.now(), code: e.code as string | undefined }),
      )
    net.linkDown()
    const downAt = Date.now()
    // A write started before the link went down may still have finished; then start one
    // that cannot.
    let outcome = await inflight
    if (outcome.ok && outcome.at - downAt < 50) {
      outcome = await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB }).then(
        () => ({ ok: true, at: Date.now(), code: undefined as string | undefined }),
        (e: FerryError) => ({ ok: false, at: Date.now(), code: e.code as string | undefined }),
      )
    }
    t.false(outcome.ok, 'a write across a dead link does not succeed')
    t.true(outcome.at - downAt <= peerTimeoutMs + 1000, `FAILED ${outcome.at - downAt} ms after link down`)
    t.true(lost.length >= 1, 'peerLost fired')
    t.log(`FAILED (${outcome.code}) ${outcome.at - downAt} ms after link down; peerLost: ${lost[0]?.reason}`)

    // Host b comes back: it re-registers in etcd, the peer recovers, writes work again.
    net.linkUp()
    const upAt = Date.now()
    let ok = false
    while (!ok && Date.now() - upAt < 20_000) {
      ok = await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB }).then(
        () => true,
        () => false,
      )
      if (!ok) await delay(100)
    }
    t.true(ok, 'writes succeed again after the link is back')
    t.true(recovered.length >= 1, 'peerRecovered fired')
    t.log(`write ok ${Date.now() - upAt} ms after link up`)
  })

  test('two namespaces of their own: initiator in a, target in b; link down → FAILED within peerTimeoutMs + 1 s; link up → writes again', async (t) => {
    t.timeout(90_000)
    const net = createNetwork({ ownNamespaceForA: true })
    t.teardown(() => net.destroy())
    const peerTimeoutMs = 1000
    const target = await startTarget(
      { FERRY_TARGET_BYTES: String(4 * MiB), FERRY_TARGET_LISTEN: `${net.b.address}:0`, FERRY_TARGET_MACHINE_ID: `host-b-${process.pid}` },
      20_000,
      net.prefix(net.b),
    )
    t.teardown(() => target.kill())
    const init = spawnNode(
      path.join(__dirname, 'fixtures', 'initiator.ts'),
      {
        FERRY_INIT_SEGMENT: target.segment,
        FERRY_INIT_BUFFER: String(target.buffer),
        FERRY_INIT_LISTEN: `${net.a.address}:0`,
        FERRY_INIT_MACHINE_ID: `host-a-${process.pid}`,
        FERRY_PEER_TIMEOUT_MS: String(peerTimeoutMs),
      },
      [],
      net.prefix(net.a),
    )
    t.teardown(() => {
      if (init.exitCode === null && init.signalCode === null) init.kill('SIGKILL')
    })
    let stderr = ''
    init.stderr?.on('data', (d) => (stderr += d))
    const seen: Array<Record<string, unknown>> = []
    readline.createInterface({ input: init.stdout! }).on('line', (l) => seen.push(JSON.parse(l)))
    const exited = new Promise<number | null>((resolve) => init.once('exit', (code) => resolve(code)))
    const waitFor = async (key: string, ms: number) => {
      const until = Date.now() + ms
      for (;;) {
        const hit = seen.find((e) => key in e)
        if (hit) return hit
        if (Date.now() > until || init.exitCode !== null) throw new Error(`no ${key} from the initiator: ${JSON.stringify(seen)} ${stderr}`)
        await delay(10)
      }
    }
    const v = await waitFor('verified', 20_000)
    t.true(v.verified as boolean, 'bytes read back from b equal those written from a')
    t.is(v.transport, 'tcp')
    await waitFor('streaming', 5_000)
    await delay(300)
    net.linkDown()
    const downAt = Date.now()
    const failed = await waitFor('failed', 10_000)
    const lostAt = (await waitFor('peerLost', 5_000)).peerLost as number
    const failedAfter = (failed.failed as number) - downAt
    t.log(`FAILED (${failed.code}) ${failedAfter} ms after link down, peerLost after ${lostAt - downAt} ms`)
    t.true(failedAfter <= peerTimeoutMs + 1000, `FAILED ${failedAfter} ms after link down`)
    net.linkUp()
    const upAt = Date.now()
    const recovered = await waitFor('recovered', 30_000)
    t.log(`writing again ${(recovered.recovered as number) - upAt} ms after link up`)
    t.is(await exited, 0, stderr)
  })

  test("the sweep removes what a killed run left (its pid is gone), keeps a live run's, and prints nothing", async (t) => {
    t.timeout(60_000)
    // A run killed before its sweep leaves its namespaces behind, and sometimes only their
    // empty mount points, which `ip netns list` complains about on stderr.
    const gone = spawnSync(process.execPath, ['-e', ''])
    const deadPid = gone.pid!
    const live = spawn('sleep', ['60'], { stdio: 'ignore' })
    t.teardown(() => {
      live.kill('SIGKILL')
      for (const name of [`ferry-b-${live.pid}y`, `ferry-b-${deadPid}a`]) spawnSync('ip', ['netns', 'del', name], { stdio: 'ignore' })
      fs.rmSync(`/run/netns/ferry-b-${deadPid}b`, { force: true })
    })
    ip(['netns', 'add', `ferry-b-${deadPid}a`])
    fs.writeFileSync(`/run/netns/ferry-b-${deadPid}b`, '', { mode: 0 })
    ip(['netns', 'add', `ferry-b-${live.pid}y`])
    const listed = () => fs.readdirSync('/run/netns')
    t.true(listed().includes(`ferry-b-${deadPid}b`))
    // Run by another process, whose stderr is read whole.
    const swept = spawnSync(process.execPath, ['--import=tsx', '-e', "require('./support/netns.ts').sweep()"], {
      cwd: path.join(__dirname, '..'),
      encoding: 'utf8',
      timeout: 30_000,
    })
    t.is(swept.status, 0, swept.stderr)
    t.is(swept.stderr, '')
    t.false(listed().includes(`ferry-b-${deadPid}a`), listed().join(' '))
    t.false(listed().includes(`ferry-b-${deadPid}b`), listed().join(' '))
    t.true(listed().includes(`ferry-b-${live.pid}y`), "a live process's namespace is its own")
  })

  test("the cluster sweep removes a killed soak's hub, hosts and uplink, and keeps a live run's", (t) => {
    t.timeout(60_000)
    const gone = spawnSync(process.execPath, ['-e', ''])
    const deadPid = gone.pid!
    const live = spawn('sleep', ['60'], { stdio: 'ignore' })
    const dead = [`ferry-c-${deadPid}a-hub`, `ferry-c-${deadPid}a-h0`]
    const kept = `ferry-c-${live.pid}b-hub`
    const uplink = `fc${deadPid}a`
    t.teardown(() => {
      live.kill('SIGKILL')
      for (const name of [...dead, kept]) spawnSync('ip', ['netns', 'del', name], { stdio: 'ignore' })
      spawnSync('ip', ['link', 'del', uplink], { stdio: 'ignore' })
    })
    for (const name of [...dead, kept]) ip(['netns', 'add', name])
    // As createCluster links this namespace to the hub.
    ip(['link', 'add', uplink, 'type', 'veth', 'peer', 'name', 'up0', 'netns', dead[0]])
    sweepClusters()
    const listed = fs.readdirSync('/run/netns')
    for (const name of dead) t.false(listed.includes(name), name)
    t.true(listed.includes(kept), "a live process's cluster is its own")
    t.false(ip(['-o', 'link', 'show']).includes(`: ${uplink}@`), 'the uplink is removed')
    t.deepEqual(clusterNamespaces(live.pid), [kept])
  })
}
