/**
 * One process of the `storm` suite (bench/suites/storm.ts): FERRY_STORM_ENGINES engines on
 * loopback, each with a region of FERRY_STORM_SLOTS slots of FERRY_STORM_BYTES bytes (one
 * slot per engine of the whole storm, by its index) and a source of one slot, with
 * FERRY_STORM_IO_THREADS I/O threads each and FERRY_STORM_PEER_TIMEOUT_MS (unset or 0: the
 * engine's defaults).
 *
 * Prints `{ready, names, pid, fds, rss}` once its engines listen, then answers one JSON line per
 * command on stdin:
 *   {"cmd":"open","names":[...],"first":N}  every local engine (global index first+i) opens
 *       every other name at once -> {opened, failed, ms, errors, fds, rss}
 *   {"cmd":"write"}  each opened segment gets one write of the slot's bytes into the
 *       writer's slot -> {written, failed, ms, errors, fds, rss}
 *   {"cmd":"verify"}  every slot of every local engine compared with what its writer
 *       sent -> {matching, unwritten, mismatches}
 *   {"cmd":"exit"}   closes the engines and exits
 * It exits by itself when stdin closes.
 */
import { readdirSync } from 'node:fs'
import * as readline from 'node:readline'
import { Engine, type Region, type Segment, type TransportName } from '../index'

const count = Number(process.env.FERRY_STORM_ENGINES ?? 4)
const slots = Number(process.env.FERRY_STORM_SLOTS ?? 4)
const bytes = Number(process.env.FERRY_STORM_BYTES ?? 64 << 10)
const transports = (process.env.FERRY_STORM_TRANSPORTS ?? 'tcp').split(',') as TransportName[]
const ioThreads = Number(process.env.FERRY_STORM_IO_THREADS ?? 0) || undefined
const peerTimeoutMs = Number(process.env.FERRY_STORM_PEER_TIMEOUT_MS ?? 0) || undefined

/** The byte `i` of what the engine of global index `src` writes. */
const pattern = (src: number, i: number) => (i * 31 + src * 17 + (i >> 8)) & 0xff

interface Local {
  engine: Engine
  region: Region
  source: Region
  index: number
  opened: Array<{ segment: Segment; index: number }>
}

const reply = (v: unknown) => process.stdout.write(JSON.stringify(v) + '\n')
/** Descriptors open now; -1 when even listing them needs one more than the process may have. */
const fds = () => {
  try {
    return readdirSync('/proc/self/fd').length
  } catch {
    return -1
  }
}
/** Resident bytes now; -1 when reading them needs a descriptor the process may not have. */
const rss = () => {
  try {
    return process.memoryUsage.rss()
  } catch {
    return -1
  }
}

/** The distinct error messages seen, each with its count (at most 8). */
function summarize(errors: string[]): Record<string, number> {
  const out: Record<string, number> = {}
  for (const e of errors) {
    const key = e.slice(0, 200)
    if (key in out || Object.keys(out).length < 8) out[key] = (out[key] ?? 0) + 1
  }
  return out
}

const describe = (err: unknown) => {
  const e = err as { code?: string; message?: string }
  return `${e?.code ?? 'no code'}: ${e?.message ?? String(err)}`
}

async function main(): Promise<void> {
  const locals: Local[] = []
  for (let i = 0; i < count; i++) {
    const engine = await Engine.create({ transports, ioThreads, peerTimeoutMs })
    const region = engine.allocate(slots * bytes)
    const source = engine.allocate(bytes)
    locals.push({ engine, region, source, index: -1, opened: [] })
  }
  reply({ ready: true, names: locals.map((l) => l.engine.segmentName), pid: process.pid, fds: fds(), rss: rss() })
  let names: string[] = []
  const rl = readline.createInterface({ input: process.stdin })
  // Leaving closes the engines and stops reading: with nothing left to wait for, the process
  // ends by itself (a benchmark worker never calls exit).
  let left: Promise<void> | undefined
  const leave = () =>
    (left ??= (async () => {
      await Promise.allSettled(locals.map((l) => l.engine.close()))
      rl.close()
    })())
  rl.on('close', () => void leave())
  for await (const line of rl) {
    if (line.trim() === '') continue
    const cmd = JSON.parse(line) as { cmd: string; names?: string[]; first?: number }
    if (cmd.cmd === 'open') {
      names = cmd.names ?? []
      const first = cmd.first ?? 0
      for (const [i, l] of locals.entries()) {
        l.index = first + i
        for (let b = 0; b < bytes; b++) l.source.buffer[b] = pattern(l.index, b)
      }
      const errors: string[] = []
      const t0 = performance.now()
      await Promise.all(
        locals.flatMap((l) =>
          names.map(async (name, index) => {
            if (index === l.index) return
            try {
              l.opened.push({ segment: await l.engine.openSegment(name), index })
            } catch (err) {
              errors.push(describe(err))
            }
          }),
        ),
      )
      const ms = performance.now() - t0
      const opened = locals.reduce((n, l) => n + l.opened.length, 0)
      reply({ opened, failed: errors.length, ms, errors: summarize(errors), fds: fds(), rss: rss() })
    } else if (cmd.cmd === 'write') {
      const errors: string[] = []
      let written = 0
      const t0 = performance.now()
      await Promise.all(
        locals.flatMap((l) =>
          l.opened.map(async ({ segment }) => {
            try {
              await l.engine.write({ local: l.source, remote: segment, remoteOffset: l.index * bytes, length: bytes })
              written++
            } catch (err) {
              errors.push(describe(err))
            }
          }),
        ),
      )
      const ms = performance.now() - t0
      reply({ written, failed: errors.length, ms, errors: summarize(errors), fds: fds(), rss: rss() })
    } else if (cmd.cmd === 'verify') {
      // A slot still all zeros was not written (its open or write failed, and was counted
      // there); any other difference is a wrong byte.
      let matching = 0
      let unwritten = 0
      let mismatches = 0
      for (const l of locals) {
        for (let src = 0; src < names.length; src++) {
          if (src === l.index) continue
          const slot = l.region.buffer.subarray(src * bytes, (src + 1) * bytes)
          let same = true
          for (let b = 0; b < bytes && same; b++) same = slot[b] === pattern(src, b)
          if (same) matching++
          else if (slot.every((x) => x === 0)) unwritten++
          else mismatches++
        }
      }
      reply({ matching, unwritten, mismatches })
    } else if (cmd.cmd === 'exit') {
      reply({ ok: true })
      await leave()
    } else {
      reply({ error: `unknown command ${cmd.cmd}` })
    }
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`storm process failed: ${(err as Error)?.stack ?? String(err)}\n`)
  process.exitCode = 1
})
