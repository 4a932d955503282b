/**
 * Running out of file descriptors: an engine in a process under `prlimit --nofile` takes
 * every descriptor it may have (fixtures/fd-limit.ts, `exhaust`). Opening a segment fails
 * within a second with ERR_FERRY_RESOURCE_LIMIT naming the limit — on the engine that is
 * out of descriptors, and on one that opens it — and the peers it already has keep working.
 */
import test from 'ava'
import { Engine, FerryError } from '../index'
import { killAll, startTarget, type TargetProcess } from './helpers'

test.after.always(killAll)

const NOFILE = 256
/** What a typed failure may take, generously above the 1 s goal on a loaded machine. */
const FAIL_WITHIN_MS = 1000

const limited = () => startTarget({}, 20_000, ['prlimit', `--nofile=${NOFILE}`, '--'], 'fd-limit.ts')
const tcpTarget = () => startTarget({ FERRY_TARGET_TRANSPORTS: 'tcp', FERRY_TARGET_BYTES: String(1 << 20) })

async function ask(p: TargetProcess, cmd: string): Promise<Record<string, unknown>> {
  return p.ask(cmd)
}

test('an engine out of descriptors fails openSegment at once, typed, and keeps its peers', async (t) => {
  const [first, second] = await Promise.all([tcpTarget(), tcpTarget()])
  const c = await limited()
  t.teardown(() => Promise.all([first.kill(), second.kill(), c.kill()]).then(() => undefined))
  t.like(await ask(c, `open ${first.segment}`), { ok: true, index: 0 })
  t.like(await ask(c, `write 0 ${first.buffer}`), { ok: true })
  const exhausted = await ask(c, 'exhaust')
  t.true(Number(exhausted.held) > 0)

  const refused = await ask(c, `open ${second.segment}`)
  t.like(refused, { ok: false, code: 'ERR_FERRY_RESOURCE_LIMIT' })
  t.regex(String(refused.message), /open files/)
  t.regex(String(refused.message), new RegExp(`RLIMIT_NOFILE ${NOFILE}\\b`))
  t.true(Number(refused.ms) < FAIL_WITHIN_MS, `failed after ${refused.ms} ms`)

  // The peer it already has still takes writes.
  t.like(await ask(c, `write 0 ${first.buffer}`), { ok: true })

  t.like(await ask(c, 'release'), { released: exhausted.held })
  t.like(await ask(c, `open ${second.segment}`), { ok: true, index: 1 })
  t.like(await ask(c, `write 1 ${second.buffer}`), { ok: true })
})

test('a target out of descriptors refuses new peers at once, typed, and keeps its peers', async (t) => {
  const target = await limited()
  const engine = await Engine.create({ transports: ['tcp'] })
  const late = await Engine.create({ transports: ['tcp'] })
  t.teardown(async () => {
    await Promise.all([engine.close(), late.close()])
    await target.kill()
  })
  const local = engine.allocate(1 << 20)
  const seg = await engine.openSegment(target.segment)
  await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4096 })
  t.true(Number((await ask(target, 'exhaust')).held) > 0)

  const t0 = performance.now()
  const err = await t.throwsAsync<FerryError>(late.openSegment(target.segment))
  const ms = performance.now() - t0
  t.is(err?.code, 'ERR_FERRY_RESOURCE_LIMIT')
  t.regex(err?.message ?? '', /open files/)
  t.regex(err?.message ?? '', new RegExp(`RLIMIT_NOFILE ${NOFILE}\\b`))
  t.true(ms < FAIL_WITHIN_MS, `failed after ${ms} ms`)

  // The peer it already has still writes to it.
  await t.notThrowsAsync(engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4096 }))

  await ask(target, 'release')
  const reopened = await late.openSegment(target.segment)
  const lateLocal = late.allocate(4096)
  await t.notThrowsAsync(late.write({ local: lateLocal, remote: reopened, remoteBuffer: target.buffer, length: 4096 }))
})
