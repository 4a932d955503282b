// Fenced cancel through the JS API: a 256 MiB write aborted by its AbortSignal mid-flight
// rejects with an AbortError only once nothing of it can land any more. The target's whole
// buffer is hashed several times over the next 500 ms after the rejection: it must not
// change.
import test from 'ava'
import { Engine, type TransportName } from '../index'
import { delay, killAll, startTarget } from './helpers'

test.after.always(killAll)

const MiB = 1 << 20
const SIZE = 256 * MiB

for (const transport of ['tcp', 'shm'] as TransportName[]) {
  test(`a ${transport} write aborted mid-flight lands nothing after its rejection`, async (t) => {
    t.timeout(120_000)
    const transports = transport === 'shm' ? 'shm,tcp' : 'tcp'
    const target = await startTarget({ FERRY_TARGET_BYTES: String(SIZE), FERRY_TARGET_TRANSPORTS: transports })
    const engine = await Engine.create({ transports: transports.split(',') as TransportName[] })
    try {
      const local = engine.allocate(SIZE)
      local.buffer.fill(0x5a)
      const seg = await engine.openSegment(target.segment)
      const ac = new AbortController()
      const writing = engine.write({
        local,
        remote: seg,
        remoteBuffer: target.buffer,
        length: SIZE,
        requireTransport: transport,
        signal: ac.signal,
      })
      // Mid-flight: the target saw the first bytes land (bounded wait).
      const until = Date.now() + 60_000
      while (!(await target.ask('landed')).landed) {
        if (Date.now() > until) throw new Error('no byte of the write landed in 60 s')
      }
      ac.abort()
      const settled = await writing.then(
        () => 'completed',
        (err: Error) => err.name,
      )
      // A write that finished before the abort has nothing to fence; it still must not change.
      t.true(settled === 'AbortError' || settled === 'completed', `settled as ${settled}`)
      const at = Date.now()
      const first = (await target.ask('hash')).hash
      for (const ms of [100, 250, 500]) {
        await delay(Math.max(0, at + ms - Date.now()))
        t.is((await target.ask('hash')).hash, first, `the target's buffer changed ${ms} ms after the rejection`)
      }
    } finally {
      await engine.close()
      await target.kill()
    }
  })
}
