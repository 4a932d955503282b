/** examples/scheduler.ts end to end: it kills one of its workers and must recover. */
import test from 'ava'
import * as path from 'node:path'
import { ended, killAll, spawnNode } from './helpers'

test.after.always(killAll)

test('the scheduler example re-places a killed worker\'s blocks, verifies them and exits 0', async (t) => {
  t.timeout(90_000)
  const proc = spawnNode(path.join(__dirname, '..', 'examples', 'scheduler.ts'))
  let out = ''
  let err = ''
  proc.stdout!.on('data', (d) => (out += d))
  proc.stderr!.on('data', (d) => (err += d))
  const code = await new Promise<number | string>((resolve) => {
    const timer = setTimeout(() => {
      process.kill(proc.pid!, 'SIGKILL')
      resolve('timeout')
    }, 60_000)
    // Once its output was read to the end: the summary is its last line.
    void ended(proc).then(({ code: c, signal: s }) => {
      clearTimeout(timer)
      resolve(c ?? String(s))
    })
  })
  t.is(code, 0, `exit ${code}\n${out}\n${err}`)
  const line = out.split('\n').find((l) => l.startsWith('summary '))
  t.truthy(line, out)
  const summary = JSON.parse(line!.slice('summary '.length))
  t.is(summary.blocks, 8)
  t.is(summary.verified, 8)
  t.is(summary.lost, 'worker-1')
  t.is(summary.survivor, 'worker-0')
  t.true(summary.replaced > 0)
  t.deepEqual([...summary.placement['worker-0']].sort(), [0, 1, 2, 3, 4, 5, 6, 7])
  t.deepEqual(summary.placement['worker-1'], [])
  t.true(summary.lost_after_ms < 2000, `peerLost ${summary.lost_after_ms} ms after the kill`)
  t.is(summary.transfers.failed, 0)
})
