/**
 * Several "hosts" on one machine: network namespaces joined by veth pairs, for tests and the
 * liveness benchmark (outside __test__ so both may import it, and ava never runs it as a
 * test file). Needs root and iproute2.
 *
 *   const net = createNetwork()            // host "a" = this (root) namespace, host "b" = a new one
 *   [...net.prefix(net.b), 'node', ...]    // a command line that runs inside b (ip netns exec)
 *   net.linkDown() / net.linkUp()          // takes b's end of the link down: silent loss, no reset
 *   net.destroy()                          // removes the namespace and the link (idempotent)
 *
 * Addresses are in 10.213.<n>.0/24, with <n> chosen per run among subnets that no interface
 * of this namespace uses; namespace and interface names carry the pid, so runs never share
 * them. Traffic only ever flows between the two ends of the link.
 */
import { execFileSync } from 'node:child_process'

export interface Host {
  /** Namespace name, or undefined for the namespace of this process. */
  ns?: string
  /** This host's address on the link. */
  address: string
  /** Its interface. */
  ifname: string
}

export interface Network {
  a: Host
  b: Host
  /** The command prefix that runs a program inside `host` (empty for the root namespace). */
  prefix(host: Host): string[]
  /** Takes b's end of the link down: packets vanish both ways, nobody gets a reset. */
  linkDown(): void
  /** Brings it back. */
  linkUp(): void
  /** Removes namespace and link. Idempotent; never throws. */
  destroy(): void
}

/** Why namespaces cannot be made here, or undefined if they can (root and iproute2). */
export function netnsUnavailable(): string | undefined {
  if (typeof process.getuid === 'function' && process.getuid() !== 0) {
    return 'network namespaces need root (run the tests as root to include these cases)'
  }
  return undefined
}

/** Runs `ip ARGS` (bounded) for a removal, ignoring its failure: what it removes may be gone already. */
export function quietly(args: string[]): void {
  try {
    execFileSync('ip', args, { stdio: 'ignore', timeout: 10_000 })
  } catch {
    // gone already
  }
}

/** Runs `ip ARGS` (bounded); throws an Error naming the command and why it failed. */
export function ip(args: string[]): string {
  try {
    return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10_000 })
  } catch (err) {
    const e = err as { stderr?: string; message: string; code?: string }
    const why = e.code === 'ENOENT' ? 'iproute2 (`ip`) is not installed' : (e.stderr || e.message).trim()
    throw new Error(`ip ${args.join(' ')}: ${why}`)
  }
}

let serial = 0

/**
 * Creates namespace b joined to this namespace by a veth pair, each end with its address.
 * With `ownNamespaceForA`, host a gets a namespace of its own too (two new namespaces; then
 * only processes started through `prefix(net.a)` live on host a).
 */
export function createNetwork(options: { ownNamespaceForA?: boolean } = {}): Network {
  // The creator's whole pid: `sweep` tells a crashed run's leftovers by it.
  const tag = `${process.pid}${String.fromCharCode(97 + (serial++ % 26))}`
  const ns = `ferry-b-${tag}`
  const nsA = options.ownNamespaceForA ? `ferry-b-${tag}-a` : undefined
  const ifa = `fra${tag}`.slice(0, 15)
  const ifb = `frb${tag}`.slice(0, 15)
  const used = ip(['-4', '-o', 'addr', 'show'])
  let subnet = -1
  for (let k = 0; k < 250; k++) {
    const n = ((process.pid + serial * 37 + k) % 250) + 1
    if (!used.includes(`10.213.${n}.`)) {
      subnet = n
      break
    }
  }
  if (subnet < 0) throw new Error('no free 10.213.x.0/24 subnet')
  const a: Host = { ns: nsA, address: `10.213.${subnet}.1`, ifname: ifa }
  const b: Host = { ns, address: `10.213.${subnet}.2`, ifname: ifb }
  let destroyed = false
  const destroy = () => {
    if (destroyed) return
    destroyed = true
    // Deleting the namespace deletes b's end, which deletes the pair.
    const steps = [['netns', 'del', ns], ['link', 'del', ifa]]
    if (nsA) steps.push(['netns', 'del', nsA])
    for (const args of steps) quietly(args)
  }
  try {
    ip(['netns', 'add', ns])
    if (nsA) ip(['netns', 'add', nsA])
    ip(['link', 'add', ifa, 'type', 'veth', 'peer', 'name', ifb, 'netns', ns])
    const inA = nsA ? ['-n', nsA] : []
    if (nsA) {
      ip(['link', 'set', ifa, 'netns', nsA])
      ip([...inA, 'link', 'set', 'lo', 'up'])
    }
    ip([...inA, 'addr', 'add', `${a.address}/24`, 'dev', ifa])
    ip([...inA, 'link', 'set', ifa, 'up'])
    ip(['-n', ns, 'addr', 'add', `${b.address}/24`, 'dev', ifb])
    ip(['-n', ns, 'link', 'set', ifb, 'up'])
    ip(['-n', ns, 'link', 'set', 'lo', 'up'])
  } catch (err) {
    destroy()
    throw err
  }
  return {
    a,
    b,
    prefix: (host) => (host.ns ? ['ip', 'netns', 'exec', host.ns] : []),
    linkDown: () => void ip(['-n', ns, 'link', 'set', ifb, 'down']),
    linkUp: () => void ip(['-n', ns, 'link', 'set', ifb, 'up']),
    destroy,
  }
}

/** The names `ip netns list` gives; its complaints about entries it cannot read (a crashed
 * run's leftover, "Peer netns reference is invalid") are kept off this process's stderr. */
export function listNamespaces(): string[] {
  try {
    const list = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10_000 })
    return list.split('\n').map((l) => l.split(' ')[0]).filter(Boolean)
  } catch {
    return []
  }
}

/**
 * Whether a sweep by this process removes a namespace named after process `creator`: its
 * own, or one whose creator no longer exists (signal 0 checks without sending anything).
 */
export function sweepable(creator: number): boolean {
  if (creator === process.pid) return true
  try {
    process.kill(creator, 0)
    return false
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== 'EPERM'
  }
}

/**
 * Removes every namespace this process made and did not remove (a last-resort sweep), and
 * those of runs whose process is gone (killed before its own sweep ran): their names carry
 * the creator's pid. A live process's namespaces are left to it.
 */
export function sweep(): void {
  for (const name of listNamespaces()) {
    const creator = /^ferry-b-(\d+)[a-z](-a)?$/.exec(name)?.[1]
    if (creator !== undefined && sweepable(Number(creator))) quietly(['netns', 'del', name])
  }
}
