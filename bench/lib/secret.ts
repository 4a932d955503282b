/**
 * A throwaway cluster secret for a suite: random text, and a 0600 file holding it for target
 * processes (FERRY_AUTH_SECRET_FILE). Engines listening beyond loopback refuse to start
 * without one, so every suite that puts a target in a network namespace needs it.
 */
import * as crypto from 'node:crypto'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'

export interface ClusterSecret {
  /** The secret, for an engine's `authSecret`. */
  secret: string
  /** A file holding it, for `FERRY_AUTH_SECRET_FILE`. */
  file: string
  /** Removes the file and its folder. */
  remove(): void
}

/** Makes a secret and its file under a fresh folder of the OS temp dir named `ferry-perf-NAME-`. */
export function clusterSecret(name: string): ClusterSecret {
  // Text, so the file and the option hold the same bytes (the file's last newline is not part of it).
  const secret = crypto.randomBytes(32).toString('hex')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `ferry-perf-${name}-`))
  const file = path.join(dir, 'secret')
  fs.writeFileSync(file, `${secret}\n`, { mode: 0o600 })
  return { secret, file, remove: () => fs.rmSync(dir, { recursive: true, force: true }) }
}
