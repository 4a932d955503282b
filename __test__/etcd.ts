/**
 * A throwaway single-member etcd for the cluster-mode tests: free loopback ports, a data
 * directory in the OS temp dir, readiness polled with a bound, killed by pid and its
 * directory removed by `stop()` (and by `stopAllEtcd()` from `test.after.always`).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as net from 'node:net'
import * as os from 'node:os'
import * as path from 'node:path'
import { delay } from './helpers'

export interface EtcdServer {
  /** `etcd://127.0.0.1:port`, for `EngineOptions.metadata`. */
  url: `etcd://${string}`
  /** `http://host:port`, for tebench's `--metadata_url_list`. */
  clientUrl: string
  pid: number
  /** Kills the server by pid (SIGKILL), waits for it, removes its data directory. */
  stop(): Promise<void>
}

const live = new Set<{ proc: ChildProcess; dir: string }>()

/** Kills every etcd still running and removes their directories. */
export function stopAllEtcd(): void {
  for (const s of live) {
    if (s.proc.exitCode === null && s.proc.signalCode === null && s.proc.pid) {
      try {
        process.kill(s.proc.pid, 'SIGKILL')
      } catch {
        // already gone
      }
    }
    fs.rmSync(s.dir, { recursive: true, force: true })
  }
  live.clear()
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port
      srv.close(() => resolve(port))
    })
  })
}

async function healthy(clientUrl: string): Promise<boolean> {
  try {
    const r = await fetch(`${clientUrl}/health`, { signal: AbortSignal.timeout(1000) })
    return (await r.text()).includes('"health":"true"')
  } catch {
    return false
  }
}

export async function startEtcd(timeoutMs = 20_000, host = '127.0.0.1'): Promise<EtcdServer> {
  if (spawnSync('etcd', ['--version']).error) {
    throw new Error('`etcd` is not installed: the cluster-mode tests need it (Debian: apt-get install etcd-server)')
  }
  const [clientPort, peerPort] = [await freePort(), await freePort()]
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-etcd-'))
  const clientUrl = `http://${host}:${clientPort}`
  const peerUrl = `http://127.0.0.1:${peerPort}`
  const proc = spawn(
    'etcd',
    [
      '--name=ferry-test',
      `--data-dir=${path.join(dir, 'data')}`,
      `--listen-client-urls=${clientUrl}`,
      `--advertise-client-urls=${clientUrl}`,
      `--listen-peer-urls=${peerUrl}`,
      `--initial-advertise-peer-urls=${peerUrl}`,
      `--initial-cluster=ferry-test=${peerUrl}`,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  )
  const entry = { proc, dir }
  live.add(entry)
  let log = ''
  proc.stderr?.on('data', (d) => (log = (log + d).slice(-4000)))
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()))
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null && proc.pid) process.kill(proc.pid, 'SIGKILL')
    await exited
    fs.rmSync(dir, { recursive: true, force: true })
    live.delete(entry)
  }
  const started = Date.now()
  while (!(await healthy(clientUrl))) {
    if (proc.exitCode !== null || proc.signalCode !== null || Date.now() - started > timeoutMs) {
      await stop()
      throw new Error(`etcd did not become ready within ${timeoutMs} ms:\n${log}`)
    }
    await delay(50)
  }
  return { url: `etcd://${host}:${clientPort}`, clientUrl, pid: proc.pid!, stop }
}
