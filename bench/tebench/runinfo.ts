/**
 * What produced a run, for its header block and --version: the package's version and
 * commit, Node, the host and its cores, and the flags as given. Read once per run.
 *
 * The commit: `gitHead` of the installed package's package.json when npm wrote one, else
 * `git rev-parse` in a checkout of the package (bounded: 2 s), else `unknown`.
 */
import { execFileSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'

export interface RunInfo {
  /** The package's name and version (`ferry-engine`, `0.1.0`). */
  name: string
  version: string
  /** Short commit hash, or `unknown`. */
  commit: string
  node: string
  host: string
  cores: number
  /** The command line's flags, as given. */
  flags: string[]
}

/** The folder of the package this script belongs to: the first above it whose package.json is ferry-engine's. */
export function packageRoot(from = __dirname): string | undefined {
  for (let dir = from; ; dir = path.dirname(dir)) {
    const file = path.join(dir, 'package.json')
    if (existsSync(file)) {
      try {
        if ((JSON.parse(readFileSync(file, 'utf8')) as { name?: string }).name === 'ferry-engine') return dir
      } catch {
        // not a package.json we can read: keep looking
      }
    }
    if (path.dirname(dir) === dir) return undefined
  }
}

function packageJson(root: string | undefined): { name?: string; version?: string; gitHead?: string } {
  if (!root) return {}
  try {
    return JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'))
  } catch {
    return {}
  }
}

function commitOf(root: string | undefined, gitHead: string | undefined): string {
  if (gitHead) return gitHead.slice(0, 12)
  if (!root || !existsSync(path.join(root, '.git'))) return 'unknown'
  try {
    const out = execFileSync('git', ['-C', root, 'rev-parse', '--short=12', 'HEAD'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      timeout: 2000,
    })
    return out.trim() || 'unknown'
  } catch {
    return 'unknown'
  }
}

let cached: Omit<RunInfo, 'flags'> | undefined

/** This run's facts; `flags` is the command line as given. */
export function runInfo(flags: string[]): RunInfo {
  if (!cached) {
    const root = packageRoot()
    const pkg = packageJson(root)
    cached = {
      name: pkg.name ?? 'ferry-engine',
      version: pkg.version ?? 'unknown',
      commit: commitOf(root, pkg.gitHead),
      node: process.version,
      host: os.hostname(),
      cores: os.availableParallelism(),
    }
  }
  return { ...cached, flags }
}

/** The --version line: `tebench (ferry-engine) 0.1.0, commit 8d703ff1a2b3, Node v22.11.0`. */
export function versionLine(i: RunInfo): string {
  return `tebench (${i.name}) ${i.version}, commit ${i.commit}, Node ${i.node}`
}
