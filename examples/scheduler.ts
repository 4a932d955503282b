/**
 * A small block scheduler on Ferry's events.
 *
 *   npm run example:scheduler
 *
 * Starts two worker processes (examples/target.ts), places 8 blocks of 256 KiB on them, moves
 * one block from one worker to the other, then SIGKILLs one worker itself. On `peerLost` it
 * re-places that worker's blocks onto the survivor from its own copies, reads every block
 * back and compares the bytes, prints a summary (the last line, JSON, starts with
 * `summary `) and exits 0. Any mismatch or timeout exits 1. Workers are killed by pid on
 * the way out, whatever happens.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { randomFillSync } from 'node:crypto'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { Engine, type PeerLostEvent, type Segment } from '../index'

const KiB = 1024
const BLOCK = 256 * KiB
const BLOCKS = 8
/** Slots per worker: room for every block, so a survivor can take them all. */
const SLOTS = BLOCKS

interface Worker {
  name: string
  proc: ChildProcess
  segment: Segment
  buffer: number
  alive: boolean
  /** slot -> block id */
  slots: Array<number | undefined>
}

const say = (line: string) => process.stdout.write(line + '\n')

async function startWorker(engine: Engine, name: string, procs: ChildProcess[]): Promise<Worker> {
  const proc = spawn(process.execPath, [...process.execArgv, path.join(__dirname, 'target.ts'), String(SLOTS * BLOCK)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  })
  procs.push(proc)
  const hello = await new Promise<{ segment: string; buffer: number }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start in 30 s`)), 30_000)
    readline.createInterface({ input: proc.stdout! }).once('line', (l) => {
      clearTimeout(timer)
      resolve(JSON.parse(l))
    })
    proc.once('exit', (code) => reject(new Error(`${name} exited with ${code}`)))
  })
  const segment = await engine.openSegment(hello.segment)
  return { name, proc, segment, buffer: hello.buffer, alive: true, slots: new Array(SLOTS).fill(undefined) }
}

async function main(): Promise<number> {
  const procs: ChildProcess[] = []
  const engine = await Engine.create({ peerTimeoutMs: 1000 })
  const lost: PeerLostEvent[] = []
  const waiters: Array<() => void> = []
  engine.on('peerLost', (e) => {
    lost.push(e)
    for (const w of waiters.splice(0)) w()
  })
  engine.on('failover', (e) => say(`failover towards ${e.segment}: ${e.from} -> ${e.to} (${e.reason})`))
  try {
    const workers = [await startWorker(engine, 'worker-0', procs), await startWorker(engine, 'worker-1', procs)]
    say(`workers: ${workers.map((w) => `${w.name} pid ${w.proc.pid} at ${w.segment.name}`).join(', ')}`)

    // The scheduler's own copies of every block, and a staging area for moves and checks.
    const copies = engine.allocate(BLOCKS * BLOCK)
    randomFillSync(copies.buffer)
    const staging = engine.allocate(BLOCK)
    const where = new Map<number, { worker: Worker; slot: number }>()

    const place = async (block: number, worker: Worker) => {
      const slot = worker.slots.indexOf(undefined)
      if (slot < 0) throw new Error(`${worker.name} is full`)
      await engine.write({ local: copies, localOffset: block * BLOCK, remote: worker.segment, remoteBuffer: worker.buffer, remoteOffset: slot * BLOCK, length: BLOCK })
      worker.slots[slot] = block
      where.set(block, { worker, slot })
    }
    const verify = async (block: number) => {
      const at = where.get(block)!
      await engine.read({ local: staging, remote: at.worker.segment, remoteBuffer: at.worker.buffer, remoteOffset: at.slot * BLOCK, length: BLOCK })
      if (!staging.buffer.equals(copies.buffer.subarray(block * BLOCK, (block + 1) * BLOCK))) {
        throw new Error(`block ${block} on ${at.worker.name} slot ${at.slot} differs from the scheduler's copy`)
      }
    }

    // 1. Place: round robin.
    for (let b = 0; b < BLOCKS; b++) await place(b, workers[b % 2])
    say(`placed ${BLOCKS} blocks of ${BLOCK / KiB} KiB: ${workers.map((w) => `${w.name} [${w.slots.filter((x) => x !== undefined).join(',')}]`).join(', ')}`)

    // 2. Move block 1 from worker-1 to worker-0: read it from its worker, write it to the other.
    const from = where.get(1)!
    await engine.read({ local: staging, remote: from.worker.segment, remoteBuffer: from.worker.buffer, remoteOffset: from.slot * BLOCK, length: BLOCK })
    const slot = workers[0].slots.indexOf(undefined)
    await engine.write({ local: staging, remote: workers[0].segment, remoteBuffer: workers[0].buffer, remoteOffset: slot * BLOCK, length: BLOCK })
    workers[0].slots[slot] = 1
    from.worker.slots[from.slot] = undefined
    where.set(1, { worker: workers[0], slot })
    await verify(1)
    say(`moved block 1 from ${from.worker.name} to ${workers[0].name} (verified)`)
    let moved = 1

    // 3. Lose worker-1 (SIGKILL, by pid) and wait for the engine to say so.
    const victim = workers[1]
    const killedAt = Date.now()
    process.kill(victim.proc.pid!, 'SIGKILL')
    say(`killed ${victim.name} (pid ${victim.proc.pid})`)
    const heard = new Promise<void>((resolve) => waiters.push(resolve))
    const deadline = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), 10_000).unref())
    while (!lost.some((e) => e.segment === victim.segment.name)) {
      if ((await Promise.race([heard, deadline])) === 'timeout') throw new Error(`no peerLost for ${victim.name} within 10 s`)
    }
    const lostAfter = Date.now() - killedAt
    victim.alive = false
    say(`peerLost ${victim.segment.name} after ${lostAfter} ms: ${lost.find((e) => e.segment === victim.segment.name)!.reason}`)

    // 4. Re-place the lost worker's blocks on the survivor from the scheduler's copies.
    const orphans = victim.slots.filter((b): b is number => b !== undefined)
    victim.slots.fill(undefined)
    const survivor = workers.find((w) => w.alive)!
    for (const b of orphans) {
      await place(b, survivor)
      moved++
    }
    say(`re-placed blocks [${orphans.join(',')}] on ${survivor.name}`)

    // 5. Every block is where the scheduler thinks, with the right bytes.
    for (let b = 0; b < BLOCKS; b++) await verify(b)
    const m = engine.metrics()
    const summary = {
      blocks: BLOCKS,
      verified: BLOCKS,
      moved,
      replaced: orphans.length,
      lost: victim.name,
      lost_after_ms: lostAfter,
      survivor: survivor.name,
      placement: Object.fromEntries(workers.map((w) => [w.name, w.slots.filter((x) => x !== undefined)])),
      transfers: m.transfers,
    }
    say(`summary ${JSON.stringify(summary)}`)
    return 0
  } finally {
    await engine.close()
    for (const p of procs) {
      if (p.exitCode === null && p.signalCode === null && p.pid) {
        try {
          process.kill(p.pid, 'SIGKILL')
        } catch {
          // gone already
        }
      }
    }
  }
}

main().then(
  (code) => {
    process.exitCode = code
  },
  (err: unknown) => {
    process.stderr.write(`scheduler: ${(err as Error)?.stack ?? String(err)}\n`)
    process.exitCode = 1
  },
)
