/**
 * The cluster soak's driver: builds the namespaces (support/netns-cluster.ts), a cluster
 * secret and etcd, starts the hosts, then runs the rounds schedule.ts plans — SIGKILLing and
 * restarting hosts, pausing etcd, flooding a host with idle connections (and probing it with
 * a fresh engine meanwhile) — and samples every host's RSS after each round. Everything it
 * starts is removed in its `finally`, and by bench/lib/children.ts's cleanup on Ctrl-C or a
 * crash. Every wait is bounded.
 */
import * as path from 'node:path'
import { netnsUnavailable } from '../../support/netns'
import { createCluster, sweepClusters, type Cluster } from '../../support/netns-cluster'
import { atCleanup, jsonLines, startTsx, stopChild, tailStderr } from '../lib/children'
import { clusterSecret } from '../lib/secret'
import { Collector } from './collector'
import { startEtcd, type Etcd } from './etcd'
import { regionBytes, type SoakConfig } from './flags'
import { startFlood } from './flood'
import { Hosts } from './hosts'
import { judgedQuantities, mb, type MemorySample } from './memory'
import { hostName, type Counters } from './protocol'
import { planRound, type RoundPlan } from './schedule'
import { summarize, type Summary } from './summary'
import { bounded, delay } from './wait'

export interface SoakIo {
  /** A JSON record (a line on stdout). */
  emit(record: object): void
  /** Progress (stderr). */
  log(line: string): void
}

/** A host (re)start: Node, tsx and an engine on a loaded machine. */
const READY_MS = 120_000
const RESTART_TRIES = 3
/** The flood builds up this long before the probe opens the flooded host. */
const FLOOD_SETTLE_MS = 2000
/** How long the driver waits for the hosts' memory samples at a round's end. */
const SAMPLE_MS = 10_000

interface Run {
  config: SoakConfig
  io: SoakIo
  cluster: Cluster
  etcd: Etcd
  hosts: Hosts
  collector: Collector
  secretFile: string
  restartFailures: number
  floods: object[]
  etcdPauses: object[]
}

export async function runSoak(config: SoakConfig, io: SoakIo): Promise<Summary> {
  const why = netnsUnavailable()
  if (why) throw new Error(why)
  const started = Date.now()
  const cleanups: Array<() => void | Promise<void>> = []
  try {
    const cluster = createCluster(config.hosts)
    cleanups.push(atCleanup(() => cluster.destroy()), () => cluster.destroy())
    cleanups.push(atCleanup(sweepClusters))
    const secret = clusterSecret('soak')
    cleanups.push(atCleanup(secret.remove), secret.remove)
    const etcd = await startEtcd(cluster.gateway)
    cleanups.push(() => etcd.stop())
    const collector = new Collector()
    const hosts = new Hosts(config, cluster, etcd.url, secret.file, (r) => collector.report(r), io.log)
    cleanups.push(() => hosts.stopAll(0))
    const run: Run = { config, io, cluster, etcd, hosts, collector, secretFile: secret.file, restartFailures: 0, floods: [], etcdPauses: [] }
    io.emit({ record: 'start', config, gateway: cluster.gateway, hosts: cluster.hosts.map((h) => h.address), etcd: etcd.url, t: started })
    io.log(`starting ${config.hosts} hosts in namespaces on ${cluster.gateway.replace(/\.1$/, '.0/24')}`)
    await Promise.all(cluster.hosts.map((_, i) => hosts.start(i, READY_MS)))
    hosts.broadcast({ cmd: 'go' })
    await untilOpened(run, READY_MS)
    io.log('every host opened its peers')
    /** Each host's memory sample after each round, and the incarnation that took it. */
    const memory: Array<Array<MemorySample | null>> = cluster.hosts.map(() => [])
    const incarnations: Array<Array<number | null>> = cluster.hosts.map(() => [])
    let before = collector.totals()
    for (let r = 0; r < config.rounds; r++) {
      const plan = planRound(config, r)
      const disruptions = await runRound(run, plan)
      const totals = collector.totals()
      const samples = await sampleMemory(run, r)
      samples.forEach((m, i) => {
        memory[i].push(m?.memory ?? null)
        incarnations[i].push(m?.inc ?? null)
      })
      const q = samples.map((m) => (m ? judgedQuantities(m.memory) : null))
      const each = (f: (m: MemorySample) => number) => samples.map((m) => (m ? mb(f(m.memory)) : null))
      io.emit({
        record: 'round',
        round: r,
        warmup: plan.warmup,
        length_ms: plan.lengthMs,
        rss_mb: q.map((x) => x?.rss ?? null),
        native_mb: q.map((x) => x?.native ?? null),
        heap_used_mb: q.map((x) => x?.heap ?? null),
        heap_total_mb: each((m) => m.heapTotal),
        external_mb: each((m) => m.external),
        array_buffers_mb: each((m) => m.arrayBuffers),
        ...disruptions,
        delta: delta(before, totals),
      })
      io.log(`round ${r + 1}/${config.rounds}${plan.warmup ? ' (warm-up)' : ''}: ${JSON.stringify(delta(before, totals))}`)
      before = totals
    }
    // Traffic ends everywhere before any engine closes: closing is no loss to count.
    const stoppedAt = Date.now()
    hosts.broadcast({ cmd: 'quiesce' })
    await untilQuiet(run, config.hangMs + 5000)
    await hosts.stopAll(config.hangMs + 5000)
    const c = collector
    return summarize({
      config,
      stoppedAt,
      durationS: Math.round((Date.now() - started) / 100) / 10,
      totals: c.totals(),
      kills: c.kills,
      fails: c.fails,
      ups: c.ups,
      mismatches: c.mismatches,
      peerLost: c.peerLost,
      peerRecovered: c.peerRecovered.length,
      memory,
      incarnations,
      floods: run.floods,
      etcdPauses: run.etcdPauses,
      restartFailures: run.restartFailures,
      hostErrors: c.errors,
      misdeliveredSamples: c.misdelivered,
    })
  } finally {
    for (const fn of cleanups.reverse()) {
      try {
        await fn()
      } catch (err) {
        io.log(`cleanup: ${(err as Error).message}`)
      }
    }
  }
}

/** The counters a round added. */
function delta(a: Counters, b: Counters) {
  return {
    bytes_verified: b.bytesVerified - a.bytesVerified,
    writes_ok: b.writesOk - a.writesOk,
    mismatches: b.readbackMismatches - a.readbackMismatches,
    misdelivered: b.misdelivered - a.misdelivered,
    peer_lost: b.peerLost - a.peerLost,
    hung: b.hung - a.hung,
  }
}

async function untilOpened(run: Run, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  for (let i = 0; i < run.config.hosts; i++) {
    while (!run.collector.opened(i, run.collector.incarnation.get(i) ?? -1)) {
      if (Date.now() > deadline) throw new Error(`host ${i} did not open its peers in ${ms} ms`)
      await delay(100)
    }
  }
}

/**
 * Every running host's memory after round `round` (null for a host that is down or did not
 * answer within SAMPLE_MS), with the incarnation that took it.
 */
async function sampleMemory(run: Run, round: number): Promise<Array<{ inc: number; memory: MemorySample } | null>> {
  const { hosts, collector, config } = run
  const alive = Array.from({ length: config.hosts }, (_, i) => hosts.alive(i))
  hosts.broadcast({ cmd: 'sample', round })
  const deadline = Date.now() + SAMPLE_MS
  const answered = (i: number) => collector.sample(i, round, collector.incarnation.get(i)) !== undefined
  while (alive.some((a, i) => a && hosts.alive(i) && !answered(i)) && Date.now() < deadline) await delay(20)
  return alive.map((a, i) => {
    const inc = collector.incarnation.get(i)
    const m = a && hosts.alive(i) && inc !== undefined ? collector.sample(i, round, inc) : undefined
    return m && inc !== undefined ? { inc, memory: m } : null
  })
}

/** Waits, at most `ms`, until every running host has ended its traffic. */
async function untilQuiet(run: Run, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  for (let i = 0; i < run.config.hosts; i++) {
    while (run.hosts.alive(i) && !run.collector.quiet(i, run.collector.incarnation.get(i) ?? -1) && Date.now() < deadline) await delay(50)
  }
}

/** One round: its disruptions at their times, then the rest of its length. */
async function runRound(run: Run, plan: RoundPlan): Promise<Record<string, unknown>> {
  const t0 = Date.now()
  const at = (offset: number) => delay(Math.max(0, t0 + offset - Date.now()))
  const out: Record<string, unknown> = {}
  const tasks: Promise<void>[] = []
  if (plan.etcdPause) {
    const p = plan.etcdPause
    tasks.push(
      (async () => {
        await at(p.startMs)
        const tPause = Date.now()
        run.etcd.pause()
        await at(p.endMs)
        run.etcd.resume()
        out.etcd_pause = { t_pause: tPause, t_resume: Date.now() }
        run.etcdPauses.push({ round: plan.round, ...(out.etcd_pause as object) })
      })(),
    )
  }
  if (plan.storm) tasks.push(storm(run, plan, at, out))
  if (plan.flood) tasks.push(flood(run, plan, at, out))
  await Promise.all(tasks)
  await at(plan.lengthMs)
  return out
}

async function storm(run: Run, plan: RoundPlan, at: (ms: number) => Promise<void>, out: Record<string, unknown>): Promise<void> {
  const s = plan.storm!
  await at(s.killMs)
  const kills = s.hosts.map((host) => {
    const tKill = run.hosts.kill(host)
    run.collector.kills.push({ host, round: plan.round, tKill, tReady: null, tProcess: null, tEngineStart: null, storm: s.hosts.filter((x) => x !== host) })
    return { host, t_kill: tKill }
  })
  for (const k of kills) run.hosts.broadcast({ cmd: 'killed', target: k.host, t: k.t_kill }, s.hosts)
  run.io.log(`round ${plan.round + 1}: killed hosts ${s.hosts.join(', ')}`)
  await at(s.restartMs)
  const restarts = await Promise.all(s.hosts.map((h) => restart(run, h)))
  out.storm = kills.map((k, i) => ({ ...k, t_ready: restarts[i] }))
}

/** Restarts host `h` on its address; resolves its ready time, or null when every try failed. */
async function restart(run: Run, h: number): Promise<number | null> {
  await run.hosts.exited(h, 10_000)
  for (let attempt = 1; attempt <= RESTART_TRIES; attempt++) {
    try {
      const ready = await run.hosts.start(h, READY_MS)
      run.collector.restarted(h, ready)
      run.hosts.send(h, { cmd: 'go' })
      return ready.t
    } catch (err) {
      run.restartFailures++
      run.io.log(`restart of host ${h} (try ${attempt}): ${(err as Error).message}`)
      await run.hosts.exited(h, 10_000)
      await delay(1000)
    }
  }
  return null
}

async function flood(run: Run, plan: RoundPlan, at: (ms: number) => Promise<void>, out: Record<string, unknown>): Promise<void> {
  const f = plan.flood!
  const address = run.cluster.hosts[f.host].address
  await at(f.startMs)
  const flood = startFlood(address, run.config.port, run.config.flood!.connections)
  try {
    await at(f.startMs + FLOOD_SETTLE_MS)
    const during = flood.stats()
    const result = await probe(run, f.host)
    await at(f.endMs)
    out.flood = { host: f.host, stats_at_probe: during, stats: flood.stats(), probe: result }
    run.floods.push({ round: plan.round, ...(out.flood as object) })
  } finally {
    flood.stop()
  }
}

/** A fresh engine in this namespace opens the flooded host and moves a block (probe.ts). */
async function probe(run: Run, host: number): Promise<Record<string, unknown>> {
  const settings = { etcd: run.etcd.url, target: hostName(host), regionBytes: regionBytes(run.config), hangMs: run.config.hangMs }
  const proc = startTsx('probe', path.join(__dirname, 'probe.ts'), [], { FERRY_SOAK_PROBE: JSON.stringify(settings), FERRY_AUTH_SECRET_FILE: run.secretFile })
  const stderr = tailStderr(proc)
  const lines = jsonLines(proc, stderr)
  try {
    return await bounded(lines.next(READY_MS), READY_MS + 1000)
  } catch (err) {
    return { ok: false, code: 'PROBE_FAILED', message: (err as Error).message.slice(0, 500) }
  } finally {
    lines.close()
    await stopChild(proc, 'SIGKILL', 5000)
  }
}
