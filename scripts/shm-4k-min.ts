// The per-op time of tebench's shm 4 KiB case (batch 1) as a machine shared with other
// work lets it show: many short runs of the native workers between two engines of this
// process, reporting the minimum and the median of the runs' Avg Lat (µs an op, one
// thread's wall time per operation). A run that was preempted is slower, never faster, so
// the minimum is the figure least moved by the load; tebench's own figure is the
// median-like one of a long run.
//
//   NAPI_RS_NATIVE_LIBRARY_PATH=X.node node --import=tsx scripts/shm-4k-min.ts [runs] [ms] [threads] [op]
import { Engine } from '../index'

const [runs = 30, ms = 100, threads = 1] = process.argv.slice(2, 5).map(Number)
const op = (process.argv[5] ?? 'write') as 'write' | 'read'
const stripe = 1 << 20
async function main(): Promise<void> {
  const target = await Engine.create({})
  const initiator = await Engine.create({})
  try {
    const remoteRegion = target.allocate(stripe * 4)
    const local = initiator.allocate(stripe * 4)
    const remote = await initiator.openSegment(target.segmentName)
    const bench = initiator.bench(threads)
    const lats: number[] = []
    for (let i = 0; i < runs; i++) {
      const r = await bench.runCase({
        opcode: op,
        blockSize: 4096,
        batchSize: 1,
        local,
        remote,
        remoteBuffer: remoteRegion.id,
        stripeBase: 0,
        stripeLen: stripe,
        transport: 'shm',
        durationMs: ms,
        warmupMs: i === 0 ? 500 : 20,
        requestIntervalUs: 0,
      })
      if (!('row' in r) || !r.row) throw new Error(`run failed: ${JSON.stringify(r)}`)
      lats.push(r.row.avgLatUs)
    }
    bench.stop()
    lats.sort((a, b) => a - b)
    console.log(`${op} threads=${threads}: min ${lats[0].toFixed(3)} µs, median ${lats[lats.length >> 1].toFixed(3)} µs over ${runs} runs of ${ms} ms`)
  } finally {
    initiator.close()
    target.close()
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
