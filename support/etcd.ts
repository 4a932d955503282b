/**
 * A throwaway single-member etcd, for the tests (__test__/etcd.ts) and the cluster soak
 * (bench/cluster-soak/etcd.ts): its client port free on `host`, its peer (and, with TLS,
 * metrics) port free on loopback, its data in a fresh folder of the OS temp dir, readiness
 * polled with a bound; paused with SIGSTOP and resumed with SIGCONT; killed by pid and its
 * folder removed by `stop()`. Each caller records the process for its own cleanup on exit
 * (`spawn`, `onStart`).
 *
 * With `tls` it serves clients over TLS with `--client-cert-auth` and reports its health on a
 * plain-http metrics port.
 */
import { spawn, spawnSync, type ChildProcess, type SpawnOptions } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { unusedPort } from './ports'

export interface EtcdTlsFiles {
  ca: string
  serverCert: string
  serverKey: string
}

export interface EtcdOptions {
  /** The address clients reach it on (default 127.0.0.1). */
  host?: string
  tls?: EtcdTlsFiles
  /** How long it may take to answer healthy (default 20 s). */
  timeoutMs?: number
  /** Its member name, and the prefix of its folder (default `ferry-etcd`). */
  name?: string
  /** Starts the process (default `child_process.spawn`): the soak's records it for its cleanup. */
  spawn?: (command: string, args: string[], options: SpawnOptions) => ChildProcess
  /** Called once the process is started, with its folder, before readiness is awaited (again for each start on fresh ports). */
  onStart?: (proc: ChildProcess, dir: string) => void
  /** The first start's ports (client, peer, metrics) instead of picked ones: for the test of a start whose port is taken. */
  firstPorts?: [number, number, number]
}

export interface Etcd {
  /** `etcd://host:port`, for `EngineOptions.metadata`. */
  url: `etcd://${string}`
  /** `http(s)://host:port`, for etcd's JSON gateway and tebench's `--metadata_url_list`. */
  clientUrl: string
  pid: number
  /** Its data folder (removed by `stop`). */
  dir: string
  /** SIGSTOP: it answers nobody until `resume`. */
  pause(): void
  /** SIGCONT. */
  resume(): void
  /** Kills it by pid (resumed first, SIGKILL), waits at most 10 s for its exit, removes its folder. */
  stop(): Promise<void>
}

const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))


async function healthy(url: string): Promise<boolean> {
  try {
    const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) })
    return (await r.text()).includes('"health":"true"')
  } catch {
    return false
  }
}

const running = (proc: ChildProcess) => proc.exitCode === null && proc.signalCode === null

/** Three different free ports: the client's on `host`, the peer's and the metrics' on loopback. */
async function pickPorts(host: string): Promise<[number, number, number]> {
  const picked: number[] = []
  while (picked.length < 3) {
    const port = await unusedPort(picked.length === 0 ? host : '127.0.0.1')
    if (!picked.includes(port)) picked.push(port)
  }
  return picked as [number, number, number]
}

/** How many times a start whose port was taken meanwhile is made again on fresh ports. */
const PORT_ATTEMPTS = 3

/**
 * Starts etcd and resolves once it answers healthy; rejects (everything removed) when it does
 * not within `timeoutMs`. A port picked free can still be taken before etcd binds it (another
 * test's pick of the same one): etcd then exits "address already in use" at once, and is
 * started again on fresh ports, at most `PORT_ATTEMPTS` times in all.
 */
export async function startEtcd(options: EtcdOptions = {}): Promise<Etcd> {
  if (spawnSync('etcd', ['--version'], { stdio: 'ignore', timeout: 10_000 }).error) {
    throw new Error('`etcd` is not installed: the cluster-mode tests and the soak need it (Debian: apt-get install etcd-server)')
  }
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(options, attempt === 1 ? options.firstPorts : undefined)
    } catch (err) {
      if (!(err instanceof PortTaken) || attempt >= PORT_ATTEMPTS) throw err
    }
  }
}

/** etcd exited because a port it was given was taken by the time it bound it. */
class PortTaken extends Error {}

async function startOnce(options: EtcdOptions, ports?: [number, number, number]): Promise<Etcd> {
  const { host = '127.0.0.1', tls, timeoutMs = 20_000, name = 'ferry-etcd' } = options
  const [clientPort, peerPort, metricsPort] = ports ?? (await pickPorts(host))
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `${name}-`))
  const clientUrl = `${tls ? 'https' : 'http'}://${host}:${clientPort}`
  const healthUrl = tls ? `http://127.0.0.1:${metricsPort}` : clientUrl
  const peerUrl = `http://127.0.0.1:${peerPort}`
  const tlsFlags = tls
    ? [`--listen-metrics-urls=${healthUrl}`, `--cert-file=${tls.serverCert}`, `--key-file=${tls.serverKey}`, `--trusted-ca-file=${tls.ca}`, '--client-cert-auth']
    : []
  const args = [
    `--name=${name}`,
    `--data-dir=${path.join(dir, 'data')}`,
    `--listen-client-urls=${clientUrl}`,
    `--advertise-client-urls=${clientUrl}`,
    `--listen-peer-urls=${peerUrl}`,
    `--initial-advertise-peer-urls=${peerUrl}`,
    `--initial-cluster=${name}=${peerUrl}`,
    ...tlsFlags,
  ]
  const proc = (options.spawn ?? spawn)('etcd', args, { stdio: ['ignore', 'ignore', 'pipe'] })
  options.onStart?.(proc, dir)
  let log = ''
  proc.stderr?.on('data', (d) => (log = (log + d).slice(-4000)))
  let failure: Error | undefined
  proc.once('error', (err) => (failure = err))
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
  const signal = (s: NodeJS.Signals) => {
    if (proc.pid && running(proc)) {
      try {
        process.kill(proc.pid, s)
      } catch {
        // gone already
      }
    }
  }
  const stop = async () => {
    signal('SIGCONT')
    signal('SIGKILL')
    if (proc.pid !== undefined && failure === undefined) await Promise.race([exited, delay(10_000)])
    fs.rmSync(dir, { recursive: true, force: true })
  }
  const started = Date.now()
  while (!(await healthy(healthUrl))) {
    if (failure || !running(proc) || Date.now() - started > timeoutMs) {
      await stop()
      const message = `etcd did not become ready within ${timeoutMs} ms: ${failure?.message ?? ''}\n${log}`
      throw /address already in use/.test(log) ? new PortTaken(message) : new Error(message)
    }
    await delay(50)
  }
  return {
    url: `etcd://${host}:${clientPort}`,
    clientUrl,
    pid: proc.pid!,
    dir,
    pause: () => signal('SIGSTOP'),
    resume: () => signal('SIGCONT'),
    stop,
  }
}
