/** diagnostics_channel tracing of transfers, and the OpenTelemetry hook of examples/otel-tracing.ts. */
import test from 'ava'
import { SpanStatusCode, type Attributes, type Span, type Tracer } from '@opentelemetry/api'
import { Engine, FerryError, TRANSFER_CHANNEL, transferChannel, type TransferTraceContext } from '../index'
import { traceTransfers } from '../examples/otel-tracing'

/** Two engines in this process over tcp, with a 1 MiB buffer on the target. */
async function pair(t: { teardown(fn: () => unknown): void }) {
  const target = await Engine.create({ transports: ['tcp'] })
  t.teardown(() => target.close())
  const initiator = await Engine.create({ transports: ['tcp'] })
  t.teardown(() => initiator.close())
  const buffer = target.allocate(1 << 20)
  const local = initiator.allocate(1 << 20)
  const seg = await initiator.openSegment(target.segmentName)
  return { initiator, local, seg, buffer: buffer.id }
}

type Seen = [string, TransferTraceContext]

/** Subscribes to every event of the channel, recording them in order, until teardown. */
function record(t: { teardown(fn: () => unknown): void }): Seen[] {
  const seen: Seen[] = []
  const handlers = {
    start: (c: TransferTraceContext) => seen.push(['start', c]),
    end: (c: TransferTraceContext) => seen.push(['end', c]),
    asyncStart: (c: TransferTraceContext) => seen.push(['asyncStart', c]),
    asyncEnd: (c: TransferTraceContext) => seen.push(['asyncEnd', c]),
    error: (c: TransferTraceContext) => seen.push(['error', c]),
  }
  transferChannel.subscribe(handlers)
  t.teardown(() => transferChannel.unsubscribe(handlers))
  return seen
}

test.serial('a transfer call publishes start, end, asyncStart and asyncEnd with one context; a rejected one error first', async (t) => {
  t.timeout(60_000)
  t.is(TRANSFER_CHANNEL, 'ferry:transfer')
  const { initiator, local, seg, buffer } = await pair(t)
  const seen = record(t)
  const result = await initiator.write({ local, remote: seg, remoteBuffer: buffer, length: 8192 })
  t.deepEqual(
    seen.map(([e]) => e),
    ['start', 'end', 'asyncStart', 'asyncEnd'],
  )
  const ctx = seen[0][1]
  t.true(seen.every(([, c]) => c === ctx), 'one context object for every event of the call')
  t.like(ctx, { operation: 'write', engine: initiator.segmentName, requests: 1, bytes: 8192, segment: seg.name })
  t.is(ctx.result, result)
  t.is(ctx.error, undefined)

  seen.length = 0
  await initiator.transfer([
    { opcode: 'read', local, remote: seg, remoteBuffer: buffer, length: 4096 },
    { opcode: 'write', local, remote: seg, remoteBuffer: buffer, remoteOffset: 4096, length: 100 },
  ])
  t.like(seen[0][1], { operation: 'transfer', requests: 2, bytes: 4196, segment: seg.name })

  seen.length = 0
  const err = await t.throwsAsync(initiator.read({ local, remote: seg, remoteBuffer: buffer, remoteOffset: 1 << 20, length: 4096 }), { instanceOf: FerryError })
  t.deepEqual(
    seen.map(([e]) => e),
    ['start', 'end', 'error', 'asyncStart', 'asyncEnd'],
  )
  t.is(seen[2][1].error, err)
  t.is(seen[2][1].result, undefined)

  seen.length = 0
  const blocks = await initiator.readBlocks({ local, remote: seg, remoteBuffer: buffer, localOffsets: new Float64Array([0, 4096]), remoteOffsets: new Float64Array([0, 8192]), lengths: 4096 })
  t.like(seen[0][1], { operation: 'readBlocks', requests: 2, bytes: 8192, segment: seg.name })
  t.is(seen.at(-1)![1].result, blocks)
})

test.serial('bad input still traces: the context is made from what the call got, and the call rejects as before', async (t) => {
  const engine = await Engine.create({ transports: ['tcp'] })
  t.teardown(() => engine.close())
  const seen = record(t)
  await t.throwsAsync(engine.read(null as never), { instanceOf: FerryError, code: 'ERR_FERRY_INVALID_ARGUMENT' })
  await t.throwsAsync(engine.transfer('x' as never), { instanceOf: FerryError })
  await t.throwsAsync(engine.writeBlocks({ lengths: [1n, 'x'] } as never), { instanceOf: FerryError })
  const starts = seen.filter(([e]) => e === 'start').map(([, c]) => c)
  t.like(starts[0], { operation: 'read', requests: 1, bytes: 0, segment: undefined })
  t.like(starts[1], { operation: 'transfer', requests: 0, bytes: 0 })
  t.like(starts[2], { operation: 'writeBlocks', requests: 0, bytes: 1 })
  t.is(seen.filter(([e]) => e === 'error').length, 3)
})

/** A tracer that keeps what the hook did to its spans. */
function fakeTracer() {
  const spans: { name: string; attributes: Attributes; status?: { code: SpanStatusCode; message?: string }; exceptions: unknown[]; ended: boolean }[] = []
  const tracer = {
    startSpan(name: string, options?: { attributes?: Attributes }) {
      const s = { name, attributes: { ...options?.attributes }, status: undefined as { code: SpanStatusCode; message?: string } | undefined, exceptions: [] as unknown[], ended: false }
      spans.push(s)
      const span = {
        setAttribute: (k: string, v: unknown) => ((s.attributes[k] = v as Attributes[string]), span),
        setStatus: (st: { code: SpanStatusCode; message?: string }) => ((s.status = st), span),
        recordException: (e: unknown) => void s.exceptions.push(e),
        end: () => void (s.ended = true),
      }
      return span as unknown as Span
    },
  } as unknown as Tracer
  return { tracer, spans }
}

test.serial('the OpenTelemetry example makes one span per call, ended when it settles, an error span for a rejection', async (t) => {
  t.timeout(60_000)
  const { initiator, local, seg, buffer } = await pair(t)
  const { tracer, spans } = fakeTracer()
  const stop = traceTransfers(tracer)
  t.teardown(stop)
  await initiator.write({ local, remote: seg, remoteBuffer: buffer, length: 4096 })
  await t.throwsAsync(initiator.read({ local, remote: seg, remoteBuffer: buffer, remoteOffset: 1 << 20, length: 4096 }))
  stop()
  await initiator.write({ local, remote: seg, remoteBuffer: buffer, length: 4096 })
  t.is(spans.length, 2, 'no span once stopped')
  const [ok, failed] = spans
  t.is(ok.name, 'ferry.write')
  t.like(ok.attributes, { 'ferry.operation': 'write', 'ferry.bytes': 4096, 'ferry.bytes_moved': 4096, 'ferry.transports': 'tcp', 'ferry.segment': seg.name })
  t.true(ok.ended)
  t.is(ok.status, undefined)
  t.is(failed.name, 'ferry.read')
  t.true(failed.ended)
  t.is(failed.status?.code, SpanStatusCode.ERROR)
  t.is(failed.exceptions.length, 1)
  t.true(failed.exceptions[0] instanceof FerryError)
})
