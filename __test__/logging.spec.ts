/** The addon's logs: FERRY_LOG filters, FERRY_LOG_FORMAT=json. */
import test from 'ava'
import { spawnSync } from 'node:child_process'
import * as path from 'node:path'

/** Starts and closes an engine in a child process with `env`; its stderr. */
function engineLogs(t: { is(a: unknown, b: unknown, m?: string): void }, env: Record<string, string>): string {
  const script = "require('./index').Engine.create().then((e) => e.close())"
  const run = spawnSync(process.execPath, ['--import=tsx', '-e', script], {
    cwd: path.join(__dirname, '..'),
    env: { ...process.env, FERRY_LOG_FORMAT: '', ...env },
    encoding: 'utf8',
    timeout: 30_000,
  })
  t.is(run.status, 0, run.stderr)
  return run.stderr
}

test('FERRY_LOG_FORMAT=json writes one JSON object per line, with level, target and the event fields', (t) => {
  const stderr = engineLogs(t, { FERRY_LOG: 'debug', FERRY_LOG_FORMAT: 'json' })
  const lines = stderr.split('\n').filter((l) => l.length > 0)
  t.true(lines.length > 0)
  const records = lines.map((l) => {
    try {
      return JSON.parse(l) as Record<string, unknown>
    } catch {
      t.fail(`not JSON: ${l}`)
      return {}
    }
  })
  const started = records.find((r) => r.message === 'engine started')
  t.truthy(started, stderr)
  t.is(started!.level, 'DEBUG')
  t.regex(String(started!.target), /^ferry/)
  t.false(Number.isNaN(Date.parse(String(started!.timestamp))), 'an ISO timestamp')
})

test('FERRY_LOG filters by level, and an unknown FERRY_LOG_FORMAT is named in a warning, in text', (t) => {
  t.false(engineLogs(t, { FERRY_LOG: 'warn' }).includes('engine started'), 'debug filtered out')
  const text = engineLogs(t, { FERRY_LOG: 'debug', FERRY_LOG_FORMAT: 'yaml' })
  t.regex(text, /FERRY_LOG_FORMAT="yaml" is neither "text" nor "json"/)
  t.regex(text, /engine started/)
  t.throws(() => JSON.parse(text.split('\n')[0]))
})
