/**
 * Ferry's quick-start job: starts a target process and moves 1 GiB to it and back over
 * loopback, verifies every byte, and prints the throughput.
 *
 *   npm run example                # 1 GiB, over the best transport (shm on one host)
 *   npm run example -- 256         # 256 MiB
 *   npm run example -- 1024 tcp    # force a transport
 */
import { spawn } from 'node:child_process'
import { randomFillSync } from 'node:crypto'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { Engine, type Region, type Segment, type TransportName } from '../index'

const MiB = 1 << 20

/** Runs `total` requests of `block` bytes with `window` in flight; returns seconds. */
async function pipeline(engine: Engine, op: 'read' | 'write', local: Region, seg: Segment, buffer: number, total: number, block: number, window = 32) {
  const started = process.hrtime.bigint()
  const used = new Set<string>()
  let next = 0
  const worker = async () => {
    while (next < total) {
      const off = next * block
      next++
      const r = await engine[op]({ local, localOffset: off, remote: seg, remoteBuffer: buffer, remoteOffset: off, length: block })
      used.add(r.tasks[0].transport ?? '?')
    }
  }
  await Promise.all(Array.from({ length: window }, worker))
  return { seconds: Number(process.hrtime.bigint() - started) / 1e9, transports: [...used].join('+') }
}

async function main() {
  const mib = Number(process.argv[2] ?? 1024)
  if (!Number.isInteger(mib) || mib <= 0) throw new Error(`size must be a positive number of MiB, got ${process.argv[2]}`)
  const transport = process.argv[3] as TransportName | undefined
  if (transport !== undefined && !['tcp', 'shm'].includes(transport)) throw new Error(`transport must be tcp or shm, got ${transport}`)
  const bytes = mib * MiB
  const target = spawn(process.execPath, [...process.execArgv, path.join(__dirname, 'target.ts'), String(bytes)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  })
  const engine = await Engine.create(transport ? { transports: [transport] } : {})
  try {
    const hello = await new Promise<{ segment: string; buffer: number }>((resolve, reject) => {
      readline.createInterface({ input: target.stdout! }).once('line', (l) => resolve(JSON.parse(l)))
      target.once('exit', (code) => reject(new Error(`target exited with ${code}`)))
    })
    const src = engine.allocate(bytes)
    const back = engine.allocate(bytes)
    // Random bytes, with each MiB stamped with its index so a misplaced block shows.
    const block = randomFillSync(Buffer.alloc(MiB))
    for (let i = 0; i < mib; i++) {
      block.copy(src.buffer, i * MiB)
      src.buffer.writeUInt32LE(i, i * MiB)
    }
    back.buffer.fill(0)
    const seg = await engine.openSegment(hello.segment)
    const count = bytes / MiB
    const w = await pipeline(engine, 'write', src, seg, hello.buffer, count, MiB)
    const r = await pipeline(engine, 'read', back, seg, hello.buffer, count, MiB)
    const ok = back.buffer.equals(src.buffer)
    const gbs = (s: number) => (bytes / s / 1e9).toFixed(2)
    console.log(`target   ${hello.segment} (pid ${target.pid})`)
    console.log(`write    ${mib} MiB in 1 MiB requests over ${w.transports}: ${gbs(w.seconds)} GB/s`)
    console.log(`read     ${mib} MiB in 1 MiB requests over ${r.transports}: ${gbs(r.seconds)} GB/s`)
    console.log(`verify   ${ok ? 'OK: every byte read back equals what was written' : 'MISMATCH'}`)
    if (!ok) process.exitCode = 1
  } finally {
    await engine.close()
    target.stdin!.end()
    const timer = setTimeout(() => target.kill('SIGKILL'), 5000)
    await new Promise((r) => (target.exitCode !== null ? r(null) : target.once('exit', r)))
    clearTimeout(timer)
  }
}

main().catch((err) => {
  console.error(err?.stack ?? err)
  process.exitCode = 1
})
