/**
 * The cluster soak's driver: builds the namespaces (support/netns-cluster.ts), a cluster
 * secret and etcd, starts the hosts, then runs the rounds schedule.ts plans — SIGKILLing and
 * restarting hosts, pausing etcd, flooding a host with idle connections (and probing it with
 * a fresh engine meanwhile) — and samples every host's RSS after each round. Everything it
 * starts is removed in its `finally`, and by bench/lib/children.ts's cleanup on Ctrl-C or a
 * crash. Every wait is bounded.
 */
import * as fs from 'node:fs'
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

/** VmRSS of a process in MB (10^6 bytes), or null. */
function rssMb(pid: number | undefined): number | null {
  if (pid === undefined) return null
  try {
    const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))
    return m ? Math.round((Number(m[1]) * 1024) / 1e5) / 10 : null
  } catch {
    return null
  }
}

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
    const rss: Array<Array<number | null>> = cluster.hosts.map(() => [])
    const incarnations: Array<Array<number | null>> = cluster.hosts.map(() => [])
    /** RSS less V8's heap: what native memory (the engine's included) holds. */
    const besideHeap: Array<Array<number | null>> = cluster.hosts.map(() => [])
    let before = collector.totals()
    for (let r = 0; r < config.rounds; r++) {
      const plan = planRound(config, r)
      const disruptions = await runRound(run, plan)
      const totals = collector.totals()
      const rssNow = cluster.hosts.map((_, i) => rssMb(hosts.pid(i)))
      rssNow.forEach((v, i) => {
        rss[i].push(v)
        incarnations[i].push(hosts.alive(i) ? (collector.incarnation.get(i) ?? null) : null)
      })
      const mem = cluster.hosts.map((_, i) => (hosts.alive(i) ? collector.memory.get(i) : undefined))
      const beside = mem.map((m, i) => (m && rssNow[i] !== null ? Math.round(((rssNow[i] as number) - m.heapTotal) * 10) / 10 : null))
      beside.forEach((v, i) => besideHeap[i].push(v))
      io.emit({
        record: 'round',
        round: r,
        warmup: plan.warmup,
        length_ms: plan.lengthMs,
        rss_mb: rssNow,
        heap_total_mb: mem.map((m) => m?.heapTotal ?? null),
        heap_used_mb: mem.map((m) => m?.heapUsed ?? null),
        external_mb: mem.map((m) => m?.external ?? null),
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
      rss,
      besideHeap,
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
    run.collector.kills.push({ host, round: plan.round, tKill, tReady: null, storm: s.hosts.filter((x) => x !== host) })
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
      run.collector.restarted(h, ready.t)
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
