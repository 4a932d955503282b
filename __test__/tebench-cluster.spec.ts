/**
 * tebench for real clusters: gflags forms and refused Mooncake flags (parsed in-process),
 * JSON records and Mooncake's layout, what served each case, failure injection, and two
 * hosts in network namespaces (p2p and etcd).
 */
import test from 'ava'
import { execFileSync, type ChildProcess } from 'node:child_process'
import * as crypto from 'node:crypto'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { parseFlags, UsageError } from '../bench/options'
import { parseConfig } from '../bench/tebench/config'
import { OPTIONS } from '../bench/tebench/flags'
import { stripeLength } from '../bench/tebench/stripes'
import { handedOut } from '../bench/tebench/target'
import { Engine } from '../index'
import { enableAuth, makePki, startEtcd, stopAllEtcd, testWithEtcd } from './etcd'
import { delay, ended, killAll, spawnNode } from './helpers'
import { createNetwork, netnsUnavailable, sweep } from '../support/netns'

const TEBENCH = path.join(__dirname, '..', 'bench', 'tebench.ts')

/** A file holding a fresh cluster secret, removed when the process exits. */
function secretFile(): string {
  const file = path.join(os.tmpdir(), `ferry-secret-${process.pid}-${Date.now()}`)
  fs.writeFileSync(file, `${crypto.randomBytes(32).toString('hex')}\n`, { mode: 0o600 })
  process.on('exit', () => fs.rmSync(file, { force: true }))
  return file
}
const PERF = path.join(__dirname, '..', 'bench', 'perf.ts')

test.after.always(killAll)
test.after.always(sweep)
test.after.always(stopAllEtcd)

interface Finished {
  code: number | null
  stdout: string
  stderr: string
}

/** Runs a script to its end, bounded by `limitMs` (killed by pid past it). */
async function run(script: string, args: string[], limitMs = 60_000, prefix: string[] = []): Promise<Finished> {
  const proc = spawnNode(script, {}, args, prefix)
  return finish(proc, limitMs)
}

function finish(proc: ChildProcess, limitMs: number): Promise<Finished> {
  let stdout = ''
  let stderr = ''
  proc.stdout?.on('data', (d) => (stdout += d))
  proc.stderr?.on('data', (d) => (stderr += d))
  return new Promise((resolve) => {
    const timer = setTimeout(() => proc.pid && process.kill(proc.pid, 'SIGKILL'), limitMs)
    void ended(proc).then(({ code }) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

const records = (stdout: string) =>
  stdout
    .trim()
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>)

const QUICK = ['--duration=1', '--start_block_size=65536', '--max_block_size=65536', '--total_buffer_size=64M']

// ---------------------------------------------------------------------------------------
// Flags, in-process.

const usage = (argv: string[]) => {
  try {
    parseConfig(argv)
  } catch (err) {
    if (err instanceof UsageError) return err.message
    throw err
  }
  return undefined
}

test("--addressing: Mooncake's fixed stripes by default, walk on request", (t) => {
  const fixed = parseConfig(['--local'])
  t.is(fixed.addressing, 'fixed')
  t.is(parseConfig(['--local', '--addressing=walk']).addressing, 'walk')
  t.throws(() => parseConfig(['--local', '--addressing=stride']))
  const MiB = 1 << 20
  // fixed: stride = max_block_size × max_batch_size (1 GiB buffer, 64 MiB × 1 by default)
  t.is(stripeLength(fixed, 1, 4096), 64 * MiB)
  t.is(stripeLength({ ...fixed, maxBatchSize: 4 }, 2, MiB), 256 * MiB)
  // … or the split of the buffer when that stride does not fit the threads
  t.is(stripeLength(fixed, 32, 4096), 32 * MiB)
  // walk: the buffer split between the threads, whole blocks
  t.is(stripeLength({ ...fixed, addressing: 'walk' }, 3, MiB), 341 * MiB)
})

test('gflags forms: --flag=true|false, --noflag, --flag value, -flag', (t) => {
  const mix = ['--local', '--op_type=mix']
  t.true(parseConfig([...mix, '--check_consistency=true']).checkConsistency)
  t.true(parseConfig([...mix, '--check_consistency']).checkConsistency)
  t.false(parseConfig([...mix, '--check_consistency=false']).checkConsistency)
  t.false(parseConfig([...mix, '--check_consistency', '--nocheck_consistency']).checkConsistency)
  t.false(parseConfig([...mix, '--check_consistency', '--no-check_consistency']).checkConsistency)
  t.is(parseConfig(['--local', '--op_type', 'write']).opType, 'write')
  t.is(parseConfig(['--local', '-op_type=write', '-duration', '2']).durationS, 2)
  t.is(parseConfig(['--local', '--total_buffer_size=64M']).totalBufferSize, 64 << 20)
  // A boolean never takes the next argument: a stray value is refused, not swallowed.
  t.regex(usage(['--local', '--check_consistency', 'false']) ?? '', /unexpected argument "false"/)
  t.regex(usage(['--check_consistency=maybe']) ?? '', /--check_consistency: expected true or false/)
  t.regex(usage(['--nonsense']) ?? '', /unknown flag --nonsense/)
  t.regex(usage(['--noop_type']) ?? '', /unknown flag --noop_type/, '--no only negates booleans')
  t.regex(usage(['--duration']) ?? '', /--duration needs a value/)
})

test('every refused Mooncake flag is refused with a message naming it; implemented values pass', (t) => {
  const refused: Array<[string, RegExp]> = [
    ['--local_gpu_id=1', /^--local_gpu_id: GPU memory/],
    ['--target_gpu_id=-1', /^--target_gpu_id: GPU memory/],
    ['--seg_type=VRAM', /^--seg_type=VRAM: GPU memory/],
    ['--backend=classic', /^--backend=classic: /],
    ['--xport_type=gds', /^--xport_type=gds: not a Ferry transport/],
    ['--metadata_type=redis', /^--metadata_type=redis: /],
    ['--target_offset=4096', /^--target_offset: /],
    ['--deadline_us=100', /^--deadline_us: /],
    ['--deadline_bw_arbitration', /^--deadline_bw_arbitration: /],
    ['--tent_transport_hint=rdma', /^--tent_transport_hint: /],
    ['--tent_intent_type=migration', /^--tent_intent_type: /],
    ['--qos_output_jsonl=/tmp/q.jsonl', /^--qos_output_jsonl: QoS flags/],
    ['--receiver_credit_mode=fixed', /^--receiver_credit_mode: receiver-credit/],
  ]
  for (const [flag, message] of refused) t.regex(usage(['--local', flag]) ?? '(accepted)', message, flag)
  for (const ok of ['--backend=tent', '--seg_type=DRAM', '--notifi', '--notifi=false', '--nonotifi', '--local_gpu_id=0']) {
    t.is(usage(['--local', ok]), undefined, ok)
  }
})

test('hosts: --listen with --rpc_server_port, --seg_name advertises; initiators refuse them', (t) => {
  t.is(parseConfig([]).listen, '127.0.0.1:0')
  t.is(parseConfig(['--listen=10.0.0.2', '--rpc_server_port=7000']).listen, '10.0.0.2:7000')
  t.is(parseConfig(['--listen=0.0.0.0:7001', '--seg_name=10.0.0.2']).advertise, '10.0.0.2')
  t.regex(usage(['--listen=not an address']) ?? '', /--listen: expected ADDR\[:PORT\]/)
  t.regex(usage(['--target_seg_name=a:1', '--listen=0.0.0.0']) ?? '', /target flags/)
  t.regex(usage(['--inject=kill']) ?? '', /--inject needs --local/)
  t.regex(usage(['--local', '--inject=crash']) ?? '', /--inject: expected kill or stop/)
  t.regex(usage(['--local', '--inject=stop:9000', '--duration=5']) ?? '', /past the measured case/)
  t.deepEqual(parseConfig(['--local', '--inject=stop:500']).inject, { signal: 'SIGSTOP', afterMs: 500 })
})

test('etcd TLS and auth flags: files only, in pairs, with etcd', (t) => {
  const etcd = ['--metadata_type=etcd', '--metadata_url_list=https://127.0.0.1:2379']
  const files = ['--etcd_ca_file=/c/ca.pem', '--etcd_cert_file=/c/a.pem', '--etcd_key_file=/c/a.key']
  const auth = ['--etcd_user=ferry', '--etcd_password_file=/c/pw']
  t.deepEqual(parseConfig([...etcd, ...files, ...auth]).etcd, {
    caFile: '/c/ca.pem',
    certFile: '/c/a.pem',
    keyFile: '/c/a.key',
    user: 'ferry',
    passwordFile: '/c/pw',
  })
  t.deepEqual(parseConfig(etcd).etcd, {
    caFile: undefined,
    certFile: undefined,
    keyFile: undefined,
    user: undefined,
    passwordFile: undefined,
  })
  t.regex(usage(['--etcd_ca_file=/c/ca.pem']) ?? '', /need --metadata_type=etcd/)
  t.regex(usage([...etcd, '--etcd_cert_file=/c/a.pem']) ?? '', /--etcd_cert_file and --etcd_key_file go together/)
  t.regex(usage([...etcd, '--etcd_user=ferry']) ?? '', /read from the file/)
  // A password is never a flag.
  t.regex(usage([...etcd, '--etcd_user=ferry', '--etcd_password=secret']) ?? '', /unknown flag --etcd_password/)
})

test('perf and tebench share one schema: the same bounds for the options they share', async (t) => {
  t.timeout(30_000)
  t.is(OPTIONS.peer_timeout_ms.min, 10)
  const parsed = parseFlags({ x: OPTIONS.peer_timeout_ms }, ['--x=10'])
  t.is(parsed.values.x, 10)
  // perf accepts what tebench accepts (it refused 10 ms before: its own bound was 100).
  const tebenchSays = usage(['--local', '--peer_timeout_ms=5'])
  t.regex(tebenchSays ?? '', /--peer_timeout_ms: must be between 10 and 3600000, got 5/)
  const perf = await run(PERF, ['--peer-timeout-ms=5'], 20_000)
  t.is(perf.code, 2, perf.stderr)
  t.regex(perf.stderr, /--peer-timeout-ms: must be between 10 and 3600000, got 5/)
  const help = await run(PERF, ['-h'], 20_000)
  t.is(help.code, 0, help.stderr)
  t.regex(help.stderr, /--lat-ops=INTEGER/)
})

// ---------------------------------------------------------------------------------------
// Output.

test('--json: bad usage is a JSON record on stdout, exit 2, nothing on stderr', async (t) => {
  t.timeout(30_000)
  const r = await run(TEBENCH, ['--json', '--local_gpu_id=1'])
  t.is(r.code, 2, r.stderr)
  t.is(r.stderr, '')
  const [rec] = records(r.stdout)
  t.like(rec, { record: 'usage', code: 'ERR_USAGE' })
  t.regex(String(rec.error), /GPU memory/)
})

test('--notifi: every submission notifies; the initiator reports the rate per case, the target the count it received', async (t) => {
  t.timeout(60_000)
  const r = await run(TEBENCH, ['--local', '--json', '--notifi', '--op_type=write', ...QUICK])
  t.is(r.code, 0, r.stderr)
  const all = records(r.stdout)
  const cases = all.filter((x) => x.record === 'case')
  const sent = all.filter((x) => x.record === 'notifications' && x.role === 'initiator')
  const received = all.filter((x) => x.record === 'notifications' && x.role === 'target')
  t.true(cases.length > 0)
  t.is(sent.length, cases.length, 'one notifications record per case')
  for (const s of sent) {
    t.true(Number(s.count) > 0)
    t.is(s.lost, 0)
    t.true(Number(s.perSecond) > 0)
  }
  t.is(received.length, 1, 'the target prints its count once, at its end')
  // Every notification sent reached the target: counted there, or dropped and counted. The
  // initiator's count is the measured time's; those of the warm-up are reported apart.
  t.is(Number(received[0].count) + Number(received[0].lost), sent.reduce((a, s) => a + Number(s.count) + Number(s.warmup), 0))
  t.true(Number(received[0].count) > 0)
})

test('a stopping target counts the notifications still queued for its listener before it prints the count', async (t) => {
  t.timeout(60_000)
  const target = await Engine.create({ notifyQueueSize: 4096 })
  const sender = await Engine.create()
  t.teardown(() => Promise.all([sender.close(), target.close()]))
  const remote = target.allocate(4096)
  const local = sender.allocate(4096)
  const peer = await sender.openSegment(target.segmentName)
  // Acknowledged by the target's engine, queued there: no listener takes them yet.
  const total = 2000
  for (let i = 0; i < total; i++) await sender.write({ local, remote: peer, remoteBuffer: remote.id, length: 64, notify: 'n' })
  t.is(target.metrics().notificationsReceived, total)
  let received = 0
  target.on('notification', () => received++)
  // The stop came now: listeners are handed a bounded share per turn, so most still wait.
  await new Promise((resolve) => process.nextTick(resolve))
  t.true(received < total, `${received} handed out at once`)
  await handedOut(target, () => received)
  t.is(received, total)
})

test('--json: a case names the transport that served it, its share and failovers; a failure is a record', async (t) => {
  t.timeout(60_000)
  const r = await run(TEBENCH, ['--local', '--json', '--op_type=write', ...QUICK])
  t.is(r.code, 0, r.stderr)
  const all = records(r.stdout)
  const cases = all.filter((x) => x.record === 'case')
  t.is(cases.length, 1, r.stdout)
  const c = cases[0]
  // Same host, auto mode: shared memory serves.
  t.is(c.transport, 'shm', JSON.stringify(c))
  t.is(c.requested, 'auto')
  t.deepEqual(
    (c.served as Array<{ transport: string; percent: number }>).map((s) => [s.transport, s.percent]),
    [['shm', 100]],
  )
  t.is(c.failovers, 0)
  t.true((c.ops as number) > 0)
  for (const d of all.filter((x) => x.record === 'transportDisabled')) t.true(typeof d.reason === 'string' && d.reason !== '')
  // A segment nobody serves: a FAILED record with status, transport, peer, request and code.
  const missing = await run(TEBENCH, ['--target_seg_name=127.0.0.1:1', '--json', '--xport_type=tcp', ...QUICK])
  t.is(missing.code, 1, missing.stderr)
  const [f] = records(missing.stdout).filter((x) => x.record === 'failed')
  t.truthy(f, missing.stdout)
  for (const k of ['status', 'transport', 'peer', 'request', 'code', 'reason']) t.is(typeof f[k], 'string', `${k} in ${JSON.stringify(f)}`)
  t.is(f.peer, '127.0.0.1:1')
})

test('table: the header names what served; --format=mooncake prints Mooncake\'s layout', async (t) => {
  t.timeout(60_000)
  const table = await run(TEBENCH, ['--local', '--op_type=write', '--xport_type=tcp', ...QUICK])
  t.is(table.code, 0, table.stderr)
  t.regex(table.stdout, /^WRITE, 1 thread, requested transport tcp, addressing fixed$/m)
  t.regex(table.stdout, /^transport tcp \(100 %\), 0 failovers$/m)
  t.regex(table.stdout, /^ +65536 \|/m)
  t.regex(table.stdout, /^tebench: initiator engine: \d+ I\/O threads?, tcp \d+ lanes? per peer$/m)

  const mc = await run(TEBENCH, ['--local', '--op_type=write', '--format=mooncake', ...QUICK])
  t.is(mc.code, 0, mc.stderr)
  const lines = mc.stdout.split('\n')
  // REFERENCE.md: left-aligned cells, BlkSize 14, Batch 8, then 14; a line of 160 '-'.
  const names = ['BlkSize (B)', 'Batch', 'BW (GB/S)', 'Avg Inst GB/s', 'Avg Lat (us)', 'Avg Tx (us)', 'P99 Tx (us)', 'P999 Tx (us)']
  const header = names.map((n, i) => n.padEnd(i === 1 ? 8 : 14)).join('')
  t.is(lines[0], header)
  t.is(lines[1], '-'.repeat(160))
  t.regex(lines[2], /^65536 {9}1 {7}\d+\.\d{6} +\d+\.\d{6} +\d+\.\d +\d+\.\d +\d+\.\d +\d+\.\d +$/)
  t.is(lines[2].length, header.length)
  t.is(lines.length, 4, 'header, rule, one row, final newline')
  t.regex(mc.stderr, /transport shm \(100 %\), 0 failovers/)
  t.regex(mc.stderr, /^tebench: initiator engine: \d+ I\/O threads?, tcp \d+ lanes? per peer, shm \d+ copy threads?$/m)
  t.regex(mc.stderr, /^tebench: target engine: /m)
})

test('Ctrl-C before anything was measured: exit 130 and no row of zeros', async (t) => {
  t.timeout(60_000)
  // A warm-up far longer than the test: the interrupt always lands before measuring.
  const proc = spawnNode(TEBENCH, { FERRY_TEBENCH_WARMUP_MS: '600000' }, ['--local', '--op_type=write', '--xport_type=tcp', ...QUICK])
  const done = finish(proc, 45_000)
  let out = ''
  proc.stdout?.on('data', (d) => (out += d))
  const started = Date.now()
  while (!/^WRITE, /m.test(out) && Date.now() - started < 30_000) await delay(20)
  t.regex(out, /^WRITE, /m, 'the case started')
  process.kill(proc.pid!, 'SIGINT')
  const r = await done
  t.is(r.code, 130, r.stdout + r.stderr)
  t.notRegex(r.stdout, /^\s+65536 \|/m, 'no row')
  t.notRegex(r.stdout, /BlkSize/)
})

// ---------------------------------------------------------------------------------------
// Failure injection.

/** Children of `pid` (the --local target), so that a test can always end them by pid. */
function childrenOf(pid: number): number[] {
  try {
    return execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8', timeout: 5000 })
      .split('\n')
      .map((l) => Number(l.trim()))
      .filter((n) => n > 0)
  } catch {
    return []
  }
}

for (const [inject, xport] of [
  ['kill', 'tcp'],
  ['stop:500', 'tcp'],
  ['stop:500', 'shm'],
] as const) {
  test(`--inject=${inject} over ${xport}: exit 1, both times reported and under peer_timeout_ms + 2 s`, async (t) => {
    t.timeout(60_000)
    const peerTimeoutMs = 1500
    const proc = spawnNode(TEBENCH, {}, [
      '--local',
      `--inject=${inject}`,
      `--xport_type=${xport}`,
      `--peer_timeout_ms=${peerTimeoutMs}`,
      '--op_type=write',
      '--json',
      '--start_num_threads=4',
      '--max_num_threads=4',
      '--duration=5',
      '--start_block_size=1048576',
      '--max_block_size=1048576',
      '--total_buffer_size=64M',
    ])
    const targets = new Set<number>()
    const watcher = setInterval(() => proc.pid && childrenOf(proc.pid).forEach((p) => targets.add(p)), 200)
    try {
      const r = await finish(proc, 30_000)
      t.is(r.code, 1, r.stdout + r.stderr)
      const all = records(r.stdout)
      const rec = all.find((x) => x.record === 'inject')
      t.truthy(rec, r.stdout)
      if (!rec) return
      t.log(`${inject} over ${xport}: first FAILED after ${rec.firstFailedMs} ms, last request ended after ${rec.lastTerminalMs} ms`)
      t.is(rec.signal, inject === 'kill' ? 'SIGKILL' : 'SIGSTOP')
      targets.add(rec.targetPid as number)
      for (const k of ['firstFailedMs', 'lastTerminalMs'] as const) {
        t.is(typeof rec[k], 'number', k)
        t.true((rec[k] as number) < peerTimeoutMs + 2000, `${k} ${rec[k]} ms`)
      }
      t.true((rec.firstFailedMs as number) <= (rec.lastTerminalMs as number))
      const failed = all.find((x) => x.record === 'failed')
      t.truthy(failed, r.stdout)
      t.notRegex(r.stdout + r.stderr, /panicked|terminate|Aborted/)
    } finally {
      clearInterval(watcher)
      for (const pid of targets) {
        for (const sig of ['SIGCONT', 'SIGKILL'] as const) {
          try {
            process.kill(pid, sig)
          } catch {
            // gone
          }
        }
      }
    }
  })
}

// ---------------------------------------------------------------------------------------
// Two hosts: a target in a network namespace, the initiator in this one.

/** Starts a target tebench through `prefix` and waits (bounded) for its initiator command. */
async function startTarget(args: string[], prefix: string[]) {
  const proc = spawnNode(TEBENCH, {}, ['--total_buffer_size=64M', ...args], prefix)
  let stderr = ''
  proc.stderr?.on('data', (d) => (stderr += d))
  const command = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`target did not start: ${stderr}`)), 20_000)
    readline.createInterface({ input: proc.stdout! }).on('line', (line) => {
      if (!line.includes('--target_seg_name=')) return
      clearTimeout(timer)
      resolve(line)
    })
    proc.once('exit', (code) => reject(new Error(`target exited (${code}): ${stderr}`)))
  })
  return { proc, command, segment: /--target_seg_name=(\S+)/.exec(command)![1] }
}

const etcdTlsTest = testWithEtcd({ tls: true })
etcdTlsTest('an etcd with TLS and password auth: target and initiator on loopback with --etcd_* flags, exit 0', async (t) => {
  t.timeout(120_000)
  const pki = makePki()
  const etcd = await startEtcd(20_000, '127.0.0.1', { ca: pki.ca, serverCert: pki.serverCert, serverKey: pki.serverKey })
  t.teardown(() => etcd.stop())
  const password = 'tebench etcd password'
  await enableAuth(etcd, pki, 'ferry', password)
  const passwordFile = path.join(pki.dir, 'password')
  fs.writeFileSync(passwordFile, password, { mode: 0o600 })
  const wrongFile = path.join(pki.dir, 'wrong')
  fs.writeFileSync(wrongFile, 'not it', { mode: 0o600 })
  const tls = [`--etcd_ca_file=${pki.ca}`, `--etcd_cert_file=${pki.clientCert}`, `--etcd_key_file=${pki.clientKey}`]
  const meta = ['--metadata_type=etcd', `--metadata_url_list=${etcd.clientUrl}`, ...tls, '--etcd_user=ferry']
  const target = await startTarget([...meta, `--etcd_password_file=${passwordFile}`, '--local_server_name=tls-b'], [])
  t.teardown(() => {
    if (target.proc.exitCode === null && target.proc.signalCode === null) process.kill(target.proc.pid!, 'SIGKILL')
  })
  t.is(target.segment, 'tls-b')
  t.true(target.command.includes(`--etcd_password_file=${passwordFile}`), target.command)
  t.false(target.command.includes(password), 'the printed command holds no password')
  const r = await run(
    TEBENCH,
    ['--target_seg_name=tls-b', ...meta, `--etcd_password_file=${passwordFile}`, '--op_type=write', '--json', ...QUICK],
    60_000,
  )
  t.is(r.code, 0, `${r.stdout}${r.stderr}`)
  t.true(records(r.stdout).some((x) => x.record === 'case'), r.stdout)
  const wrong = await run(TEBENCH, ['--target_seg_name=tls-b', ...meta, `--etcd_password_file=${wrongFile}`, ...QUICK], 60_000)
  t.is(wrong.code, 1, `${wrong.stdout}${wrong.stderr}`)
  t.regex(wrong.stderr, /ERR_FERRY_METADATA.*authentication failed/)
})

const skip = netnsUnavailable()
if (skip) {
  test.skip(`two-host tebench tests skipped: ${skip}`, (t) => t.pass())
} else {
  const etcdTest = testWithEtcd()
  for (const metadata of ['p2p', 'etcd'] as const) {
    const register: typeof etcdTest = metadata === 'etcd' ? etcdTest : test
    register(`two hosts (${metadata}): write, read and mix with --check_consistency=true over tcp, exit 0; another secret file, exit 1`, async (t) => {
      t.timeout(150_000)
      const net = createNetwork()
      t.teardown(() => net.destroy())
      let meta: string[] = []
      if (metadata === 'etcd') {
        const etcd = await startEtcd(20_000, net.a.address)
        t.teardown(() => etcd.stop())
        meta = ['--metadata_type=etcd', `--metadata_url_list=${etcd.clientUrl}`]
      }
      const named = metadata === 'etcd' ? ['--local_server_name=host-b'] : []
      // Listening on all interfaces, advertising the link address: what peers are told.
      // Listening beyond loopback needs the cluster secret, on both roles.
      const auth = [`--auth_secret_file=${secretFile()}`]
      const target = await startTarget(['--listen=0.0.0.0', `--seg_name=${net.b.address}`, ...auth, ...meta, ...named], net.prefix(net.b))
      t.teardown(() => {
        if (target.proc.exitCode === null && target.proc.signalCode === null) process.kill(target.proc.pid!, 'SIGKILL')
      })
      t.is(target.segment, metadata === 'etcd' ? 'host-b' : `${net.b.address}:${/:(\d+)$/.exec(target.segment)?.[1]}`)
      if (metadata === 'p2p') t.true(target.segment.startsWith(`${net.b.address}:`), target.command)
      t.true(target.command.includes(auth[0]), `the printed initiator command carries the secret file: ${target.command}`)
      for (const op of ['write', 'read', 'mix']) {
        const r = await run(
          TEBENCH,
          [
            `--target_seg_name=${target.segment}`,
            ...auth,
            ...meta,
            `--op_type=${op}`,
            '--check_consistency=true',
            '--json',
            ...QUICK,
          ],
          60_000,
        )
        t.is(r.code, 0, `${op}: ${r.stdout}${r.stderr}`)
        const cases = records(r.stdout).filter((x) => x.record === 'case')
        t.is(cases.length, op === 'mix' ? 2 : 1, r.stdout)
        for (const c of cases) {
          t.is(c.transport, 'tcp', `${op}: ${JSON.stringify(c)}`)
          t.true((c.ops as number) > 0)
        }
      }
      // The table says it too.
      const table = await run(TEBENCH, [`--target_seg_name=${target.segment}`, ...auth, ...meta, '--op_type=write', ...QUICK], 60_000)
      t.is(table.code, 0, table.stderr)
      t.regex(table.stdout, /^transport tcp \(100 %\)/m)
      // Another secret: refused at the handshake, exit 1 with the auth error.
      const wrong = await run(TEBENCH, [`--target_seg_name=${target.segment}`, `--auth_secret_file=${secretFile()}`, ...meta, '--op_type=write', ...QUICK], 60_000)
      t.is(wrong.code, 1, `${wrong.stdout}${wrong.stderr}`)
      t.regex(wrong.stderr, /FAILED \(ERR_FERRY_CONNECT\).*authentication failed: the peer does not hold our cluster secret/)
      await delay(0)
    })
  }
}
