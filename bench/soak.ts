/**
 * Initiator of one `soak` case (bench/suites/soak.ts), run in a process of its own so that
 * its resident memory says what this case alone keeps.
 *
 * Opens the target segment FERRY_SOAK_SEGMENT and runs FERRY_SOAK_WARMUP and then
 * FERRY_SOAK_TRANSFERS 4 KiB WRITEs into buffer FERRY_SOAK_BUFFER, each required to go over
 * FERRY_SOAK_TRANSPORT (shm or tcp), through FERRY_SOAK_METHOD:
 *   promise  FERRY_SOAK_WINDOW lanes, each awaiting one engine.write after another
 *   batch    FERRY_SOAK_BATCHES batches of FERRY_SOAK_BATCH_TASKS tasks outstanding
 *            (allocateBatch, submitTransfer, getBatchStatus polled with backoff, freeBatch)
 * Prints JSON lines on stdout: `{phase: "warm", ...}` after the warm-up, `{phase: "sample",
 * ...}` every FERRY_SOAK_SAMPLE_EVERY transfers, `{phase: "done", ...}` at the end, each
 * with the transfers done and this process's memory (rss, heapUsed, external, in bytes);
 * then closes its engine and exits. `{phase: "error", message}` if a transfer fails.
 */
import { Engine, TransferStatus, type Region, type Segment, type TransferRequest } from '../index'
import { blockFor, nowNs } from './lib/stats'

const BLOCK = 4096
const SLOTS = 1024 // 4 MiB of each side, cycled

const env = (name: string, fallback?: string): string => {
  const v = process.env[name] ?? fallback
  if (v === undefined) throw new Error(`${name} is not set`)
  return v
}
const count = (name: string, fallback: number): number => {
  const n = Number(env(name, String(fallback)))
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name}: expected a positive integer`)
  return n
}

const emit = (v: object) => process.stdout.write(JSON.stringify(v) + '\n')
const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve))

function memory() {
  const m = process.memoryUsage()
  return { rss: m.rss, heapUsed: m.heapUsed, external: m.external }
}

interface Run {
  engine: Engine
  local: Region
  remote: Segment
  buffer: number
  transport: 'shm' | 'tcp'
}

/** Calls `at(done)` whenever `done` crosses a mark; marks are increasing transfer counts. */
function marks(list: number[], at: (done: number) => void) {
  let i = 0
  return (done: number) => {
    while (i < list.length && done >= list[i]) at(list[i++])
  }
}

async function promiseRun(run: Run, total: number, window: number, onProgress: (done: number) => void) {
  let next = 0
  let done = 0
  const lane = async () => {
    while (next < total) {
      const slot = next++ % SLOTS
      await run.engine.write({
        local: run.local,
        localOffset: slot * BLOCK,
        remote: run.remote,
        remoteBuffer: run.buffer,
        remoteOffset: slot * BLOCK,
        length: BLOCK,
        requireTransport: run.transport,
      })
      done++
      onProgress(done)
    }
  }
  await Promise.all(Array.from({ length: window }, lane))
}

async function batchRun(run: Run, total: number, tasks: number, inFlight: number, onProgress: (done: number) => void) {
  const { engine } = run
  const requests: TransferRequest[] = Array.from({ length: SLOTS }, (_, slot) => ({
    opcode: 'write',
    local: run.local,
    localOffset: slot * BLOCK,
    remote: run.remote,
    remoteBuffer: run.buffer,
    remoteOffset: slot * BLOCK,
    length: BLOCK,
    requireTransport: run.transport,
  }))
  const inflight: number[] = []
  let submitted = 0
  let done = 0
  let backoffUs = 10
  let lastYield = nowNs()
  while (done < total) {
    while (inflight.length < inFlight && submitted < total) {
      const n = Math.min(tasks, total - submitted)
      const batch = engine.allocateBatch(n)
      const list: TransferRequest[] = []
      for (let j = 0; j < n; j++) list.push(requests[(submitted + j) % SLOTS])
      engine.submitTransfer(batch, list)
      submitted += n
      inflight.push(batch)
    }
    let finished = 0
    for (let i = 0; i < inflight.length; ) {
      const batch = inflight[i]
      const st = engine.getBatchStatus(batch)
      if (st.status === TransferStatus.WAITING || st.status === TransferStatus.PENDING) {
        i++
        continue
      }
      if (st.status !== TransferStatus.COMPLETED) {
        const bad = engine.getTransferStatusList(batch).find((t) => t.status !== TransferStatus.COMPLETED)
        throw new Error(`batch ended ${st.name}: ${bad?.code ?? ''} ${bad?.message ?? ''}`)
      }
      done += st.tasks
      engine.freeBatch(batch)
      inflight.splice(i, 1)
      finished++
    }
    if (finished > 0) {
      backoffUs = 10
      onProgress(done)
    } else {
      blockFor(backoffUs)
      backoffUs = Math.min(backoffUs * 2, 1000)
    }
    if (nowNs() - lastYield > 5e6) {
      await yieldToLoop()
      lastYield = nowNs()
    }
  }
}

async function main(): Promise<void> {
  const transport = env('FERRY_SOAK_TRANSPORT') as 'shm' | 'tcp'
  const method = env('FERRY_SOAK_METHOD')
  const warmup = count('FERRY_SOAK_WARMUP', 200_000)
  const transfers = count('FERRY_SOAK_TRANSFERS', 2_000_000)
  const every = count('FERRY_SOAK_SAMPLE_EVERY', 250_000)
  const engine = await Engine.create()
  try {
    const local = engine.allocate(SLOTS * BLOCK)
    local.buffer.fill(0x5a)
    const remote = await engine.openSegment(env('FERRY_SOAK_SEGMENT'))
    const run: Run = { engine, local, remote, buffer: Number(env('FERRY_SOAK_BUFFER')), transport }
    const total = warmup + transfers
    const t0 = nowNs()
    let tWarm = t0
    const progress = marks(
      [warmup, ...Array.from({ length: Math.ceil(transfers / every) - 1 }, (_, i) => warmup + (i + 1) * every), total],
      (done) => {
        const now = nowNs()
        if (done === warmup) {
          tWarm = now
          emit({ phase: 'warm', done, ms: Math.round((now - t0) / 1e6), ...memory() })
        } else {
          emit({ phase: done === total ? 'done' : 'sample', done, ms: Math.round((now - tWarm) / 1e6), ...memory() })
        }
      },
    )
    if (method === 'promise') {
      await promiseRun(run, total, count('FERRY_SOAK_WINDOW', 32), progress)
    } else if (method === 'batch') {
      await batchRun(run, total, count('FERRY_SOAK_BATCH_TASKS', 16), count('FERRY_SOAK_BATCHES', 4), progress)
    } else {
      throw new Error(`FERRY_SOAK_METHOD: expected promise or batch, got ${method}`)
    }
  } finally {
    await engine.close()
  }
}

main().then(
  () => {
    process.exitCode = 0
  },
  (err: unknown) => {
    emit({ phase: 'error', message: (err as Error)?.message ?? String(err) })
    process.exitCode = 1
  },
)
