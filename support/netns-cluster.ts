/**
 * N "hosts" on one machine, all on one link: a hub namespace holding a bridge, one namespace
 * per host joined to it by a veth pair, and this (root) namespace joined to it too, so the
 * process that builds it (and what it runs here, such as etcd) reaches every host directly.
 * For the cluster soak (bench/cluster-soak); needs root and iproute2, like support/netns.ts.
 *
 *   const net = createCluster(8)
 *   net.gateway                         // this namespace's address on the link (etcd listens here)
 *   net.hosts[i].address                // host i's address; net.prefix(net.hosts[i]) runs inside it
 *   net.destroy()                       // removes every namespace and link (idempotent)
 *
 * Addresses are in one 10.214.<n>.0/24 chosen per run among subnets no interface of this
 * namespace uses (this namespace .1, host i .(i + 2)); names carry the pid. Nothing is routed:
 * every address is on the bridge, so traffic flows only between these namespaces and this
 * one's end of the link, and no sysctl of the machine is touched.
 */
import { execFileSync } from 'node:child_process'
import { ip, listNamespaces, quietly, sweepable, type Host } from './netns'

export interface Cluster {
  /** The hosts, each in a namespace of its own. */
  hosts: Host[]
  /** This namespace's address on the link. */
  gateway: string
  /** The command prefix that runs a program inside `host`. */
  prefix(host: Host): string[]
  /** Removes the namespaces and this namespace's end of the link. Idempotent; never throws. */
  destroy(): void
}

/** The most hosts one /24 holds beside the gateway. */
export const MAX_CLUSTER_HOSTS = 250

let serial = 0

const uplinkName = (pid: number, letter: string) => `fc${pid}${letter}`.slice(0, 15)

/** Builds the hub, `n` host namespaces and the link to this namespace. */
export function createCluster(n: number): Cluster {
  if (!Number.isInteger(n) || n < 1 || n > MAX_CLUSTER_HOSTS) throw new Error(`createCluster: 1..${MAX_CLUSTER_HOSTS} hosts, got ${n}`)
  // The creator's whole pid: a sweep tells a killed run's leftovers by it.
  const tag = `ferry-c-${process.pid}${String.fromCharCode(97 + (serial++ % 26))}`
  const hub = `${tag}-hub`
  const uplink = uplinkName(process.pid, tag.slice(-1))
  const used = ip(['-4', '-o', 'addr', 'show'])
  let subnet = -1
  for (let k = 0; k < 250; k++) {
    const s = ((process.pid + serial * 41 + k) % 250) + 1
    if (!used.includes(`10.214.${s}.`)) {
      subnet = s
      break
    }
  }
  if (subnet < 0) throw new Error('no free 10.214.x.0/24 subnet')
  const hosts: Host[] = Array.from({ length: n }, (_, i) => ({ ns: `${tag}-h${i}`, address: `10.214.${subnet}.${i + 2}`, ifname: 'eth0' }))
  const made: string[] = []
  let destroyed = false
  const destroy = () => {
    if (destroyed) return
    destroyed = true
    // Deleting a namespace deletes the veth ends in it, which deletes their pairs.
    for (const ns of [...made].reverse()) quietly(['netns', 'del', ns])
    quietly(['link', 'del', uplink])
  }
  try {
    ip(['netns', 'add', hub])
    made.push(hub)
    ip(['-n', hub, 'link', 'add', 'br0', 'type', 'bridge'])
    ip(['-n', hub, 'link', 'set', 'br0', 'up'])
    ip(['link', 'add', uplink, 'type', 'veth', 'peer', 'name', 'up0', 'netns', hub])
    ip(['-n', hub, 'link', 'set', 'up0', 'master', 'br0', 'up'])
    ip(['addr', 'add', `10.214.${subnet}.1/24`, 'dev', uplink])
    ip(['link', 'set', uplink, 'up'])
    hosts.forEach((h, i) => {
      ip(['netns', 'add', h.ns!])
      made.push(h.ns!)
      ip(['-n', hub, 'link', 'add', `h${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', h.ns!])
      ip(['-n', hub, 'link', 'set', `h${i}`, 'master', 'br0', 'up'])
      ip(['-n', h.ns!, 'addr', 'add', `${h.address}/24`, 'dev', 'eth0'])
      ip(['-n', h.ns!, 'link', 'set', 'eth0', 'up'])
      ip(['-n', h.ns!, 'link', 'set', 'lo', 'up'])
    })
  } catch (err) {
    destroy()
    throw err
  }
  return {
    hosts,
    gateway: `10.214.${subnet}.1`,
    prefix: (host) => (host.ns ? ['ip', 'netns', 'exec', host.ns] : []),
    destroy,
  }
}

/** A cluster namespace's name: its creator's pid, the cluster's letter, hub or host. */
const CLUSTER_NAME = /^ferry-c-(\d+)([a-z])-(hub|h\d+)$/

/**
 * Removes every cluster namespace and link that process `pid` (this one by default) made and
 * did not remove: a last-resort sweep, also for a test after its child died. Namespaces and
 * links of runs whose process is gone (killed before their own sweep) go too.
 */
export function sweepClusters(pid = process.pid): void {
  for (const name of listNamespaces()) {
    const [, creator, letter, role] = CLUSTER_NAME.exec(name) ?? []
    if (creator === undefined || (Number(creator) !== pid && !sweepable(Number(creator)))) continue
    // This end of the link first: a namespace's own interfaces go only once the kernel
    // has finished deleting it, later.
    if (role === 'hub') quietly(['link', 'del', uplinkName(Number(creator), letter)])
    quietly(['netns', 'del', name])
  }
  let links = ''
  try {
    links = execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8', timeout: 10_000 })
  } catch {
    return
  }
  for (const c of 'abcdefghijklmnopqrstuvwxyz') {
    const name = uplinkName(pid, c)
    if (links.includes(`: ${name}@`) || links.includes(`: ${name}:`)) quietly(['link', 'del', name])
  }
}

/** The cluster namespaces of process `pid` that exist now (none once it cleaned up). */
export function clusterNamespaces(pid = process.pid): string[] {
  return listNamespaces().filter((name) => CLUSTER_NAME.exec(name)?.[1] === String(pid))
}
