// A TypeScript user, compiled with strict and skipLibCheck: false (copied to .cts and .mts
// for node16/nodenext). Every @ts-expect-error must be an error, so a type that turned
// into `any` or a union that took any string fails the compile.
import { Engine, FerryError, TransferStatus } from 'ferry-engine'
import type { BenchRow, BenchResult, EngineMetrics, EngineOptions, FerryErrorCode, TaskStatus, TransportName } from 'ferry-engine'

const code: FerryErrorCode = 'ERR_FERRY_TIMEOUT'
// @ts-expect-error a misspelled code is not a FerryErrorCode
const typo: FerryErrorCode = 'ERR_FERRY_TIMEOUTT'
// @ts-expect-error BenchRow is an object type, not any
const row: BenchRow = 'not a row'
// @ts-expect-error BenchResult is an object type, not any
const result: BenchResult = 42
const options: EngineOptions = { transports: ['tcp'], peerTimeoutMs: 1000 }
// @ts-expect-error transports are named
const wrong: EngineOptions = { transports: ['udp'] }

export async function main(): Promise<string> {
  const engine = await Engine.create(options)
  try {
    const region = engine.allocate(4096)
    const metrics: EngineMetrics = engine.metrics()
    const transport: TransportName | undefined = metrics.bytes[0]?.transport
    const status: TaskStatus['status'] = TransferStatus.COMPLETED
    const err = new FerryError(code, 'typed')
    return `${region.length} ${metrics.transfers.completed} ${transport} ${status} ${err.code} ${typo} ${row} ${result} ${wrong}`
  } finally {
    await engine.close()
  }
}
