/**
 * One host of the cluster soak (started by bench/cluster-soak/hosts.ts inside its network
 * namespace): an engine registered in etcd as `soak-host-<i>` with the cluster secret
 * (FERRY_AUTH_SECRET_FILE), a target region every peer writes into (allocated after the
 * engine starts, as a real target's), and, once the driver says `go`, verified writes with
 * notifications to every peer (host/peer.ts), the notifications it receives judged
 * (host/receiver.ts). Settings in FERRY_SOAK_HOST (protocol.ts's `HostSettings`); commands
 * on stdin, reports on stdout, both JSON lines.
 *
 * Its memory is sampled when the driver asks (`sample`, at each round's end) right after a
 * full garbage collection, so that the sample shows what is still referenced rather than
 * when V8 last collected (memory.ts judges it).
 */
import * as readline from 'node:readline'
import * as v8 from 'node:v8'
import * as vm from 'node:vm'
import { Engine } from '../../index'
import { regionBytes } from './flags'
import { PeerTraffic, type HostContext } from './host/peer'
import { receiver } from './host/receiver'
import { hostName, newCounters, type Command, type Emit, type HostSettings } from './protocol'
import { within } from './wait'

const COUNTERS_EVERY_MS = 1000

/** When Node started this process (ms since the epoch). */
const tProcess = Math.round(performance.timeOrigin)

v8.setFlagsFromString('--expose-gc')
/** V8's full collection, as `--expose-gc` gives it (a fresh context picks the flag up). */
const collectGarbage = vm.runInNewContext('gc') as () => void

const settings = JSON.parse(process.env.FERRY_SOAK_HOST ?? 'null') as HostSettings | null
/** This incarnation: its start time. */
const inc = Date.now()
const emit: Emit = (r) => process.stdout.write(JSON.stringify({ host: settings?.index ?? -1, inc, t: Date.now(), ...r }) + '\n')

async function main(): Promise<number> {
  if (!settings) throw new Error('FERRY_SOAK_HOST is not set')
  const name = hostName(settings.index)
  const tEngineStart = Date.now()
  const engine = await Engine.create({
    listen: settings.listen,
    metadata: settings.etcd,
    segmentName: name,
    machineId: name,
    transports: ['tcp'],
    peerTimeoutMs: settings.peerTimeoutMs,
    leaseTtlMs: settings.leaseTtlMs,
  })
  const counters = newCounters()
  const target = engine.allocate(regionBytes(settings))
  const lanesBytes = settings.hosts * settings.lanes * settings.blockMax
  let running = true
  const ctx: HostContext = {
    engine,
    settings,
    inc,
    counters,
    writeRegion: engine.allocate(lanesBytes),
    readRegion: engine.allocate(lanesBytes),
    emit,
    running: () => running,
  }
  engine.on('notification', receiver(target, settings, counters, emit))
  engine.on('peerLost', (e) => {
    counters.peerLost++
    emit({ ev: 'peerLost', event: { ...e } })
  })
  engine.on('peerRecovered', (e) => {
    counters.peerRecovered++
    emit({ ev: 'peerRecovered', event: { ...e } })
  })
  const report = () => emit({ ev: 'counters', counters })
  const sample = (round: number) => {
    collectGarbage()
    const { rss, heapTotal, heapUsed, external, arrayBuffers } = process.memoryUsage()
    emit({ ev: 'memory', round, memory: { rss, heapTotal, heapUsed, external, arrayBuffers } })
  }
  const ticker = setInterval(report, COUNTERS_EVERY_MS)
  const peers = Array.from({ length: settings.hosts }, (_, i) => (i === settings.index ? null : new PeerTraffic(ctx, i)))
  const lanes: Promise<void>[] = []
  const go = async () => {
    const opened = await Promise.all(peers.map((p) => p?.open()))
    emit({ ev: 'opened', peers: opened.filter((x) => x === true).length, failed: opened.filter((x) => x === false).length })
    for (const p of peers) for (let l = 0; p && l < settings.lanes; l++) lanes.push(p.lane(l))
  }
  emit({ ev: 'ready', pid: process.pid, tProcess, tEngineStart })
  // The traffic ends, then its last counters go out (`quiet`); every lane ends after its
  // current call, which is bounded by hangMs.
  let quiet: Promise<void> | null = null
  const quiesce = () =>
    (quiet ??= (async () => {
      running = false
      await within(Promise.all(lanes), settings.hangMs + 1000)
      clearInterval(ticker)
      report()
      emit({ ev: 'quiet' })
    })())

  const stopped = new Promise<void>((resolve) => {
    const rl = readline.createInterface({ input: process.stdin })
    rl.on('line', (line) => {
      let c: Command
      try {
        c = JSON.parse(line) as Command
      } catch {
        return
      }
      if (c.cmd === 'go') void go()
      else if (c.cmd === 'killed') peers[c.target]?.link.killed(c.t)
      else if (c.cmd === 'sample') sample(c.round)
      else if (c.cmd === 'quiesce') void quiesce()
      else if (c.cmd === 'stop') rl.close()
    })
    // Stop also when the driver goes away (its end of the pipe closes).
    rl.once('close', () => resolve())
  })
  await stopped
  await quiesce()
  await engine.close()
  process.stdin.destroy()
  return 0
}

main().then(
  (code) => {
    process.exitCode = code
  },
  (err: unknown) => {
    const code = (err as { code?: unknown })?.code
    emit({ ev: 'error', message: `${typeof code === 'string' ? `${code}: ` : ''}${(err as Error)?.message ?? String(err)}` })
    process.exitCode = 1
  },
)
