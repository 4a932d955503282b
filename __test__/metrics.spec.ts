/** engine.metrics(), engine.metricsText() and the scheduler-facing events. */
import test from 'ava'
import { Engine, FerryError, type TransportDisabledEvent } from '../index'
import { readFileSync } from 'node:fs'
import * as path from 'node:path'
import { delay, killAll, startTarget } from './helpers'

test.after.always(killAll)

const MiB = 1 << 20

test('metrics count bytes by transport and op, and transfers by final status', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(8 * MiB) })
  t.teardown(() => target.kill())
  const engine = await Engine.create({ transports: ['tcp'] })
  t.teardown(() => engine.close())
  const local = engine.allocate(8 * MiB)
  const seg = await engine.openSegment(target.segment)
  const before = engine.metrics()
  t.is(before.segmentsOpen, 1)
  t.is(before.regions, 1)
  t.is(before.inflight, 0)
  await engine.transfer(
    [0, 1, 2].map((i) => ({ opcode: 'write' as const, local, localOffset: i * MiB, remote: seg, remoteBuffer: target.buffer, remoteOffset: i * MiB, length: MiB })),
  )
  await engine.read({ local, remote: seg, remoteBuffer: target.buffer, length: 4096 })
  await engine.read({ local, remote: seg, remoteBuffer: target.buffer, length: 4096 })
  const ac = new AbortController()
  ac.abort()
  await t.throwsAsync(() => engine.read({ local, remote: seg, remoteBuffer: target.buffer, length: 4096, signal: ac.signal }))
  const m = engine.metrics()
  const bytes = (transport: string, op: string) => m.bytes.find((b) => b.transport === transport && b.op === op)?.bytes
  t.is(bytes('tcp', 'write'), 3 * MiB)
  t.is(bytes('tcp', 'read'), 8192)
  t.is(bytes('shm', 'write'), 0)
  t.is(m.bytes.length, 6, 'every transport and op, zeros included')
  t.deepEqual(m.transfers, { completed: 5, failed: 0, timeout: 0, canceled: 0, invalid: 0 })
  t.is(m.tasksSubmitted, 5)
  t.is(m.inflight, 0)
  t.is(m.failovers, 0)
  t.is(m.peersLost, 0)

  const text = engine.metricsText()
  t.true(text.includes('ferry_bytes_total{transport="tcp",op="write"} 3145728\n'), text)
  t.true(text.includes('ferry_bytes_total{transport="tcp",op="read"} 8192\n'))
  t.true(text.includes('ferry_transfers_total{status="completed"} 5\n'))
  t.true(text.includes('ferry_inflight_transfers 0\n'))
  t.true(text.includes('ferry_segments_open 1\n'))
})

test('failed transfers, the rail monitor pausing a path: transportDisabled with segment and untilMs, counted', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  t.teardown(() => target.kill())
  const engine = await Engine.create({ transports: ['tcp'], maxFailoverAttempts: 0, faults: [{ transport: 'tcp', submitFailureRate: 1, seed: 1 }] })
  t.teardown(() => engine.close())
  const disabled: TransportDisabledEvent[] = []
  engine.on('transportDisabled', (e) => disabled.push(e))
  const local = engine.allocate(MiB)
  const seg = await engine.openSegment(target.segment)
  for (let i = 0; i < 3; i++) {
    const err = await t.throwsAsync<FerryError>(() => engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4096 }))
    t.is(err!.transport, 'tcp')
  }
  const until = Date.now() + 5000
  while (disabled.length === 0 && Date.now() < until) await delay(10)
  t.is(disabled.length, 1, 'the third error within 10 s pauses (peer, tcp)')
  const e = disabled[0]
  t.is(e.kind, 'transportDisabled')
  t.is(e.transport, 'tcp')
  t.is(e.segment, seg.name)
  t.true(typeof e.reason === 'string' && e.reason.length > 0)
  t.true(e.untilMs! > Date.now() + 25_000 && e.untilMs! < Date.now() + 31_000, `untilMs ${e.untilMs! - Date.now()} ms ahead`)
  const m = engine.metrics()
  t.is(m.transfers.failed, 3)
  t.is(m.transfers.completed, 0)
  t.is(m.transportsDisabled, 1)
  t.true(engine.metricsText().includes('ferry_transfers_total{status="failed"} 3\n'))
})

test('a transport that fails to install is reported to a handler attached after create(), even later', async (t) => {
  const engine = await Engine.create({ transports: ['shm', 'tcp'], faults: [{ transport: 'shm', failInstall: true }] })
  t.teardown(() => engine.close())
  await delay(50) // the event has long reached the JS side; nobody listened yet
  const seen = await new Promise<TransportDisabledEvent>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no transportDisabled event')), 2000)
    engine.once('transportDisabled', (e) => {
      clearTimeout(timer)
      resolve(e)
    })
  })
  t.is(seen.transport, 'shm')
  t.is(seen.segment, undefined)
  t.is(seen.untilMs, undefined)
  t.regex(seen.reason, /install/)

  const direct = await Engine.create({ transports: ['shm', 'tcp'], faults: [{ transport: 'shm', failInstall: true }] })
  t.teardown(() => direct.close())
  const got: TransportDisabledEvent[] = []
  direct.on('transportDisabled', (e) => got.push(e))
  await delay(100)
  t.is(got.length, 1, 'delivered once to a handler attached right after create()')
})

/** A parser-level check of the text exposition format (0.0.4). */
function checkExposition(text: string): string[] {
  const problems: string[] = []
  const help = new Set<string>()
  const type = new Map<string, string>()
  const sampled = new Set<string>()
  const name = '[a-zA-Z_:][a-zA-Z0-9_:]*'
  const label = '[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\[\\\\"n])*"'
  const sample = new RegExp(`^(${name})(\\{(?:${label})(?:,${label})*\\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)( -?[0-9]+)?$`)
  if (!text.endsWith('\n')) problems.push('does not end with a newline')
  for (const line of text.split('\n').slice(0, -1)) {
    let m: RegExpMatchArray | null
    if ((m = line.match(new RegExp(`^# HELP (${name}) .+$`)))) {
      if (help.has(m[1])) problems.push(`second HELP for ${m[1]}`)
      if (sampled.has(m[1])) problems.push(`HELP after samples of ${m[1]}`)
      help.add(m[1])
    } else if ((m = line.match(new RegExp(`^# TYPE (${name}) (counter|gauge|histogram|summary|untyped)$`)))) {
      if (type.has(m[1])) problems.push(`second TYPE for ${m[1]}`)
      if (sampled.has(m[1])) problems.push(`TYPE after samples of ${m[1]}`)
      type.set(m[1], m[2])
      if (m[2] === 'counter' && !m[1].endsWith('_total')) problems.push(`counter ${m[1]} does not end in _total`)
    } else if ((m = line.match(sample))) {
      // A histogram's samples are its name with _bucket (labelled le), _sum and _count.
      const base = m[1].replace(/_(bucket|sum|count)$/, '')
      const family = base !== m[1] && type.get(base) === 'histogram' ? base : m[1]
      if (!help.has(family) || !type.has(family)) problems.push(`sample of ${m[1]} before its HELP/TYPE`)
      if (m[1] === `${family}_bucket` && !/[{,]le="[^"]+"}$/.test(m[2] ?? '')) problems.push(`bucket without le: ${line}`)
      sampled.add(family)
    } else {
      problems.push(`bad line: ${JSON.stringify(line)}`)
    }
  }
  return problems
}

test('metricsText is valid Prometheus text exposition, with every documented family', async (t) => {
  const engine = await Engine.create()
  t.teardown(() => engine.close())
  const text = engine.metricsText()
  t.deepEqual(checkExposition(text), [])
  for (const family of [
    'ferry_bytes_total',
    'ferry_transfers_total',
    'ferry_transfers_submitted_total',
    'ferry_inflight_transfers',
    'ferry_failovers_total',
    'ferry_attempt_timeouts_total',
    'ferry_peer_losses_total',
    'ferry_peer_recoveries_total',
    'ferry_transports_disabled_total',
    'ferry_segments_open',
    'ferry_regions',
    'ferry_build_info',
    'ferry_transfer_duration_seconds',
    'ferry_peer_transfers_total',
    'ferry_peer_transfer_failures_total',
    'ferry_peer_bytes_total',
  ]) {
    t.true(text.includes(`# TYPE ${family} `), family)
  }
  // The checker itself rejects what it should.
  t.true(checkExposition('ferry_x 1\n').length > 0)
  t.true(checkExposition('# HELP ferry_y y\n# TYPE ferry_y counter\nferry_y 1\n').length > 0)
  t.true(checkExposition('# HELP ferry_z_total z\n# TYPE ferry_z_total counter\nferry_z_total{a=b} 1\n').length > 0)
  t.true(checkExposition('# HELP ferry_h_seconds h\n# TYPE ferry_h_seconds histogram\nferry_h_seconds_bucket 1\n').length > 0)
  t.true(checkExposition('# HELP ferry_c_total c\n# TYPE ferry_c_total counter\nferry_c_total_sum 1\n').length > 0)
  await engine.close()
  t.deepEqual(checkExposition(engine.metricsText()), [], 'the final counters stay readable after close')
})

/** The samples of `name` in `text`: their labels, parsed, and their value. */
function samplesOf(text: string, name: string): { labels: Record<string, string>; value: number }[] {
  const out: { labels: Record<string, string>; value: number }[] = []
  for (const line of text.split('\n')) {
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/)
    if (!m || m[1] !== name) continue
    const labels: Record<string, string> = {}
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c))
    out.push({ labels, value: m[3] === '+Inf' ? Infinity : Number(m[3]) })
  }
  return out
}

test('metricsText: latency histograms by transport and op, per-peer series, ferry_build_info', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(MiB) })
  t.teardown(() => target.kill())
  const engine = await Engine.create({ transports: ['tcp'] })
  t.teardown(() => engine.close())
  const local = engine.allocate(MiB)
  const seg = await engine.openSegment(target.segment)
  for (let i = 0; i < 3; i++) await engine.write({ local, remote: seg, remoteBuffer: target.buffer, length: 4096 })
  await engine.read({ local, remote: seg, remoteBuffer: target.buffer, length: 8192 })
  const text = engine.metricsText()
  t.deepEqual(checkExposition(text), [])
  t.true(text.includes('# TYPE ferry_transfer_duration_seconds histogram\n'))

  const name = 'ferry_transfer_duration_seconds'
  const series = (transport: string, op: string) => (s: { labels: Record<string, string> }) => s.labels.transport === transport && s.labels.op === op
  const buckets = samplesOf(text, `${name}_bucket`).filter(series('tcp', 'write'))
  t.true(buckets.length > 10, `${buckets.length} buckets`)
  const bounds = buckets.map((b) => (b.labels.le === '+Inf' ? Infinity : Number(b.labels.le)))
  t.true(bounds.every((b, i) => i === 0 || b > bounds[i - 1]), 'le ascending')
  t.is(bounds.at(-1), Infinity, 'the last bucket is +Inf')
  t.true(bounds[0] <= 1e-6, `the first bound (${bounds[0]} s) tells sub-microsecond ops apart`)
  t.true(
    buckets.every((b, i) => i === 0 || b.value >= buckets[i - 1].value),
    'cumulative',
  )
  t.is(buckets.at(-1)!.value, 3)
  t.is(samplesOf(text, `${name}_count`).find(series('tcp', 'write'))!.value, 3)
  const sum = samplesOf(text, `${name}_sum`).find(series('tcp', 'write'))!.value
  t.true(sum > 0 && sum < 30, `sum ${sum} s`)
  t.is(samplesOf(text, `${name}_count`).find(series('tcp', 'read'))!.value, 1)
  t.is(samplesOf(text, `${name}_count`).find(series('shm', 'write'))!.value, 0, 'every transport and op, zeros too')

  const peer = (family: string) => samplesOf(text, family).find((s) => s.labels.peer === seg.name)?.value
  t.is(peer('ferry_peer_transfers_total'), 4)
  t.is(peer('ferry_peer_transfer_failures_total'), 0)
  t.is(peer('ferry_peer_bytes_total'), 3 * 4096 + 8192)
  t.is(samplesOf(text, 'ferry_peer_transfers_total').find((s) => s.labels.peer === 'other')?.value, 0)

  const info = samplesOf(text, 'ferry_build_info')
  t.is(info.length, 1)
  const pkg = JSON.parse(readFileSync(path.join(__dirname, '..', 'package.json'), 'utf8')) as { version: string }
  t.is(info[0].labels.version, pkg.version)
  t.is(info[0].labels.node, process.versions.node)
  t.regex(info[0].labels.rustc, /^\d+\.\d+\.\d+/)
  t.true(typeof info[0].labels.commit === 'string' && info[0].labels.commit.length > 0)
  t.is(info[0].value, 1)
})
