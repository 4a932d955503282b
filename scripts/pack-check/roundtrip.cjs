// A CommonJS user: require by name, move bytes between two engines over TCP. roundtrip.mjs
// runs the same check on the module that `import` gives.
const assert = require('node:assert/strict')

/** Moves 64 KiB of `fill` from one engine to another through `ferry`'s API. */
async function roundtrip(ferry, fill) {
  const { Engine, FerryError, TransferStatus } = ferry
  const a = await Engine.create({ transports: ['tcp'] })
  const b = await Engine.create({ transports: ['tcp'] })
  try {
    const src = a.allocate(65536).fill(fill)
    const dst = b.allocate(65536)
    const seg = await b.openSegment(a.segmentName)
    const r = await b.read({ local: dst, remote: seg, remoteBuffer: src.id, length: 65536 })
    assert.equal(r.bytes, 65536)
    assert.equal(r.tasks[0].status, TransferStatus.COMPLETED)
    assert.equal(dst.buffer[65535], fill)
    await assert.rejects(b.openSegment(42), (e) => e instanceof FerryError && e.code === 'ERR_FERRY_INVALID_ARGUMENT')
  } finally {
    await b.close()
    await a.close()
  }
}
module.exports = { roundtrip }

if (require.main === module) {
  roundtrip(require('ferry-engine'), 7).then(
    () => console.log('pack-check: require(ferry-engine) moved 64 KiB'),
    (err) => {
      console.error(err)
      process.exitCode = 1
    },
  )
}
