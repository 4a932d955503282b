/**
 * OpenTelemetry spans for Ferry's transfers, from its `diagnostics_channel` tracing channel
 * (`ferry:transfer`): one span per `read`, `write`, `transfer`, `readBlocks` or
 * `writeBlocks` call, started when the call begins and ended when its Promise settles,
 * marked as an error with the exception when it rejects. Ferry itself does not depend on
 * OpenTelemetry; only this hook uses `@opentelemetry/api`.
 *
 *   npm run example:otel        # two engines in this process, a few transfers, spans printed
 *
 * In an application: register an OpenTelemetry SDK (e.g. `@opentelemetry/sdk-trace-node`
 * with an exporter), then call `traceTransfers(trace.getTracer('ferry'))` once.
 */
import { context, SpanKind, SpanStatusCode, trace, type Attributes, type Span, type Tracer } from '@opentelemetry/api'
import { Engine, transferChannel, type TransferTraceContext } from '../index'

/**
 * Starts a span for every traced transfer call on `tracer`; returns the function that stops
 * tracing.
 */
export function traceTransfers(tracer: Tracer): () => void {
  // One span per call: the channel hands the same context object to each of its events.
  const spans = new WeakMap<TransferTraceContext, Span>()
  const handlers = {
    start(ctx: TransferTraceContext) {
      const attributes: Attributes = {
        'ferry.operation': ctx.operation,
        'ferry.engine': ctx.engine,
        'ferry.requests': ctx.requests,
        'ferry.bytes': ctx.bytes,
      }
      if (ctx.segment !== undefined) attributes['ferry.segment'] = ctx.segment
      spans.set(ctx, tracer.startSpan(`ferry.${ctx.operation}`, { kind: SpanKind.CLIENT, attributes }, context.active()))
    },
    end() {},
    asyncStart() {},
    asyncEnd(ctx: TransferTraceContext) {
      const span = spans.get(ctx)
      if (span === undefined) return
      spans.delete(ctx)
      const result = ctx.result
      if (result !== undefined && 'tasks' in result) {
        const transports = [...new Set(result.tasks.map((task) => task.transport).filter((x) => x !== undefined && x !== null))]
        span.setAttribute('ferry.bytes_moved', result.bytes)
        span.setAttribute('ferry.transports', transports.join(','))
      }
      span.end()
    },
    error(ctx: TransferTraceContext) {
      const span = spans.get(ctx)
      const error = ctx.error
      if (span === undefined) return
      if (error instanceof Error) span.recordException(error)
      const code = (error as { code?: unknown } | undefined)?.code
      span.setStatus({ code: SpanStatusCode.ERROR, message: typeof code === 'string' ? code : String(error) })
    },
  }
  transferChannel.subscribe(handlers)
  return () => {
    transferChannel.unsubscribe(handlers)
  }
}

/** A tracer that prints each span as it ends: what an SDK's console exporter would show. */
function printingTracer(): Tracer {
  return {
    startSpan(name: string, options?: { attributes?: Attributes }) {
      const started = process.hrtime.bigint()
      const attributes: Attributes = { ...options?.attributes }
      let status = 'ok'
      const span = {
        setAttribute(key: string, value: unknown) {
          attributes[key] = value as Attributes[string]
          return span
        },
        setStatus(s: { code: SpanStatusCode; message?: string }) {
          if (s.code === SpanStatusCode.ERROR) status = `error ${s.message ?? ''}`
          return span
        },
        recordException() {},
        end() {
          const us = Number(process.hrtime.bigint() - started) / 1e3
          console.log(`${name} ${us.toFixed(0)} µs ${status} ${JSON.stringify(attributes)}`)
        },
      }
      return span as unknown as Span
    },
  } as unknown as Tracer
}

async function main() {
  // With an SDK registered, trace.getTracer returns its tracer; without one, spans are
  // no-ops, so this run prints them itself.
  const registered = trace.getTracer('ferry-example')
  const stop = traceTransfers(process.env.OTEL_SDK_REGISTERED ? registered : printingTracer())
  const target = await Engine.create({ transports: ['tcp'] })
  const initiator = await Engine.create({ transports: ['tcp'] })
  try {
    const buffer = target.allocate(1 << 20)
    const local = initiator.allocate(1 << 20)
    const seg = await initiator.openSegment(target.segmentName)
    await initiator.write({ local, remote: seg, remoteBuffer: buffer.id, length: 64 << 10 })
    await initiator.transfer([
      { opcode: 'read', local, remote: seg, remoteBuffer: buffer.id, length: 4096 },
      { opcode: 'read', local, localOffset: 4096, remote: seg, remoteBuffer: buffer.id, remoteOffset: 4096, length: 4096 },
    ])
    // Past the end of the buffer: rejected, and its span marked as an error.
    await initiator.read({ local, remote: seg, remoteBuffer: buffer.id, remoteOffset: 1 << 20, length: 4096 }).catch(() => {})
  } finally {
    stop()
    await initiator.close()
    await target.close()
  }
}

if (require.main === module) {
  main().catch((e) => {
    console.error(e)
    process.exitCode = 1
  })
}
