/**
 * What crosses the wire between two hosts (network namespaces joined by a veth pair,
 * support/netns.ts), captured with tcpdump on this end of the link: with the engines'
 * default encrypt ('auto': sealed beyond loopback) a distinctive pattern written and read
 * back appears nowhere in the capture; with encrypt: false on both (the control) it does.
 * Without root (namespaces) or tcpdump they are skipped, except under CI (`onCi`), which
 * installs both (`.ci/run`): there they fail.
 */
import test, { type ExecutionContext } from 'ava'
import { spawn, spawnSync } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { randomBytes } from 'node:crypto'
import { Engine } from '../index'
import { delay, killAll, onCi, startTarget } from './helpers'
import { createNetwork, netnsUnavailable, sweep } from '../support/netns'

test.after.always(killAll)
test.after.always(sweep)

const MiB = 1 << 20
// The target listens beyond loopback, which needs the cluster secret (inherited by the child).
const SECRET_FILE = path.join(os.tmpdir(), `ferry-netns-encrypt-secret-${process.pid}`)
fs.writeFileSync(SECRET_FILE, randomBytes(32).toString('hex'), { mode: 0o600 })
process.env.FERRY_AUTH_SECRET_FILE = SECRET_FILE
process.on('exit', () => fs.rmSync(SECRET_FILE, { force: true }))

const CANARY = Buffer.from('FERRY-PLAINTEXT-CANARY-7f3a9c2e-')

function unavailable(): string | undefined {
  const netns = netnsUnavailable()
  if (netns) return netns
  const probe = spawnSync('tcpdump', ['--version'], { timeout: 5000 })
  return probe.error ? 'tcpdump is not installed' : undefined
}

/** What a stopped capture holds, and tcpdump's own account of it (packets captured, dropped). */
interface Capture {
  bytes: Buffer
  summary: string
}

/**
 * Waits (at most 10 s) until `file` has stopped growing: under load tcpdump lags behind the
 * traffic, and the packets it has not taken from its buffer when SIGINT comes are never written.
 */
async function settled(file: string): Promise<void> {
  const size = () => (fs.existsSync(file) ? fs.statSync(file).size : 0)
  const deadline = Date.now() + 10_000
  let last = size()
  let steady = 0
  while (steady < 3 && Date.now() < deadline) {
    await delay(100)
    const now = size()
    steady = now === last ? steady + 1 : 0
    last = now
  }
}

/** tcpdump on `ifname` into `file`, stopped (once the file settled: SIGINT, then SIGKILL after a bound) by pid. */
async function startCapture(t: ExecutionContext, ifname: string, file: string): Promise<() => Promise<Capture>> {
  // --immediate-mode: each packet reaches tcpdump as it comes. Without it the kernel hands
  // packets over a block of the buffer at a time (full, or after a timeout), and a block still
  // filling when SIGINT comes — the read's megabyte, say — is never written.
  const proc = spawn('tcpdump', ['-i', ifname, '--immediate-mode', '-U', '-s', '0', '-B', '65536', '-w', file, 'tcp'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  let stderr = ''
  proc.stderr.on('data', (d) => (stderr += d))
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
  const stop = async (): Promise<Capture> => {
    if (proc.exitCode === null && proc.signalCode === null && proc.pid) {
      await settled(file)
      process.kill(proc.pid, 'SIGINT')
    }
    await Promise.race([exited, delay(5000)])
    if (proc.exitCode === null && proc.signalCode === null && proc.pid) {
      process.kill(proc.pid, 'SIGKILL')
      await Promise.race([exited, delay(5000)])
    }
    const bytes = fs.existsSync(file) ? fs.readFileSync(file) : Buffer.alloc(0)
    const summary = stderr.split('\n').filter((l) => /packets/.test(l)).join('; ')
    return { bytes, summary }
  }
  t.teardown(async () => {
    await stop()
    fs.rmSync(file, { force: true })
  })
  const deadline = Date.now() + 10_000
  while (!stderr.includes('listening on')) {
    if (proc.exitCode !== null) throw new Error(`tcpdump exited: ${stderr}`)
    if (Date.now() > deadline) throw new Error(`tcpdump did not start: ${stderr}`)
    await delay(20)
  }
  return stop
}

function occurrences(haystack: Buffer, needle: Buffer): number {
  let n = 0
  for (let at = haystack.indexOf(needle); at !== -1; at = haystack.indexOf(needle, at + 1)) n++
  return n
}

/** Writes 1 MiB of the canary pattern to a target in namespace b and reads it back, captured. */
async function capturedTransfer(t: ExecutionContext, encrypt: false | undefined): Promise<{ capture: Buffer; tcpBytes: number; summary: string }> {
  const net = createNetwork()
  t.teardown(() => net.destroy())
  const target = await startTarget(
    {
      FERRY_TARGET_BYTES: String(2 * MiB),
      FERRY_TARGET_LISTEN: `${net.b.address}:0`,
      FERRY_TARGET_MACHINE_ID: `host-b-${process.pid}`,
      FERRY_TARGET_TRANSPORTS: 'tcp',
      ...(encrypt === undefined ? {} : { FERRY_TARGET_ENCRYPT: String(encrypt) }),
    },
    20_000,
    net.prefix(net.b),
  )
  t.teardown(() => target.kill())
  const file = path.join(os.tmpdir(), `ferry-capture-${process.pid}-${encrypt ?? 'auto'}.pcap`)
  const stop = await startCapture(t, net.a.ifname, file)
  const engine = await Engine.create({ machineId: `host-a-${process.pid}`, transports: ['tcp'], ...(encrypt === undefined ? {} : { encrypt }) })
  t.teardown(() => engine.close())
  const seg = await engine.openSegment(target.segment)
  const local = engine.allocate(MiB)
  for (let at = 0; at < MiB; at += CANARY.length) CANARY.copy(local.buffer, at)
  await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: MiB })
  const back = engine.allocate(MiB)
  await engine.read({ local: back, remote: seg, remoteBuffer: target.buffer, length: MiB })
  t.true(back.buffer.equals(local.buffer), 'the data went there and back intact')
  await engine.close()
  const { bytes, summary } = await stop()
  return { capture: bytes, tcpBytes: bytes.length, summary }
}

const skip = unavailable()
if (skip && onCi()) {
  test('capture tests: what they need is missing under CI', (t) => {
    t.fail(`${skip}: CI must have it to run the capture tests (as root, with tcpdump installed: .ci/run)`)
  })
} else if (skip) {
  test.skip(`capture tests skipped: ${skip} (set CI to make this a failure)`, (t) => t.pass())
} else {
  test('beyond loopback the default seals data: the captured wire carries no plaintext', async (t) => {
    t.timeout(90_000)
    const { capture, tcpBytes, summary } = await capturedTransfer(t, undefined)
    t.log(`captured ${tcpBytes} bytes; tcpdump: ${summary}`)
    // 2 MiB crossed (there and back): the capture must have seen most of it, or finding no
    // pattern in it proves nothing.
    t.true(tcpBytes > MiB, `the capture holds most of the transfer (${tcpBytes} bytes; tcpdump: ${summary})`)
    t.is(occurrences(capture, CANARY), 0, 'the pattern crossed the wire in clear text')
  })

  test('with encrypt: false on both ends the same capture shows the pattern (the control)', async (t) => {
    t.timeout(90_000)
    const { capture, summary } = await capturedTransfer(t, false)
    t.true(occurrences(capture, CANARY) > 1000, `plaintext pattern not found: the capture did not see the data (tcpdump: ${summary})`)
  })
}
