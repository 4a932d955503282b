/**
 * The soak's own single-member etcd (started as __test__/etcd.ts starts one): listening on
 * `host` (the cluster's gateway address) at free ports, its data in a fresh temp folder,
 * readiness polled with a bound; paused with SIGSTOP and resumed with SIGCONT; killed by pid
 * and its folder removed by `stop()` — and by the cleanup of bench/lib/children.ts on exit,
 * Ctrl-C or a crash, since it is started through it.
 */
import type { ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as net from 'node:net'
import * as os from 'node:os'
import * as path from 'node:path'
import { atCleanup, running, startChild, stopChild } from '../lib/children'

export interface Etcd {
  url: `etcd://${string}`
  pid: number
  pause(): void
  resume(): void
  stop(): Promise<void>
}

function freePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, host, () => {
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

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export async function startEtcd(host: string, timeoutMs = 30_000): Promise<Etcd> {
  const [clientPort, peerPort] = [await freePort(host), await freePort('127.0.0.1')]
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-soak-etcd-'))
  const removeDir = atCleanup(() => fs.rmSync(dir, { recursive: true, force: true }))
  const clientUrl = `http://${host}:${clientPort}`
  const peerUrl = `http://127.0.0.1:${peerPort}`
  const proc: ChildProcess = startChild(
    'etcd',
    'etcd',
    [
      '--name=ferry-soak',
      `--data-dir=${path.join(dir, 'data')}`,
      `--listen-client-urls=${clientUrl}`,
      `--advertise-client-urls=${clientUrl}`,
      `--listen-peer-urls=${peerUrl}`,
      `--initial-advertise-peer-urls=${peerUrl}`,
      `--initial-cluster=ferry-soak=${peerUrl}`,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  )
  let log = ''
  proc.stderr?.on('data', (d) => (log = (log + d).slice(-4000)))
  const failed = new Promise<Error>((resolve) => proc.once('error', resolve))
  const stop = async () => {
    if (proc.pid && running(proc)) {
      try {
        process.kill(proc.pid, 'SIGCONT')
      } catch {
        // gone already
      }
    }
    await stopChild(proc, 'SIGKILL', 10_000)
    fs.rmSync(dir, { recursive: true, force: true })
    removeDir()
  }
  const started = Date.now()
  while (!(await healthy(clientUrl))) {
    const err = await Promise.race([failed, delay(100).then(() => undefined)])
    if (err || !running(proc) || Date.now() - started > timeoutMs) {
      await stop()
      throw new Error(`etcd did not become ready within ${timeoutMs} ms: ${err?.message ?? ''}\n${log}`)
    }
  }
  const signal = (s: NodeJS.Signals) => {
    if (proc.pid && running(proc)) process.kill(proc.pid, s)
  }
  return { url: `etcd://${host}:${clientPort}`, pid: proc.pid!, pause: () => signal('SIGSTOP'), resume: () => signal('SIGCONT'), stop }
}
