/**
 * Cluster mode through a real etcd started with TLS, client-certificate auth and
 * username/password auth (certificates made here with the openssl CLI): the engine's
 * `etcd*` options work end to end, and each wrong setting fails `Engine.create` with a
 * typed error naming its cause.
 */
import test, { type ExecutionContext } from 'ava'
import * as fs from 'node:fs'
import * as path from 'node:path'
import { Engine, type EngineOptions, type FerryError, type FerryErrorCode } from '../index'
import { enableAuth, makePki, startEtcd, stopAllEtcd, testWithEtcd, type EtcdServer, type Pki } from './etcd'

test.after.always(stopAllEtcd)

const USER = 'ferry'
const PASSWORD = 'correct horse battery staple'
const etcdTest = testWithEtcd({ tls: true })

let secured: Promise<{ etcd: EtcdServer; pki: Pki; passwordFile: string }> | undefined

/** One TLS + auth etcd shared by the tests of this file (started on first use). */
function securedEtcd() {
  secured ??= (async () => {
    const pki = makePki()
    const etcd = await startEtcd(20_000, '127.0.0.1', { ca: pki.ca, serverCert: pki.serverCert, serverKey: pki.serverKey })
    await enableAuth(etcd, pki, USER, PASSWORD)
    const passwordFile = path.join(pki.dir, 'password')
    fs.writeFileSync(passwordFile, `${PASSWORD}\n`, { mode: 0o600 })
    return { etcd, pki, passwordFile }
  })()
  return secured
}

async function refused(t: ExecutionContext, options: EngineOptions, code: FerryErrorCode, cause: RegExp) {
  const err = await t.throwsAsync<FerryError>(Engine.create({ transports: ['tcp'], connectTimeoutMs: 2000, ...options }))
  t.is(err?.code, code, err?.message)
  t.regex(err?.message ?? '', cause)
}

etcdTest('the right CA, client certificate and password: publish and open by name over TLS', async (t) => {
  t.timeout(60_000)
  const { etcd, pki, passwordFile } = await securedEtcd()
  const tls = { etcdCaFile: pki.ca, etcdCertFile: pki.clientCert, etcdKeyFile: pki.clientKey }
  const target = await Engine.create({
    transports: ['tcp'],
    metadata: etcd.url,
    segmentName: 'tls-target',
    ...tls,
    etcdUser: USER,
    etcdPasswordFile: passwordFile,
  })
  const initiator = await Engine.create({ transports: ['tcp'], metadata: etcd.url, ...tls, etcdUser: USER, etcdPassword: PASSWORD })
  try {
    const remote = target.allocate(1 << 16)
    const seg = await initiator.openSegment('tls-target')
    t.is(seg.name, 'tls-target')
    const src = initiator.allocate(1 << 16)
    src.buffer.fill(7)
    const r = await initiator.write({ local: src, remote: seg, remoteBuffer: remote.id, length: 1 << 16 })
    t.is(r.bytes, 1 << 16)
    t.true(remote.buffer.equals(src.buffer), 'bytes arrived')
  } finally {
    await initiator.close()
    await target.close()
  }
})

etcdTest('a wrong CA, no client certificate, a wrong password or plain text fail with ERR_FERRY_METADATA', async (t) => {
  t.timeout(60_000)
  const { etcd, pki, passwordFile } = await securedEtcd()
  const other = makePki('some-other-ca', true)
  const auth = { etcdUser: USER, etcdPasswordFile: passwordFile }
  const good = { metadata: etcd.url, etcdCaFile: pki.ca, etcdCertFile: pki.clientCert, etcdKeyFile: pki.clientKey }
  await refused(t, { ...good, etcdCaFile: other.ca, ...auth }, 'ERR_FERRY_METADATA', /UnknownIssuer/)
  // Under TLS 1.3 etcd's alert races its close: the alert, or a closed connection and a hint.
  await refused(
    t,
    { metadata: etcd.url, etcdCaFile: pki.ca, ...auth },
    'ERR_FERRY_METADATA',
    /BadCertificate|CertificateRequired|set a client certificate and key/,
  )
  await refused(t, { ...good, etcdUser: USER, etcdPassword: 'wrong' }, 'ERR_FERRY_METADATA', /authentication failed/)
  await refused(t, { metadata: etcd.url, ...auth }, 'ERR_FERRY_METADATA', /if it serves TLS, set a CA file/)
})

test('etcd TLS and auth options are checked before a start', async (t) => {
  t.timeout(30_000)
  const url = 'etcd://127.0.0.1:1'
  const bad = 'ERR_FERRY_INVALID_ARGUMENT'
  await refused(t, { metadata: url, etcdCaFile: '/nonexistent/ca.pem' }, bad, /etcd CA file \/nonexistent\/ca\.pem/)
  await refused(t, { metadata: url, etcdCertFile: __filename }, bad, /both its certificate and its key/)
  await refused(t, { metadata: url, etcdUser: USER }, bad, /etcdPassword/)
  await refused(t, { metadata: url, etcdPassword: PASSWORD }, bad, /etcdUser/)
  await refused(t, { metadata: url, etcdUser: USER, etcdPassword: 'x', etcdPasswordFile: __filename }, bad, /not both/)
  await refused(t, { etcdUser: USER, etcdPassword: PASSWORD }, bad, /need metadata 'etcd:/)
})
