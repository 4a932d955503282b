/** bench/tebench.ts as a process: output, exit codes, and peer death mid-case. */
import test from 'ava'
import type { ChildProcess } from 'node:child_process'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { startEtcd, stopAllEtcd, testWithEtcd } from './etcd'
import { delay, ended, killAll, spawnNode } from './helpers'

const TEBENCH = path.join(__dirname, '..', 'bench', 'tebench.ts')
const COLUMNS = ['blockSize', 'batchSize', 'bwGbps', 'avgInstGbps', 'avgLatUs', 'avgTxUs', 'minTxUs', 'p50TxUs', 'p99TxUs', 'p999TxUs', 'maxTxUs']

interface Finished {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  exitedAt: number
}

/** Collects a child's output; `done` resolves when it exits. */
function watch(proc: ChildProcess) {
  let stdout = ''
  let stderr = ''
  proc.stdout?.on('data', (d) => (stdout += d))
  proc.stderr?.on('data', (d) => (stderr += d))
  const done = new Promise<Finished>((resolve) => {
    // When it exited, not when its pipes closed after.
    let exitedAt = 0
    proc.once('exit', () => (exitedAt = Date.now()))
    void ended(proc).then(({ code, signal }) => resolve({ code, signal, stdout, stderr, exitedAt }))
  })
  return { done, out: () => stdout, err: () => stderr }
}

function runTebench(args: string[]) {
  return watch(spawnNode(TEBENCH, {}, args))
}

/** rdma runs on the emulated verbs device here (no NIC): both ends select it by env. */
const EMULATED = { FERRY_RDMA_PROVIDER: 'emulated' }
const envFor = (xport: string): Record<string, string> => (xport === 'rdma' ? EMULATED : {})

/** Starts a target-mode tebench and returns its segment name. */
async function startTarget(extra: string[] = [], env: Record<string, string> = {}) {
  const proc = spawnNode(TEBENCH, env, ['--rpc_server_port=0', '--total_buffer_size=64M', ...extra])
  const w = watch(proc)
  const segment = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`target did not start: ${w.err()}`)), 60_000)
    const lines = readline.createInterface({ input: proc.stdout! })
    lines.on('line', (line) => {
      const m = /--target_seg_name=(\S+)/.exec(line)
      if (m) {
        clearTimeout(timer)
        resolve(m[1])
      }
    })
    proc.once('exit', (code) => reject(new Error(`target exited (${code}): ${w.err()}`)))
  })
  return { proc, segment, ...w }
}

/** An initiator writing 1 MiB blocks from 8 threads to `segment`, for the peer-death tests. */
function startWriter(segment: string, xport: string, extra: string[] = []) {
  return watch(
    spawnNode(TEBENCH, envFor(xport), [
      `--target_seg_name=${segment}`,
      '--op_type=write',
      '--start_block_size=1048576',
      '--max_block_size=1048576',
      '--start_num_threads=8',
      '--max_num_threads=8',
      '--total_buffer_size=64M',
      `--xport_type=${xport}`,
      ...extra,
      '--duration=10',
    ]),
  )
}

/** Waits (bounded) for the table's title, printed right before the first case starts. */
async function waitForTable(w: ReturnType<typeof watch>, limitMs = 60_000): Promise<boolean> {
  const started = Date.now()
  const title = /^(READ|WRITE), /m
  while (!title.test(w.out()) && Date.now() - started < limitMs) await delay(20)
  return title.test(w.out())
}

/** The case records of a --json run (other records: transportDisabled notes). */
function caseRows(stdout: string): Array<Record<string, unknown>> {
  return stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((x) => x.record === 'case')
}

test.after.always(() => {
  killAll()
  stopAllEtcd()
})

test('--local --json: one JSON object per case with the columns, exit 0', async (t) => {
  t.timeout(180_000)
  const r = await runTebench([
    '--local',
    '--duration=1',
    '--max_block_size=65536',
    '--start_block_size=4096',
    '--total_buffer_size=64M',
    '--json',
  ]).done
  t.is(r.code, 0, r.stderr)
  const rows = caseRows(r.stdout)
  t.deepEqual(
    rows.map((x) => x.blockSize),
    [4096, 8192, 16384, 32768, 65536],
  )
  for (const row of rows) {
    for (const c of COLUMNS) t.is(typeof row[c], 'number', `${c} in ${JSON.stringify(row)}`)
    t.true((row.ops as number) > 0)
    t.true((row.bwGbps as number) > 0)
    t.is(row.addressing, 'fixed', 'the default addressing, named in every record')
  }
})

test('the run header names the lanes and copy threads the engines use, as they report them', async (t) => {
  t.timeout(180_000)
  const args = ['--local', '--duration=0.2', '--start_block_size=4096', '--max_block_size=4096', '--total_buffer_size=16M', '--op_type=write']
  // JSON: one engine record per side; --tcp_lanes reaches both engines.
  const json = await runTebench([...args, '--tcp_lanes=3', '--json']).done
  t.is(json.code, 0, json.stderr)
  const engines = json.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((x) => x.record === 'engine')
  t.deepEqual(engines.map((e) => e.role).sort(), ['initiator', 'target'], json.stdout)
  for (const e of engines) {
    t.is(e.tcpLanes, 3, JSON.stringify(e))
    t.true(Number.isInteger(e.ioThreads) && (e.ioThreads as number) >= 1, JSON.stringify(e))
    t.true(Number.isInteger(e.shmCopyThreads) && (e.shmCopyThreads as number) >= 0, JSON.stringify(e))
  }
  // The table: a header line per engine, before the first case; auto is what the engine picked.
  const table = await runTebench(args).done
  t.is(table.code, 0, table.stderr)
  const header = /^tebench: initiator engine: (\d+) I\/O threads?, tcp (\d+) lanes? per peer, shm (\d+) copy threads?$/m.exec(table.stdout)
  t.truthy(header, table.stdout)
  t.true(table.stdout.indexOf('initiator engine:') < table.stdout.search(/^WRITE, /m), table.stdout)
  t.regex(table.stdout, /^tebench: target engine: \d+ I\/O threads?, tcp \d+ lanes? per peer, shm \d+ copy threads?$/m)
  t.true(Number(header![2]) >= 1)
  // A bad value is a usage error.
  const bad = await runTebench(['--local', '--tcp_lanes=0']).done
  t.is(bad.code, 2, bad.stderr)
  t.regex(bad.stderr, /--tcp_lanes/)
})

test('--local --xport_type=rdma on the emulated verbs device: every case over rdma, data checked, exit 0', async (t) => {
  t.timeout(180_000)
  const r = await watch(
    spawnNode(TEBENCH, EMULATED, [
      '--local',
      '--xport_type=rdma',
      '--op_type=mix',
      '--check_consistency',
      '--duration=1',
      '--start_block_size=65536',
      '--max_block_size=1048576',
      '--total_buffer_size=64M',
      '--json',
    ]),
  ).done
  t.is(r.code, 0, r.stderr)
  const rows = caseRows(r.stdout)
  t.is(rows.length, 10, 'write and read for each of 5 block sizes')
  for (const row of rows) {
    t.true((row.ops as number) > 0, JSON.stringify(row))
    t.is(row.transport, 'rdma', JSON.stringify(row))
  }
})

test('bad usage exits 2 with one message on stderr', async (t) => {
  t.timeout(150_000)
  for (const args of [['--no_such_flag'], ['--op_type=erase'], ['--metadata_type=etcd'], ['--duration']]) {
    const r = await runTebench(args).done
    t.is(r.code, 2, `${args.join(' ')}: ${r.stderr}`)
    t.is(r.stderr.trim().split('\n').length, 1, r.stderr)
    t.regex(r.stderr, /^tebench: /)
    t.is(r.stdout, '')
  }
  const etcd = await runTebench(['--metadata_type=etcd']).done
  t.regex(etcd.stderr, /needs --metadata_url_list/)
})

for (const xport of ['tcp', 'shm', 'rdma'] as const) {
  test(`target SIGKILLed mid-case over ${xport}: initiator exits 1 promptly with a FAILED line`, async (t) => {
    t.timeout(180_000)
    const target = await startTarget([], envFor(xport))
    const w = startWriter(target.segment, xport)
    // The table header comes right before the first case starts (1 s warm-up, then measured).
    t.true(await waitForTable(w), `initiator did not start: ${w.err()}`)
    await delay(1500)
    process.kill(target.proc.pid!, 'SIGKILL')
    const killedAt = Date.now()
    const r = await Promise.race([w.done, delay(15_000).then(() => undefined)])
    t.truthy(r, 'initiator did not exit within 15 s of the kill')
    if (!r) return
    const all = r.stdout + r.stderr
    t.log(`exit ${r.code} after ${r.exitedAt - killedAt} ms; stderr: ${r.stderr.trim()}`)
    t.is(r.code, 1, all)
    t.not(r.code, 134)
    t.not(r.code, 139)
    t.is(r.signal, null)
    t.true(r.exitedAt - killedAt < 5000, `exited ${r.exitedAt - killedAt} ms after the kill`)
    t.regex(r.stderr, /^tebench: (FAILED|TIMEOUT|CANCELED|INVALID)\b.* over \S+ to \S+ — /m)
    t.is(r.stderr.trim().split('\n').length, 1, r.stderr)
    t.notRegex(all, /panicked|terminate|Aborted/)
  })
}

for (const xport of ['tcp', 'shm'] as const) {
  test(`target SIGSTOPped (a hung peer) over ${xport}: initiator exits 1 within peerTimeoutMs + 2 s`, async (t) => {
    t.timeout(180_000)
    const peerTimeoutMs = 1500
    const target = await startTarget()
    const w = startWriter(target.segment, xport, [`--peer_timeout_ms=${peerTimeoutMs}`])
    t.true(await waitForTable(w), `initiator did not start: ${w.err()}`)
    await delay(1500)
    process.kill(target.proc.pid!, 'SIGSTOP')
    const stoppedAt = Date.now()
    try {
      const r = await Promise.race([w.done, delay(15_000).then(() => undefined)])
      t.truthy(r, 'initiator did not exit within 15 s of the stop')
      if (!r) return
      const all = r.stdout + r.stderr
      t.log(`exit ${r.code} after ${r.exitedAt - stoppedAt} ms; stderr: ${r.stderr.trim()}`)
      t.is(r.code, 1, all)
      t.is(r.signal, null)
      t.true(r.exitedAt - stoppedAt <= peerTimeoutMs + 2000, `exited ${r.exitedAt - stoppedAt} ms after SIGSTOP`)
      t.regex(r.stderr, /^tebench: FAILED \(ERR_FERRY_PEER_LOST\)/m)
      t.notRegex(all, /panicked|terminate|Aborted/)
    } finally {
      process.kill(target.proc.pid!, 'SIGCONT')
    }
  })
}

test('Ctrl-C: the first stops cleanly with partial results and exit 130', async (t) => {
  t.timeout(180_000)
  const init = spawnNode(TEBENCH, {}, ['--local', '--op_type=write', '--xport_type=tcp', '--total_buffer_size=64M', '--start_block_size=65536', '--max_block_size=65536', '--duration=20'])
  const w = watch(init)
  t.true(await waitForTable(w), `did not start: ${w.err()}`)
  await delay(2000) // past the 1 s warm-up: measured results exist
  process.kill(init.pid!, 'SIGINT')
  const interruptedAt = Date.now()
  const r = await Promise.race([w.done, delay(15_000).then(() => undefined)])
  t.truthy(r, 'tebench did not exit within 15 s of Ctrl-C')
  if (!r) return
  t.log(`exit ${r.code} after ${r.exitedAt - interruptedAt} ms`)
  t.is(r.code, 130, r.stdout + r.stderr)
  t.regex(r.stdout, /^ +65536 \|/m, 'the partial row is printed')
  t.notRegex(r.stdout + r.stderr, /panicked|terminate|Aborted/)
})

test('a comma list of targets: workers spread over them, data verified, and a dead second target names itself', async (t) => {
  t.timeout(210_000)
  const a = await startTarget()
  const b = await startTarget()
  const common = [
    `--target_seg_name=${a.segment},${b.segment}`,
    '--start_num_threads=2',
    '--max_num_threads=2',
    '--start_block_size=1048576',
    '--max_block_size=1048576',
    '--total_buffer_size=64M',
    '--xport_type=tcp',
  ]
  // 1. mix + check_consistency: worker 0 uses a, worker 1 uses b; every stripe reads back.
  const mix = runTebench([...common, '--op_type=mix', '--check_consistency', '--duration=1'])
  const m = await Promise.race([mix.done, delay(60_000).then(() => undefined)])
  t.truthy(m, 'mix run did not finish')
  if (!m) return
  t.is(m.code, 0, m.stdout + m.stderr)
  // 2. killing only the second target fails the run with its name: worker 1 was using it.
  const run = spawnNode(TEBENCH, {}, [...common, '--op_type=write', '--duration=10'])
  const w = watch(run)
  await waitForTable(w)
  await delay(1500)
  process.kill(b.proc.pid!, 'SIGKILL')
  const r = await Promise.race([w.done, delay(15_000).then(() => undefined)])
  t.truthy(r, 'initiator did not exit after the second target died')
  if (!r) return
  t.is(r.code, 1, r.stdout + r.stderr)
  t.true(r.stderr.includes(`to ${b.segment}`), r.stderr)
})

test('--total_buffer_size=8G runs: regions beyond 4 GiB, lazily touched', async (t) => {
  t.timeout(240_000)
  const r = await runTebench([
    '--local',
    '--op_type=mix',
    '--total_buffer_size=8G',
    '--duration=1',
    '--start_block_size=1048576',
    '--max_block_size=1048576',
  ]).done
  t.is(r.code, 0, r.stderr)
  t.is((r.stdout.match(/^\s+1048576 \|/gm) ?? []).length, 2, r.stdout)
})

test('--local --op_type=mix --check_consistency exits 0', async (t) => {
  t.timeout(180_000)
  const r = await runTebench([
    '--local',
    '--op_type=mix',
    '--check_consistency',
    '--duration=1',
    '--max_block_size=1048576',
    '--start_block_size=1048576',
  ]).done
  t.is(r.code, 0, r.stderr)
  t.regex(r.stdout, /WRITE/)
  t.regex(r.stdout, /READ/)
  t.is((r.stdout.match(/^\s+1048576 \|/gm) ?? []).length, 2, r.stdout)
})

const etcdTest = testWithEtcd()
etcdTest('etcd: a target registered under --local_server_name is benchmarked by name, data verified', async (t) => {
  t.timeout(210_000)
  const etcd = await startEtcd()
  const meta = ['--metadata_type=etcd', `--metadata_url_list=${etcd.clientUrl}`]
  const target = await startTarget([...meta, '--local_server_name=bench-target'])
  try {
    t.is(target.segment, 'bench-target', 'the printed command names the logical segment')
    const run = runTebench([
      '--target_seg_name=bench-target',
      ...meta,
      '--op_type=mix',
      '--check_consistency',
      '--duration=1',
      '--start_block_size=65536',
      '--max_block_size=65536',
      '--total_buffer_size=64M',
      '--xport_type=tcp',
      '--json',
    ])
    const r = await Promise.race([run.done, delay(60_000).then(() => undefined)])
    t.truthy(r, 'initiator did not finish')
    if (!r) return
    t.is(r.code, 0, r.stdout + r.stderr)
    const rows = caseRows(r.stdout)
    t.deepEqual(
      rows.map((x) => x.op),
      ['write', 'read'],
    )
    for (const row of rows) t.true((row.ops as number) > 0, JSON.stringify(row))
    // A name nobody registered: exit 1 with the code, not a hang.
    const missing = await runTebench(['--target_seg_name=nobody', ...meta, '--duration=1']).done
    t.is(missing.code, 1, missing.stderr)
    t.regex(missing.stderr, /ERR_FERRY_UNKNOWN_SEGMENT/)
  } finally {
    if (target.proc.exitCode === null && target.proc.signalCode === null) process.kill(target.proc.pid!, 'SIGKILL')
    await Promise.race([target.done, delay(5000)])
    await etcd.stop()
  }
})
