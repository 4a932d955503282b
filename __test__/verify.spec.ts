// `verify`: the request option and the engine default, as the API takes them. The
// corruption cases (a relay that flips a byte) are the core's: crates/core/tests/integrity.rs.
import test from 'ava'
import { parseConfig } from '../bench/tebench/config'
import { tuningOptions } from '../bench/tebench/engine-setup'
import { Engine, FerryError, TransferStatus } from '../index'
import { killAll, startTarget } from './helpers'

test.after.always(killAll)

const MiB = 1 << 20

test('a verified write, read, transfer and block list complete over tcp, and land the bytes', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(4 * MiB) })
  const engine = await Engine.create({ transports: ['tcp'] })
  try {
    const local = engine.allocate(4 * MiB)
    for (let i = 0; i < local.buffer.length; i++) local.buffer[i] = i % 251
    const seg = await engine.openSegment(target.segment)
    const req = { local, remote: seg, remoteBuffer: target.buffer, length: MiB, verify: true }
    const w = await engine.write(req)
    t.is(w.tasks[0].status, TransferStatus.COMPLETED)
    const back = { ...req, localOffset: 2 * MiB }
    await engine.read(back)
    t.true(local.buffer.subarray(2 * MiB, 3 * MiB).equals(local.buffer.subarray(0, MiB)))
    const x = await engine.transfer([{ ...req, opcode: 'write', remoteOffset: MiB }])
    t.is(x.bytes, MiB)
    const offsets = Float64Array.from([0, 4096])
    await engine.writeBlocks({ local, remote: seg, remoteBuffer: target.buffer, localOffsets: offsets, remoteOffsets: offsets, lengths: 4096, verify: true })
    t.is(engine.metrics().integrityFailures.tcp, 0)
  } finally {
    await engine.close()
  }
})

test('verify must be a boolean, on a request, a block list and the engine', async (t) => {
  const engine = await Engine.create({ verify: true })
  try {
    const local = engine.allocate(4096)
    const seg = await engine.openSegment(engine.segmentName)
    const bad = { local, remote: seg, length: 16, verify: 'yes' as unknown as boolean }
    const e = await t.throwsAsync(engine.write(bad), { instanceOf: FerryError })
    t.is(e?.code, 'ERR_FERRY_INVALID_ARGUMENT')
    t.regex(e?.message ?? '', /verify must be a boolean/)
    const offsets = Float64Array.from([0])
    const b = await t.throwsAsync(
      engine.writeBlocks({ local, remote: seg, localOffsets: offsets, remoteOffsets: offsets, lengths: 16, verify: 1 as unknown as boolean }),
      { instanceOf: FerryError },
    )
    t.is(b?.code, 'ERR_FERRY_INVALID_ARGUMENT')
  } finally {
    await engine.close()
  }
  await t.throwsAsync(Engine.create({ verify: 'on' as unknown as boolean }))
})

test("tebench --verify turns on the engine's verify (and the run header's flags line shows it)", (t) => {
  const on = parseConfig(['--local', '--verify'])
  t.true(on.verify)
  t.is(tuningOptions(on).verify, true)
  const off = parseConfig(['--local'])
  t.false(off.verify)
  t.is(tuningOptions(off).verify, undefined)
})
