/**
 * Target engine for the performance suite, run in its own process by bench/perf.ts.
 *
 * Allocates one region of FERRY_BENCH_BYTES (default 256 MiB), writes every page of it so
 * that page faults stay out of the measurement, then prints one JSON line
 * `{segment, buffer, pid, bytes}`. Commands on stdin, one per line, each answered with one
 * JSON line:
 *   cpu   -> {user_us, system_us} consumed by this process so far
 *   notes -> {received} notifications taken so far (each is taken as it comes)
 *   exit  -> {ok: true}, then closes the engine and exits
 * It exits by itself when stdin closes (the parent went away).
 */
import * as readline from 'node:readline'
import { Engine } from '../index'

async function main(): Promise<void> {
  const bytes = Number(process.env.FERRY_BENCH_BYTES ?? 256 << 20)
  const engine = await Engine.create({
    listen: process.env.FERRY_BENCH_LISTEN ?? '127.0.0.1:0',
    machineId: process.env.FERRY_BENCH_MACHINE_ID || undefined,
    ioThreads: process.env.FERRY_BENCH_IO_THREADS ? Number(process.env.FERRY_BENCH_IO_THREADS) : undefined,
    connectionsPerPeer: process.env.FERRY_BENCH_LANES ? Number(process.env.FERRY_BENCH_LANES) : undefined,
    // No secret at all, not even the per-user one (the auth suite's "off" side).
    allowUnauthenticated: process.env.FERRY_BENCH_UNAUTHENTICATED === '1' || undefined,
    // Sealed data connections or not (the encrypt suite's sides); unset: the default.
    encrypt: process.env.FERRY_BENCH_ENCRYPT === undefined ? undefined : process.env.FERRY_BENCH_ENCRYPT === 'true',
  })
  const region = engine.allocate(bytes)
  region.buffer.fill(0xa5)
  let received = 0
  engine.on('notification', () => received++)
  const reply = (v: unknown) => process.stdout.write(JSON.stringify(v) + '\n')
  let closed = false
  const leave = (code: number) => {
    if (closed) return
    closed = true
    void engine.close().finally(() => process.exit(code))
  }
  reply({ segment: engine.segmentName, buffer: region.id, pid: process.pid, bytes })
  const rl = readline.createInterface({ input: process.stdin })
  rl.on('line', (line) => {
    const cmd = line.trim()
    if (cmd === 'cpu') {
      const u = process.cpuUsage()
      reply({ user_us: u.user, system_us: u.system })
    } else if (cmd === 'notes') {
      reply({ received })
    } else if (cmd === 'exit') {
      reply({ ok: true })
      leave(0)
    } else if (cmd !== '') {
      reply({ error: `unknown command ${cmd}` })
    }
  })
  rl.on('close', () => leave(0))
  process.on('SIGTERM', () => leave(0))
}

main().catch((err: unknown) => {
  process.stderr.write(`bench target failed: ${(err as Error)?.stack ?? String(err)}\n`)
  process.exit(1)
})
