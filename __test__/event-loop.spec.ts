import test from 'ava'
import { once } from 'node:events'
import * as path from 'node:path'
import { Worker } from 'node:worker_threads'
import { Engine, TransferStatus } from '../index'
import { killAll, startTarget } from './helpers'
import { pattern } from './fixtures/pattern'

test.after.always(killAll)

const MiB = 1 << 20

// Small awaited requests over tcp have their replies read by the calling thread's event
// loop (core: transports/tcp/event_loop.rs; binding: uv_loop). These check what that path
// must keep: bytes in place with many in flight, and a thread that ends with requests in
// flight.

test('small awaited WRITEs and READs over tcp, 16 in flight, sizes to 64 KiB: bytes land in place', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(8 * MiB) })
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const src = engine.allocate(8 * MiB)
    const back = engine.allocate(8 * MiB)
    pattern(5).subarray(0, 8 * MiB).copy(src.buffer)
    const seg = await engine.openSegment(target.segment)
    const sizes = [1, 512, 4096, 4097, 65_536, 30_000]
    const ranges: Array<[number, number]> = []
    for (let off = 0, i = 0; off + 65_536 <= 8 * MiB; i++) {
      ranges.push([off, sizes[i % sizes.length]])
      off += sizes[i % sizes.length] + 7
    }
    const io = { remote: seg, remoteBuffer: target.buffer }
    const run = async (op: 'write' | 'read') => {
      let next = 0
      const lane = async () => {
        while (next < ranges.length) {
          const [offset, length] = ranges[next++]
          const req = { ...io, local: op === 'write' ? src : back, localOffset: offset, remoteOffset: offset, length }
          const r = op === 'write' ? await engine.write(req) : await engine.read(req)
          t.is(r.tasks[0].status, TransferStatus.COMPLETED)
          t.is(r.bytes, length)
        }
      }
      await Promise.all(Array.from({ length: 16 }, lane))
    }
    await run('write')
    await run('read')
    let bad = 0
    for (const [offset, length] of ranges) {
      if (!back.buffer.subarray(offset, offset + length).equals(src.buffer.subarray(offset, offset + length))) bad++
    }
    t.is(bad, 0, `${bad} of ${ranges.length} ranges came back different`)
  } finally {
    await engine.close()
  }
})

test('a worker thread that ends with small tcp READs in flight leaves this thread served', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const local = engine.allocate(MiB)
    const seg = await engine.openSegment(target.segment)
    // A TypeScript worker: tsx's CommonJS hook loads it.
    const file = path.join(__dirname, 'fixtures', 'loop-worker.ts')
    const worker = new Worker(`require('tsx/cjs'); require(${JSON.stringify(file)})`, {
      eval: true,
      workerData: { segment: target.segment, buffer: target.buffer },
    })
    const [msg] = (await Promise.race([once(worker, 'message'), once(worker, 'error')])) as unknown[]
    t.is(msg, 'reading')
    // Terminated mid-flight: its environment's cleanup breaks its connections.
    t.is(await worker.terminate(), 1)
    for (let i = 0; i < 200; i++) {
      const r = await engine.read({ local, localOffset: i * 4096, remote: seg, remoteBuffer: target.buffer, remoteOffset: i * 4096, length: 4096 })
      t.is(r.tasks[0].status, TransferStatus.COMPLETED)
    }
  } finally {
    await engine.close()
  }
})
