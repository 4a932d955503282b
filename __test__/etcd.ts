/**
 * A throwaway single-member etcd for the cluster-mode tests (support/etcd.ts, which the soak
 * shares): free ports, a data directory in the OS temp dir, readiness polled with a bound,
 * killed by pid and its directory removed by `stop()` (and by `stopAllEtcd()` from
 * `test.after.always`).
 *
 * With `tls`, it serves clients over TLS with `--client-cert-auth` (certificates made by
 * `makePki` with the openssl CLI) and reports health on a plain-http metrics port;
 * `enableAuth` then turns on its username/password auth through the JSON gateway.
 *
 * `etcdRecords` reads the engines' records through etcd's JSON gateway (plain http only).
 *
 * Where etcd (or, for TLS, openssl) is not installed, `testWithEtcd` registers the tests
 * that need it as skipped, saying why; under CI it fails instead (`etcdUnavailable`).
 */
import test, { type ImplementationFn } from 'ava'
import { execFileSync, spawnSync, type ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as https from 'node:https'
import * as os from 'node:os'
import * as path from 'node:path'
import { startEtcd as startEtcdProcess, type EtcdTlsFiles } from '../support/etcd'
import { onCi } from './helpers'

export interface EtcdServer {
  /** `etcd://127.0.0.1:port`, for `EngineOptions.metadata`. */
  url: `etcd://${string}`
  /** `http://host:port`, for tebench's `--metadata_url_list`. */
  clientUrl: string
  pid: number
  /** Kills the server by pid (SIGKILL), waits for it, removes its data directory. */
  stop(): Promise<void>
}

/** Why `cmd args` does not run here, or undefined if it does. */
function notRunning(cmd: string, args: string[]): string | undefined {
  const r = spawnSync(cmd, args, { stdio: 'ignore', timeout: 10_000 })
  const code = (r.error as NodeJS.ErrnoException | undefined)?.code
  if (code === 'ENOENT') return `\`${cmd}\` is not installed`
  if (r.error) return `\`${cmd}\` cannot be started (${code ?? r.error.message})`
  if (r.status !== 0) return `\`${cmd} ${args.join(' ')}\` exited with ${r.status ?? r.signal}`
  return undefined
}

/**
 * Why the cluster-mode tests cannot run here (`etcd` does not run; with `tls`, neither may
 * the openssl CLI that `makePki` uses), or undefined if they can.
 *
 * Under CI (`CI` set, other than empty, `false` or `0`) it throws instead: CI installs both,
 * and there these tests must fail, never be skipped.
 */
export function etcdUnavailable(options: { tls?: boolean } = {}): string | undefined {
  const needs: Array<[cmd: string, args: string[], install: string]> = [['etcd', ['--version'], 'etcd-server']]
  if (options.tls) needs.push(['openssl', ['version'], 'openssl'])
  for (const [cmd, args, install] of needs) {
    const why = notRunning(cmd, args)
    if (!why) continue
    if (onCi()) throw new Error(`${why}: CI must have it to run the cluster-mode tests (install ${install})`)
    return `${why} (install ${install}, or set CI to make this a failure)`
  }
  return undefined
}

/**
 * `test` for the tests that start etcd (with `tls`, one with certificates from `makePki`):
 * where `etcdUnavailable` gives a reason, each is registered as a `test.skip` whose title
 * ends with it, as the netns tests do for `netnsUnavailable`.
 */
export function testWithEtcd(options: { tls?: boolean } = {}): (title: string, implementation: ImplementationFn<[]>) => void {
  const why = etcdUnavailable(options)
  if (!why) return test
  return (title) => test.skip(`${title} (skipped: ${why})`, (t) => t.pass())
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
  for (const dir of pkis) fs.rmSync(dir, { recursive: true, force: true })
  pkis.clear()
}

/** PEM files in `dir`: a CA, a server certificate for 127.0.0.1 signed by it, a client one. */
export interface Pki {
  dir: string
  ca: string
  serverCert: string
  serverKey: string
  clientCert: string
  clientKey: string
}

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 20_000 })
}

/** Makes a CA (`name`) and, unless `caOnly`, a server and a client certificate it signs. */
export function makePki(name = 'ferry-test-ca', caOnly = false): Pki {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-pki-'))
  const f = (n: string) => path.join(dir, n)
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  openssl(['req', '-x509', ...ec, '-keyout', f('ca.key'), '-out', f('ca.pem'), '-subj', `/CN=${name}`, '-days', '2'])
  const leaf = (id: string, ext: string) => {
    fs.writeFileSync(f(`${id}.ext`), ext)
    openssl(['req', ...ec, '-keyout', f(`${id}.key`), '-out', f(`${id}.csr`), '-subj', `/CN=${id}`])
    openssl(['x509', '-req', '-in', f(`${id}.csr`), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial', '-days', '2', '-extfile', f(`${id}.ext`), '-out', f(`${id}.pem`)])
  }
  if (!caOnly) {
    // clientAuth too: etcd's JSON gateway dials its own gRPC port with the server certificate.
    leaf('server', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n')
    // Not an etcd user: with auth on, etcd takes a certificate's CN as the user when no
    // password token is sent.
    leaf('client', 'extendedKeyUsage=clientAuth\n')
  }
  const pki = {
    dir,
    ca: f('ca.pem'),
    serverCert: f('server.pem'),
    serverKey: f('server.key'),
    clientCert: f('client.pem'),
    clientKey: f('client.key'),
  }
  pkis.add(dir)
  return pki
}

const pkis = new Set<string>()

/**
 * Turns on etcd's auth: a root user and `user` with `password`, allowed to read and write
 * `/ferry/` only (what an operator grants an engine). Through the JSON gateway over TLS.
 */
export async function enableAuth(etcd: EtcdServer, pki: Pki, user: string, password: string): Promise<void> {
  const b64 = (x: string) => Buffer.from(x).toString('base64')
  const call = (api: string, body: object) =>
    new Promise<void>((resolve, reject) => {
      const req = https.request(
        `${etcd.clientUrl}/v3/auth/${api}`,
        {
          method: 'POST',
          ca: fs.readFileSync(pki.ca),
          cert: fs.readFileSync(pki.clientCert),
          key: fs.readFileSync(pki.clientKey),
          timeout: 5000,
        },
        (res) => {
          let text = ''
          res.on('data', (d) => (text += d))
          res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`${api}: ${res.statusCode} ${text}`))))
        },
      )
      req.on('timeout', () => req.destroy(new Error(`${api}: no answer`)))
      req.on('error', reject)
      req.end(JSON.stringify(body))
    })
  await call('user/add', { name: 'root', password: 'root-password' })
  await call('user/grant', { user: 'root', role: 'root' })
  await call('user/add', { name: user, password })
  await call('role/add', { name: 'ferry-engine' })
  // range_end '/ferry0' ('/' + 1): the prefix /ferry/.
  await call('role/grant', { name: 'ferry-engine', perm: { permType: 'READWRITE', key: b64('/ferry/'), range_end: b64('/ferry0') } })
  await call('user/grant', { user, role: 'ferry-engine' })
  await call('enable', {})
}

export type { EtcdTlsFiles }

/** Starts etcd (support/etcd.ts), recorded for `stopAllEtcd`. */
export async function startEtcd(timeoutMs = 20_000, host = '127.0.0.1', tls?: EtcdTlsFiles): Promise<EtcdServer> {
  let entry: { proc: ChildProcess; dir: string } | undefined
  const forget = () => {
    if (entry) live.delete(entry)
  }
  const etcd = await startEtcdProcess({ host, tls, timeoutMs, name: 'ferry-test', onStart: (proc, dir) => {
      // A start on fresh ports (its first port was taken) replaces the one that failed.
      forget()
      live.add((entry = { proc, dir }))
    },
  }).catch((err: unknown) => {
    // A start that failed removed its process and folder itself.
    forget()
    throw err
  })
  const stop = async () => {
    await etcd.stop()
    forget()
  }
  return { url: etcd.url, clientUrl: etcd.clientUrl, pid: etcd.pid, stop }
}

/** Records under `prefix`: each segment name with the revision that created its record. */
export interface EtcdRecords {
  /** The store's revision when read. */
  revision: number
  created: Map<string, number>
}

/**
 * The records under `prefix` (the engines' default), read through etcd's JSON gateway, or
 * undefined when etcd does not answer within `timeoutMs` (it is paused, or down).
 */
export async function etcdRecords(etcd: EtcdServer, prefix = '/ferry/segments/', timeoutMs = 2000): Promise<EtcdRecords | undefined> {
  const b64 = (x: string) => Buffer.from(x).toString('base64')
  // The range end of a prefix: its last byte plus one.
  const end = prefix.slice(0, -1) + String.fromCharCode(prefix.charCodeAt(prefix.length - 1) + 1)
  try {
    const r = await fetch(`${etcd.clientUrl}/v3/kv/range`, {
      method: 'POST',
      body: JSON.stringify({ key: b64(prefix), range_end: b64(end) }),
      signal: AbortSignal.timeout(timeoutMs),
    })
    if (!r.ok) return undefined
    const body = (await r.json()) as { header?: { revision?: string }; kvs?: Array<{ key: string; create_revision?: string }> }
    const created = new Map<string, number>()
    for (const kv of body.kvs ?? []) {
      created.set(Buffer.from(kv.key, 'base64').toString().slice(prefix.length), Number(kv.create_revision ?? 0))
    }
    return { revision: Number(body.header?.revision ?? 0), created }
  } catch {
    return undefined
  }
}
