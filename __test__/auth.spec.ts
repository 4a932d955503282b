import test from 'ava'
import { randomBytes } from 'node:crypto'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { Engine, FerryError, TransferStatus } from '../index'
import { killAll, spawnNode } from './helpers'

test.after.always(killAll)

const KiB = 1 << 10

test('listening beyond loopback without a secret is refused, saying how to set one; allowUnauthenticated starts with a process warning', async (t) => {
  const err = await t.throwsAsync(Engine.create({ listen: '0.0.0.0:0', advertise: '127.0.0.1' }), { instanceOf: FerryError })
  t.is(err?.code, 'ERR_FERRY_INVALID_ARGUMENT')
  t.regex(err?.message ?? '', /authSecret .*FERRY_AUTH_SECRET_FILE/)
  const warnings: Error[] = []
  const onWarning = (w: Error) => warnings.push(w)
  process.on('warning', onWarning)
  t.teardown(() => process.off('warning', onWarning))
  const open = await Engine.create({ listen: '0.0.0.0:0', advertise: '127.0.0.1', allowUnauthenticated: true })
  t.teardown(() => open.close())
  t.regex(open.segmentName, /^127\.0\.0\.1:\d+$/)
  // Started, with a process warning naming the exposure ('warning' is emitted on the next tick).
  await new Promise((resolve) => setImmediate(resolve))
  const unauthenticated = warnings.filter((w) => (w as Error & { code?: string }).code === 'FERRY_UNAUTHENTICATED')
  t.is(unauthenticated.length, 1, warnings.map((w) => w.message).join('; '))
  t.regex(unauthenticated[0].message, /0\.0\.0\.0:\d+ beyond loopback WITHOUT authentication/)
  // On loopback, or with a secret, no warning.
  const quiet = await Engine.create({})
  t.teardown(() => quiet.close())
  const secured = await Engine.create({ listen: '0.0.0.0:0', advertise: '127.0.0.1', authSecret: randomBytes(32) })
  t.teardown(() => secured.close())
  await new Promise((resolve) => setImmediate(resolve))
  t.is(warnings.filter((w) => (w as Error & { code?: string }).code === 'FERRY_UNAUTHENTICATED').length, 1)
})

test('engines with the same secret (string or Buffer) move bytes; another secret or none is refused', async (t) => {
  t.timeout(30_000)
  const secret = randomBytes(32)
  const target = await Engine.create({ authSecret: secret, listen: '0.0.0.0:0', advertise: '127.0.0.1' })
  t.teardown(() => target.close())
  const remote = target.allocate(64 * KiB)
  const friend = await Engine.create({ authSecret: Buffer.from(secret) })
  t.teardown(() => friend.close())
  const local = friend.allocate(64 * KiB)
  randomBytes(64 * KiB).copy(local.buffer)
  const seg = await friend.openSegment(target.segmentName)
  const r = await friend.write({ local, remote: seg, remoteBuffer: remote.id, length: 64 * KiB })
  t.is(r.tasks[0].status, TransferStatus.COMPLETED)
  t.true(remote.buffer.equals(local.buffer))
  for (const authSecret of [randomBytes(32), undefined]) {
    const stranger = await Engine.create(authSecret === undefined ? {} : { authSecret })
    t.teardown(() => stranger.close())
    const err = await t.throwsAsync(stranger.openSegment(target.segmentName), { instanceOf: FerryError })
    t.is(err?.code, 'ERR_FERRY_CONNECT', err?.message)
  }
  // Both strangers hold a secret (the one given no secret holds this user's per-user
  // secret), find that the target does not hold it, and walk away: `aborted`, which the
  // target learns of only when its read of the proof meets the close. Wait for it (bounded).
  const deadline = Date.now() + 10_000
  while (target.metrics().authFailures.aborted < 2 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
  const text = target.metricsText()
  t.regex(text, /^ferry_auth_failures_total\{reason="aborted"\} 2$/m)
  t.regex(text, /^ferry_auth_failures_total\{reason="no_secret"\} 0$/m)
  t.regex(text, /^ferry_connections_refused_total\{reason="per_address"\} 0$/m)
  const m = target.metrics()
  t.like(m.authFailures, { aborted: 2, no_secret: 0, bad_proof: 0 })
  t.like(m.connectionsRefused, { total: 0, per_address: 0, evicted: 0 })
  // A string secret is its UTF-8 bytes.
  const texted = await Engine.create({ authSecret: 'x'.repeat(40) })
  t.teardown(() => texted.close())
  const other = await Engine.create({ authSecret: Buffer.from('x'.repeat(40)) })
  t.teardown(() => other.close())
  await t.notThrowsAsync(texted.openSegment(other.segmentName))
})

test('a short secret is refused', async (t) => {
  for (const authSecret of ['short', Buffer.alloc(31)]) {
    const err = await t.throwsAsync(Engine.create({ authSecret }), { instanceOf: FerryError })
    t.is(err?.code, 'ERR_FERRY_INVALID_ARGUMENT')
    t.regex(err?.message ?? '', /at least 32 bytes/)
  }
})

/** What the initiator fixture (as `prefix` runs it) said first, or how it ended. */
async function initiatorOutcome(segment: string, buffer: number, env: Record<string, string>, prefix: string[]) {
  const proc = spawnNode(path.join(__dirname, 'fixtures', 'initiator.ts'), { FERRY_INIT_SEGMENT: segment, FERRY_INIT_BUFFER: String(buffer), ...env }, [], prefix)
  let stderr = ''
  proc.stderr?.on('data', (d) => (stderr += d))
  const lines = readline.createInterface({ input: proc.stdout! })
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)))
  const first = new Promise<Record<string, unknown>>((resolve) => lines.once('line', (l) => resolve(JSON.parse(l))))
  const timer = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), 30_000).unref())
  const said = await Promise.race([first, exited.then((code) => ({ exited: code })), timer])
  if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL')
  await exited
  return { said, stderr }
}

test('with no secret, another process of this user works with no configuration; a process of another uid is refused', async (t) => {
  t.timeout(90_000)
  const target = await Engine.create({ transports: ['shm', 'tcp'] })
  t.teardown(() => target.close())
  const region = target.allocate(4 * 1024 * KiB)
  const same = await initiatorOutcome(target.segmentName, region.id, {}, [])
  t.like(same.said, { verified: true }, same.stderr)
  // Another uid, with a per-user secret of its own: refused, and nothing written.
  region.buffer.fill(5)
  const theirs = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-nobody-secret-'))
  t.teardown(() => fs.rmSync(theirs, { recursive: true, force: true }))
  fs.chownSync(theirs, 65534, 65534)
  const nobody = ['setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups']
  const other = await initiatorOutcome(target.segmentName, region.id, { FERRY_USER_SECRET_DIR: theirs }, nobody)
  t.deepEqual(other.said, { exited: 1 }, other.stderr)
  t.regex(other.stderr, /cannot connect to .*: authentication failed: the peer does not hold our cluster secret/)
  t.true(region.buffer.every((b) => b === 5), 'another uid wrote nothing')
})
