/**
 * Property-based test of the whole JS surface (fast-check): arbitrary values for every
 * argument and field of every method. Never a crash; always a FerryError with a documented
 * code, or success for valid input; Promise methods reject rather than throw; and no byte
 * of the target moves unless a call succeeded.
 */
import { createHash } from 'node:crypto'
import test from 'ava'
import fc from 'fast-check'
import { Engine, FerryError, type Region, type Segment } from '../index'

/** The codes the README documents (FerryErrorCode). */
const DOCUMENTED = new Set([
  'ERR_FERRY_INVALID_ARGUMENT',
  'ERR_FERRY_OUT_OF_RANGE',
  'ERR_FERRY_CLOSED',
  'ERR_FERRY_INVALID_BATCH',
  'ERR_FERRY_INVALID_TASK',
  'ERR_FERRY_BATCH_FULL',
  'ERR_FERRY_UNKNOWN_REGION',
  'ERR_FERRY_UNKNOWN_SEGMENT',
  'ERR_FERRY_FOREIGN_HANDLE',
  'ERR_FERRY_UNKNOWN_BUFFER',
  'ERR_FERRY_PERMISSION_DENIED',
  'ERR_FERRY_CONNECT',
  'ERR_FERRY_TRANSPORT_UNAVAILABLE',
  'ERR_FERRY_METADATA',
  'ERR_FERRY_PEER_LOST',
  'ERR_FERRY_PROTOCOL',
  'ERR_FERRY_REMOTE_REJECTED',
  'ERR_FERRY_IO',
  'ERR_FERRY_CANCELED',
  'ERR_FERRY_TIMEOUT',
  'ERR_FERRY_TRANSFER_FAILED',
  'ABORT_ERR',
])

/** Runs counted over the whole file, for the closing figures. */
let runs = 0

const SIZE = 1 << 16

/** Values of every JS kind, with the numbers that break naive conversions. */
const anyValue = fc.oneof(
  fc.anything({ withBigInt: true, withNullPrototype: true, withTypedArray: true, withSparseArray: true }),
  fc.constantFrom(-1, 0, 0.5, 1.5, 2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 52 + 0.5, 2 ** 53, Number.NaN, Infinity, -Infinity, -0),
  fc.double(),
  fc.integer(),
  fc.bigInt(),
  fc.string(),
)

function expectOutcome(t: import('ava').ExecutionContext, what: string, run: () => unknown): { ok: boolean; value?: unknown } {
  try {
    return { ok: true, value: run() }
  } catch (err) {
    if (!(err instanceof FerryError) || !DOCUMENTED.has(err.code)) {
      t.fail(`${what}: not a documented FerryError: ${String((err as Error)?.stack ?? err)}`)
    }
    return { ok: false }
  }
}

async function expectSettled(t: import('ava').ExecutionContext, what: string, run: () => Promise<unknown>): Promise<boolean> {
  let p: Promise<unknown>
  try {
    p = run()
  } catch (err) {
    t.fail(`${what} threw synchronously: ${String(err)}`)
    return false
  }
  if (!(p instanceof Promise)) t.fail(`${what} returned no Promise`)
  try {
    await p
    return true
  } catch (err) {
    if (!(err instanceof FerryError) || !DOCUMENTED.has(err.code)) {
      t.fail(`${what}: rejected with an undocumented error: ${String((err as Error)?.stack ?? err)}`)
    }
    return false
  }
}

interface World {
  target: Engine
  remote: Region
  engine: Engine
  other: Engine
  local: Region
  foreignRegion: Region
  seg: Segment
  foreignSeg: Segment
  hash(): string
}

async function world(): Promise<World> {
  const target = await Engine.create()
  const remote = target.allocate(SIZE).fill(0x5c)
  const engine = await Engine.create()
  const other = await Engine.create()
  const local = engine.allocate(SIZE).fill(0x11)
  const foreignRegion = other.allocate(SIZE).fill(0x22)
  const seg = await engine.openSegment(target.segmentName)
  const foreignSeg = await other.openSegment(target.segmentName)
  const hash = () => createHash('sha256').update(remote.view(0, SIZE)).digest('hex')
  return { target, remote, engine, other, local, foreignRegion, seg, foreignSeg, hash }
}

async function teardown(w: World) {
  await w.engine.close()
  await w.other.close()
  await w.target.close()
}

function requestArb(w: World) {
  const small = fc.integer({ min: 0, max: SIZE })
  // Mostly valid fields, so that a good share of the requests is valid and moves bytes.
  const mostly = <T,>(valid: fc.Arbitrary<T>) => fc.oneof({ arbitrary: valid, weight: 8 }, { arbitrary: anyValue, weight: 1 })
  // Mostly left out (an explicit undefined is the same as no key).
  const rarely = <T,>(a: fc.Arbitrary<T>) => fc.oneof({ arbitrary: fc.constant(undefined), weight: 5 }, { arbitrary: a, weight: 1 })
  return fc.record(
    {
      opcode: mostly(fc.constantFrom('read', 'write')),
      local: mostly(fc.constantFrom(w.local, w.local, w.local, w.foreignRegion)),
      remote: mostly(fc.constantFrom(w.seg, w.seg, w.seg, w.foreignSeg)),
      remoteBuffer: mostly(fc.constant(w.remote.id)),
      remoteOffset: mostly(small),
      localOffset: mostly(small),
      length: mostly(fc.integer({ min: 1, max: 4 * 4096 })),
      transport: rarely(fc.oneof(fc.constantFrom('tcp', 'shm', 'rdma'), anyValue)),
      requireTransport: rarely(fc.oneof(fc.constantFrom('tcp', 'shm', 'rdma'), anyValue)),
      typo: rarely(anyValue),
    },
    { requiredKeys: ['opcode', 'local', 'remote', 'remoteBuffer', 'length'] },
  )
}

test.serial('the Promise and batch calls with arbitrary requests', async (t) => {
  t.timeout(600_000)
  const w = await world()
  let before = w.hash()
  let moved = 0
  try {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof({ arbitrary: requestArb(w), weight: 9 }, { arbitrary: anyValue, weight: 1 }), { maxLength: 3 }), anyValue, fc.constantFrom('write', 'read', 'transfer', 'batch'), async (reqs, batchArg, how) => {
        runs++
        let ok: boolean
        if (how === 'batch') {
          const batch = w.engine.allocateBatch(4)
          ok = expectOutcome(t, 'submitTransfer', () => w.engine.submitTransfer(batch, reqs as never)).ok
          expectOutcome(t, 'getTransferStatus', () => w.engine.getTransferStatus(batch, batchArg as never))
          expectOutcome(t, 'getBatchStatus', () => w.engine.getBatchStatus(batchArg as never))
          expectOutcome(t, 'freeBatch', () => w.engine.freeBatch(batchArg as never))
          for (let i = 0; i < 2000 && w.engine.getBatchStatus(batch).status === 1; i++) await new Promise((r) => setImmediate(r))
          expectOutcome(t, 'freeBatch', () => w.engine.freeBatch(batch))
        } else if (how === 'transfer') {
          ok = await expectSettled(t, 'transfer', () => w.engine.transfer(reqs as never, { signal: batchArg } as never))
        } else {
          ok = await expectSettled(t, how, () => w.engine[how as 'read' | 'write'](reqs[0] as never))
        }
        const after = w.hash()
        if (ok) moved++
        else t.is(after, before, 'a refused call moved bytes into the target')
        before = after
      }),
      { numRuns: 1000, seed: 0x5eed },
    )
  } finally {
    await teardown(w)
  }
  t.log(`${moved} of 1000 calls succeeded`)
  t.true(moved > 30, 'valid requests are generated too')
})

test.serial('every other method with arbitrary arguments', async (t) => {
  t.timeout(600_000)
  const w = await world()
  const before = w.hash()
  try {
    await fc.assert(
      fc.asyncProperty(anyValue, anyValue, anyValue, async (a, b, c) => {
        runs++
        const e = w.engine
        const made: Region[] = []
        const keep = (r: { ok: boolean; value?: unknown }) => {
          if (r.ok) made.push(r.value as Region)
        }
        keep(expectOutcome(t, 'allocate', () => e.allocate(typeof a === 'number' && a > 2 ** 34 ? 1 : (a as never))))
        keep(expectOutcome(t, 'registerMemory', () => e.registerMemory(a as never, b as never)))
        expectOutcome(t, 'allocateBatch', () => {
          const id = e.allocateBatch(typeof a === 'number' && a > 4096 ? 1 : (a as never))
          e.freeBatch(id)
        })
        expectOutcome(t, 'closeSegment', () => e.closeSegment(a as never))
        expectOutcome(t, 'getTransferStatusList', () => e.getTransferStatusList(a as never))
        expectOutcome(t, 'view', () => w.local.view(a as never, b as never))
        expectOutcome(t, 'fill', () => w.local.fill(0x11, typeof a === 'number' ? a : 0, b as never))
        expectOutcome(t, 'bench', () => {
          if (typeof a === 'number' && a > 4) return
          e.bench(a as never).stop()
        })
        await expectSettled(t, 'openSegment', () => e.openSegment(typeof a === 'string' ? '' : (a as never)))
        await expectSettled(t, 'transfer options', () => e.transfer([{ opcode: 'read', local: w.local, remote: w.seg, remoteBuffer: w.remote.id, length: 16 }], c as never))
        for (const r of made) r.release()
        w.local.fill(0x11)
      }),
      { numRuns: 300, seed: 0xfe77 },
    )
    t.is(w.hash(), before, 'the target was never written')
    t.true(w.seg instanceof Object)
  } finally {
    await teardown(w)
  }
})

test.serial('Engine.create with arbitrary options', async (t) => {
  t.timeout(600_000)
  const keys = ['listen', 'peerTimeoutMs', 'ioThreads', 'transports', 'rdma', 'machineId', 'advertise', 'connectionsPerPeer', 'sliceSize', 'connectTimeoutMs', 'maxFailoverAttempts', 'enableAutoFailoverOnPoll', 'attemptTimeoutMs', 'faults', 'metadata', 'metadataPrefix', 'segmentName', 'leaseTtlMs', 'peerTimeoutMS']
  const optionArb = fc.oneof(
    anyValue,
    fc.dictionary(fc.constantFrom(...keys), anyValue, { maxKeys: 4 }),
    fc.record({ rdma: fc.dictionary(fc.constantFrom('provider', 'devices', 'qpsPerPeer', 'sliceSize', 'port', 'x'), anyValue) }),
    fc.record({ faults: fc.array(fc.dictionary(fc.constantFrom('transport', 'seed', 'delayMs', 'submitFailureRate', 'bogus'), anyValue)) }),
  )
  await fc.assert(
    fc.asyncProperty(optionArb, async (o) => {
      runs++
      let made: Engine | undefined
      try {
        made = await Engine.create(o as never)
      } catch (err) {
        if (!(err instanceof FerryError) || !DOCUMENTED.has(err.code)) t.fail(`create: ${String((err as Error)?.stack ?? err)}`)
      }
      await made?.close()
    }),
    { numRuns: 300, seed: 0xc7ea7e },
  )
  t.log(`property runs in this file: ${runs}`)
  t.pass()
})
