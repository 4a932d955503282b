/**
 * What a tebench run reports: its header and columns (parsed from --format=csv), the
 * figures' order, the warm-up left out of every figure, the formats and --version, the
 * summary, the initiator command a target prints, and the progress line.
 */
import test from 'ava'
import { spawn, type ChildProcess } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { pathToFileURL } from 'node:url'
import { commandPrefix, initiatorCommand, shellQuote, whereFrom } from '../bench/tebench/command'
import { csvCell } from '../bench/tebench/output'
import { Progress, progressText } from '../bench/tebench/progress'
import { summarize, summaryText } from '../bench/tebench/summary'
import { ended, killAll, spawnNode } from './helpers'

const ROOT = path.join(__dirname, '..')
const TEBENCH = path.join(ROOT, 'bench', 'tebench.ts')
const VERSION = (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version
/** One quick case: shm 4 KiB writes, short. */
const QUICK = ['--local', '--xport_type=shm', '--op_type=write', '--start_block_size=4096', '--max_block_size=4096', '--total_buffer_size=16M', '--duration=0.3']

interface Finished {
  code: number | null
  stdout: string
  stderr: string
}

test.after.always(killAll)

/** Runs `proc` to its end, bounded by `limitMs` (killed by pid past it). */
function finish(proc: ChildProcess, limitMs = 90_000): Promise<Finished> {
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

const run = (args: string[], env: Record<string, string> = {}) => finish(spawnNode(TEBENCH, env, args))

/** A CSV line's cells (RFC 4180 quoting). */
function csvCells(line: string): string[] {
  const cells: string[] = []
  let cell = ''
  let quoted = false
  for (let i = 0; i < line.length; i++) {
    const c = line[i]
    if (quoted) {
      if (c === '"' && line[i + 1] === '"') (cell += '"'), i++
      else if (c === '"') quoted = false
      else cell += c
    } else if (c === '"') quoted = true
    else if (c === ',') cells.push(cell), (cell = '')
    else cell += c
  }
  cells.push(cell)
  return cells
}

/** --format=csv's stdout: the `# KEY: VALUE` lines, the column names and the rows. */
function parseCsv(stdout: string) {
  const notes = new Map<string, string>()
  const data: string[][] = []
  for (const line of stdout.split('\n')) {
    if (line === '') continue
    const m = /^# ([^:]+): (.*)$/.exec(line)
    if (m) notes.set(m[1], m[2])
    else if (line.startsWith('#')) throw new Error(`a comment line that is no KEY: VALUE: ${line}`)
    else data.push(csvCells(line))
  }
  const [columns, ...rows] = data
  return { notes, columns, rows: rows.map((r) => Object.fromEntries(columns.map((c, i) => [c, r[i]]))) }
}

test('--format=csv: the header block and the columns parse; every row keeps min <= p50 <= p99 <= p999 <= max and Avg within min..max', async (t) => {
  t.timeout(120_000)
  const args = [...QUICK, '--max_block_size=16384', '--format=csv']
  const r = await run(args)
  t.is(r.code, 0, r.stderr)
  const { notes, columns, rows } = parseCsv(r.stdout)
  t.is(notes.get('version'), `ferry-engine ${VERSION} (commit ${notes.get('version')!.split('commit ')[1]}`)
  t.regex(notes.get('version')!, /\(commit ([0-9a-f]{7,40}|unknown)\)$/)
  t.is(notes.get('node'), process.version)
  t.is(notes.get('host'), `${os.hostname()}, ${os.availableParallelism()} core${os.availableParallelism() === 1 ? '' : 's'}`)
  t.is(notes.get('role'), 'initiator')
  t.is(notes.get('transport'), 'requested shm')
  t.is(notes.get('addressing'), 'fixed')
  t.is(notes.get('flags'), args.join(' '))
  t.regex(notes.get('initiator engine') ?? '', /^\d+ I\/O threads?, shm \d+ copy threads?$/)
  t.regex(notes.get('target engine') ?? '', /^\d+ I\/O threads?, tcp \d+ lanes? per peer, shm \d+ copy threads?$/)
  t.regex(notes.get('summary') ?? '', /^3 cases, \d+ ops, [\d.]+ GB in [\d.]+ s measured, served shm \(100 %\), 0 failovers, best BW [\d.]+ GB\/s \(write \d+ B × 1, 1 thread\)$/)
  t.deepEqual(columns, [
    'op', 'threads', 'blockSize', 'batchSize', 'ops', 'bwGbps', 'avgInstGbps', 'avgLatUs', 'avgTxUs',
    'minTxUs', 'p50TxUs', 'p99TxUs', 'p999TxUs', 'maxTxUs', 'transport', 'requested', 'addressing', 'failovers', 'partial',
  ])
  t.deepEqual(rows.map((x) => Number(x.blockSize)), [4096, 8192, 16384])
  for (const row of rows) {
    const n = (k: string) => Number(row[k])
    t.is(row.op, 'write')
    t.is(row.transport, 'shm')
    t.is(row.partial, 'false')
    t.true(n('ops') > 0 && n('bwGbps') > 0, JSON.stringify(row))
    const [min, p50, p99, p999, max, avg] = ['minTxUs', 'p50TxUs', 'p99TxUs', 'p999TxUs', 'maxTxUs', 'avgTxUs'].map(n)
    t.true(min > 0 && min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max, JSON.stringify(row))
    t.true(min <= avg && avg <= max, JSON.stringify(row))
  }
  t.notRegex(r.stderr, /\x1b\[K/, 'no progress line when stderr is a pipe')
})

test('the warm-up is left out of every figure: served bytes and notifications are the measured operations\' own', async (t) => {
  t.timeout(120_000)
  // A warm-up as long as the measured time: counted in, it would double the bytes.
  const r = await run([...QUICK, '--notifi', '--json'], { FERRY_TEBENCH_WARMUP_MS: '300' })
  t.is(r.code, 0, r.stderr)
  const records = r.stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>)
  const rows = records.filter((x) => x.record === 'case')
  t.is(rows.length, 1)
  const row = rows[0] as { ops: number; blockSize: number; batchSize: number; served: Array<{ transport: string; bytes: number }> }
  t.deepEqual(row.served.map((s) => [s.transport, s.bytes]), [['shm', row.ops * row.blockSize * row.batchSize]], JSON.stringify(row))
  const sent = records.find((x) => x.record === 'notifications' && x.role === 'initiator') as { count: number }
  t.is(sent.count, row.ops, 'one notification per measured submission, none of the warm-up')
  const summary = records.find((x) => x.record === 'summary') as { bytes: number; ops: number }
  t.is(summary.ops, row.ops)
  t.is(summary.bytes, row.ops * row.blockSize)
})

test('--json is --format=json: a header record first, the case, a summary last; table and mooncake keep their layouts', async (t) => {
  t.timeout(120_000)
  for (const flag of ['--json', '--format=json']) {
    const r = await run([...QUICK, flag])
    t.is(r.code, 0, r.stderr)
    const records = r.stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>)
    t.is(records[0].record, 'header', flag)
    t.like(records[0], { tool: 'tebench', package: 'ferry-engine', version: VERSION, node: process.version, role: 'initiator', requested: 'shm', addressing: 'fixed' })
    t.deepEqual(records[0].flags, [...QUICK, flag])
    t.is(records.at(-1)!.record, 'summary', flag)
    const row = records.find((x) => x.record === 'case')!
    for (const k of ['minTxUs', 'p50TxUs', 'p99TxUs', 'p999TxUs', 'maxTxUs', 'avgTxUs']) t.is(typeof row[k], 'number', k)
  }
  const table = await run(QUICK)
  t.is(table.code, 0, table.stderr)
  t.regex(table.stdout, /^tebench: version: ferry-engine \S+ \(commit \S+\)$/m)
  t.regex(table.stdout, /^ *BlkSize \(B\) \| .*\| Avg Tx \(us\) \| P50 Tx \(us\) \| P99 Tx \(us\) \| P999 Tx \(us\) \| Max Tx \(us\)$/m)
  t.regex(table.stdout, /^tebench: summary: 1 case, \d+ ops, /m)
  t.true(table.stdout.indexOf('tebench: version:') < table.stdout.indexOf('WRITE, 1 thread'), 'the header comes first')
  // Mooncake's layout: its stdout is its table alone; header and summary on stderr.
  const mc = await run([...QUICK, '--format=mooncake'])
  t.is(mc.code, 0, mc.stderr)
  t.is(mc.stdout.split('\n').length, 4, mc.stdout)
  t.regex(mc.stderr, /^tebench: version: /m)
  t.regex(mc.stderr, /^tebench: summary: /m)
})

test('--version prints the version, commit and Node, exit 0; a bad --format is a usage error', async (t) => {
  t.timeout(60_000)
  const r = await run(['--version'])
  t.is(r.code, 0, r.stderr)
  t.regex(r.stdout, new RegExp(`^tebench \\(ferry-engine\\) ${VERSION.replace(/\./g, '\\.')}, commit ([0-9a-f]{7,40}|unknown), Node ${process.version}\\n$`))
  const bad = await run(['--format=xml'])
  t.is(bad.code, 2)
  t.regex(bad.stderr, /--format/)
})

test('the initiator command: npx tebench where installed, npx -p ferry-engine@VERSION elsewhere, npm run in a checkout; quoted', (t) => {
  t.deepEqual(commandPrefix({ kind: 'project' }, '1.2.3'), ['npx', 'tebench'])
  t.deepEqual(commandPrefix({ kind: 'elsewhere' }, '1.2.3'), ['npx', '-p', 'ferry-engine@1.2.3', 'tebench'])
  t.deepEqual(commandPrefix({ kind: 'elsewhere' }, 'unknown'), ['npx', '-p', 'ferry-engine', 'tebench'])
  t.deepEqual(commandPrefix({ kind: 'checkout', root: '/src/ferry', inRoot: true }, '1.2.3'), ['npm', 'run', 'tebench', '--'])
  t.deepEqual(commandPrefix({ kind: 'checkout', root: '/src/ferry', inRoot: false }, '1.2.3'), ['npm', '--prefix', '/src/ferry', 'run', 'tebench', '--'])
  t.is(shellQuote('--auth_secret_file=/a b/it\'s'), `'--auth_secret_file=/a b/it'\\''s'`)
  t.is(shellQuote('--target_seg_name=10.0.0.1:5000'), '--target_seg_name=10.0.0.1:5000')
  t.is(
    initiatorCommand({ kind: 'elsewhere' }, '0.1.0', ['--target_seg_name=[::1]:7000']),
    "npx -p ferry-engine@0.1.0 tebench '--target_seg_name=[::1]:7000'",
  )
  // Where it runs from: a project with the package installed, a folder without, a checkout.
  const project = fs.mkdtempSync(path.join(os.tmpdir(), 'tebench-where-'))
  t.teardown(() => fs.rmSync(project, { recursive: true, force: true }))
  const installed = path.join(project, 'node_modules', 'ferry-engine', 'dist', 'bench', 'tebench.js')
  t.deepEqual(whereFrom(installed, path.dirname(installed), path.join(project, 'sub')), { kind: 'elsewhere' })
  fs.mkdirSync(path.join(project, 'node_modules', '.bin'), { recursive: true })
  fs.mkdirSync(path.join(project, 'node_modules', 'ferry-engine'), { recursive: true })
  fs.writeFileSync(path.join(project, 'node_modules', '.bin', 'tebench'), '')
  t.deepEqual(whereFrom(installed, path.dirname(installed), path.join(project, 'sub')), { kind: 'project' })
  t.deepEqual(whereFrom(installed, path.dirname(installed), os.tmpdir()), { kind: 'elsewhere' })
  t.deepEqual(whereFrom(TEBENCH, ROOT, ROOT), { kind: 'checkout', root: ROOT, inRoot: true })
})

test('a target started from a checkout prints a command that runs from here: npm run tebench --, never a bare npx tebench', async (t) => {
  t.timeout(60_000)
  const cwd = os.tmpdir()
  // tsx by its path: --import resolves from the current folder, which is elsewhere here.
  const tsx = pathToFileURL(path.join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href
  const proc = spawn(process.execPath, [`--import=${tsx}`, TEBENCH, '--rpc_server_port=0', '--total_buffer_size=16M'], {
    cwd,
    stdio: ['pipe', 'pipe', 'pipe'],
  })
  const done = finish(proc, 45_000)
  const command = await new Promise<string>((resolve) => {
    const timer = setTimeout(() => resolve(''), 30_000)
    readline.createInterface({ input: proc.stdout! }).on('line', (line) => {
      if (!line.includes('--target_seg_name=')) return
      clearTimeout(timer)
      resolve(line)
    })
  })
  process.kill(proc.pid!, 'SIGINT')
  const r = await done
  t.regex(command, new RegExp(`^npm --prefix ${ROOT.replace(/[/.]/g, '\\$&')} run tebench -- --target_seg_name=127\\.0\\.0\\.1:\\d+ --total_buffer_size=16777216$`), r.stderr)
})

test('summary and CSV cells, pure', (t) => {
  const row = (over: Record<string, unknown>) =>
    ({
      record: 'case', op: 'write', threads: 2, blockSize: 4096, batchSize: 2, ops: 1000, bwGbps: 1, avgInstGbps: 1, avgLatUs: 2000, avgTxUs: 1,
      p99TxUs: 1, p999TxUs: 1, minTxUs: 1, p50TxUs: 1, maxTxUs: 1, transport: 'shm', requested: 'auto', addressing: 'fixed',
      served: [{ transport: 'shm', bytes: 8_192_000, percent: 100 }], failovers: 0, ...over,
    }) as never
  const s = summarize([row({}), row({ bwGbps: 3, blockSize: 8192, served: [{ transport: 'tcp', bytes: 16_384_000, percent: 100 }], failovers: 2, partial: true })])
  t.like(s, { cases: 2, partial: 1, ops: 2000, bytes: 24_576_000, measuredS: 2, served: 'tcp 67 %, shm 33 %', failovers: 2 })
  t.deepEqual(s.best, { op: 'write', blockSize: 8192, batchSize: 2, threads: 2, bwGbps: 3 })
  t.is(summaryText(s), 'summary: 2 cases (1 partial), 2000 ops, 0.025 GB in 2.0 s measured, served tcp 67 %, shm 33 %, 2 failovers, best BW 3.00 GB/s (write 8192 B × 2, 2 threads)')
  t.is(summaryText(summarize([])), 'summary: 0 cases, 0 ops, 0.000 GB in 0.0 s measured, served none, 0 failovers')
  t.is(csvCell('tcp 90 %, shm 10 %'), '"tcp 90 %, shm 10 %"')
  t.is(csvCell('say "hi"'), '"say ""hi"""')
  t.is(csvCell(1.5), '1.5')
})

test('the progress line: written in place on a terminal, counting cases and time left; nothing on a pipe', (t) => {
  const written: string[] = []
  const tty = new Progress({ isTTY: true, write: (s: string) => written.push(s) })
  tty.caseStarts(2, 10, 'write 4096 B × 1, 1 thread(s) over shm', 6)
  tty.clear()
  t.deepEqual(written, ['\r\x1b[Ktebench: [3/10] write 4096 B × 1, 1 thread(s) over shm, 48 s left', '\r\x1b[K'])
  const piped: string[] = []
  const pipe = new Progress({ isTTY: false, write: (s: string) => piped.push(s) })
  pipe.caseStarts(0, 1, 'x', 1)
  pipe.show('y')
  pipe.clear()
  t.deepEqual(piped, [])
  t.is(progressText(0, 100, 'x', 600), 'tebench: [1/100] x, 10 min left')
})

test('on a terminal the run shows its progress on stderr; stdout keeps the results', async (t) => {
  t.timeout(120_000)
  // script(1) gives the run a terminal; without it this test has nothing to check.
  if (!fs.existsSync('/usr/bin/script')) {
    t.pass('no script(1) here')
    return
  }
  const command = [process.execPath, '--import=tsx', TEBENCH, ...QUICK].map((a) => `'${a}'`).join(' ')
  const proc = spawn('/usr/bin/script', ['-qec', command, '/dev/null'], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] })
  const r = await finish(proc)
  t.is(r.code, 0, r.stdout + r.stderr)
  t.regex(r.stdout, /\r\x1b\[Ktebench: \[1\/1\] write 4096 B × 1, 1 thread\(s\) over shm, \d+ s left/)
})
