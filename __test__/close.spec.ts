import test from 'ava'
import * as path from 'node:path'
import * as readline from 'node:readline'
import { killAll, spawnNode, startTarget } from './helpers'

test.after.always(killAll)

test('close() while 1000 operations are pending: all settle, close resolves, node exits', async (t) => {
  t.timeout(60_000)
  const target = await startTarget({ FERRY_TARGET_BYTES: String(1 << 20) })
  try {
    const child = spawnNode(path.join(__dirname, 'fixtures', 'close-pending.ts'), {}, [target.segment, String(target.buffer)])
    let stderr = ''
    child.stderr?.on('data', (d) => (stderr += d))
    const lines: Record<string, unknown>[] = []
    const rl = readline.createInterface({ input: child.stdout! })
    const gotLine = () => new Promise<void>((resolve) => rl.once('line', (l) => (lines.push(JSON.parse(l)), resolve())))
    await gotLine()
    t.deepEqual(lines[0], { ready: true })
    // Freeze the target: nothing the child sends can complete from here on.
    process.kill(target.pid, 'SIGSTOP')
    const summary = gotLine()
    child.stdin!.write('go\n')
    await summary
    const exit = await Promise.race([
      new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code))),
      new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), 10_000)),
    ])
    t.is(exit, 0, `child must exit by itself with 0; stderr: ${stderr}`)
    const s = lines[1] as { resolved: number; closed: number; other: string[]; settledMs: number }
    t.is(s.resolved + s.closed + s.other.length, 1000, 'all 1000 settled')
    t.deepEqual(s.other, [])
    t.true(s.closed > 900, `most were still pending and rejected with ERR_FERRY_CLOSED (${s.closed})`)
  } finally {
    process.kill(target.pid, 'SIGCONT')
    await target.kill()
  }
})
