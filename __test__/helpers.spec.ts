/** The test helpers' own guarantees, where the tests rely on them. */
import test from 'ava'
import { spawn } from 'node:child_process'
import { ended } from './helpers'

test('ended resolves once the output was read to its end, not when the process exited', async (t) => {
  t.timeout(30_000)
  // The child exits at once; a grandchild holding its stderr writes 300 ms later. A
  // check made at the exit (or 50 ms after it) misses that line every time.
  const script = `
    const { spawn } = require('node:child_process')
    spawn(process.execPath, ['-e', 'setTimeout(() => process.stderr.write("last line\\\\n"), 300)'], { stdio: ['ignore', 'ignore', 'inherit'] }).unref()
    process.stderr.write('first line\\n')
    process.exitCode = 2`
  const proc = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
  let stderr = ''
  proc.stderr.on('data', (d) => (stderr += d))
  let atExit = ''
  proc.once('exit', () => (atExit = stderr))
  const { code } = await ended(proc)
  t.is(code, 2)
  t.false(atExit.includes('last line'), 'the exit came before the last line')
  t.is(stderr, 'first line\nlast line\n')
})
