/** engine.metrics(), engine.metricsText() and the scheduler-facing events. */
import test from 'ava'
import { Engine, FerryError, type TransportDisabledEvent } from '../index'
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
      if (!help.has(m[1]) || !type.has(m[1])) problems.push(`sample of ${m[1]} before its HELP/TYPE`)
      sampled.add(m[1])
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
  ]) {
    t.true(text.includes(`# TYPE ${family} `), family)
  }
  // The checker itself rejects what it should.
  t.true(checkExposition('ferry_x 1\n').length > 0)
  t.true(checkExposition('# HELP ferry_y y\n# TYPE ferry_y counter\nferry_y 1\n').length > 0)
  t.true(checkExposition('# HELP ferry_z_total z\n# TYPE ferry_z_total counter\nferry_z_total{a=b} 1\n').length > 0)
  await engine.close()
  t.deepEqual(checkExposition(engine.metricsText()), [], 'the final counters stay readable after close')
})
