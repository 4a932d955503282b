/**
 * perf's command line (bench/perf.ts): `--case` runs the named cases of the blocks suite
 * alone, and a name it does not know, or another suite, is refused before anything runs.
 */
import test from 'ava'
import * as path from 'node:path'
import { killAll, spawnNode } from './helpers'

const PERF = path.join(__dirname, '..', 'bench', 'perf.ts')

test.after.always(() => {
  killAll()
})

function runPerf(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const proc = spawnNode(PERF, {}, args)
  let stdout = ''
  let stderr = ''
  proc.stdout?.on('data', (d) => (stdout += d))
  proc.stderr?.on('data', (d) => (stderr += d))
  return new Promise((resolve) => proc.once('close', (code) => resolve({ code, stdout, stderr })))
}

test('--case: an unknown name, or a suite other than blocks, exits 2 before anything runs', async (t) => {
  t.timeout(60_000)
  const unknown = await runPerf(['--suite', 'blocks', '--case', 'tebench-shm-write-3KiB'])
  t.is(unknown.code, 2, unknown.stderr)
  t.regex(unknown.stderr, /^perf: unknown blocks case tebench-shm-write-3KiB \(known: .*tebench-shm-write-4KiB/)
  t.is(unknown.stdout, '')
  const other = await runPerf(['--suite', 'tcp', '--case', 'write-4KiB-vector'])
  t.is(other.code, 2, other.stderr)
  t.regex(other.stderr, /^perf: --case applies to the blocks suite alone/)
  t.is(other.stdout, '')
})

test('--case runs the named blocks case alone', async (t) => {
  t.timeout(120_000)
  const r = await runPerf(['--suite', 'blocks', '--case', 'tebench-shm-write-4KiB', '--repeat', '1', '--duration', '0.2', '--warmup', '0'])
  const records = r.stdout
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { case: string; transport: string; rounds: unknown[] })
  t.deepEqual(
    records.map((x) => [x.case, x.transport, x.rounds.length]),
    [['tebench-shm-write-4KiB', 'shm', 1]],
    r.stderr,
  )
})
