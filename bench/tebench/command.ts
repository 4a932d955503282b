/**
 * The command line a target prints for its initiators, copy-pasteable as it is.
 *
 * How tebench is reached depends on where it runs from (`whereFrom`):
 * - installed in the project of the current folder (a `node_modules/.bin/tebench` here or
 *   above): `npx tebench`, which runs that install;
 * - installed elsewhere (globally, in npx's cache): `npx -p ferry-engine@VERSION tebench`.
 *   A bare `npx tebench` there would fetch an unrelated package named `tebench`; the
 *   version is pinned so that the initiator runs what the target runs;
 * - a source checkout (not under node_modules): `npm run tebench --`, with `--prefix` when
 *   the current folder is not the checkout's root.
 * Arguments are quoted for a POSIX shell where they need it.
 */
import { existsSync } from 'node:fs'
import * as path from 'node:path'

export type Where = { kind: 'project' } | { kind: 'elsewhere' } | { kind: 'checkout'; root: string; inRoot: boolean }

/** Quotes `arg` for a POSIX shell when it holds anything but plain characters. */
export function shellQuote(arg: string): string {
  if (arg !== '' && /^[A-Za-z0-9_./:=,@%+-]+$/.test(arg)) return arg
  return `'${arg.replace(/'/g, `'\\''`)}'`
}

/** The words that start tebench from `where`; `version` pins the package. */
export function commandPrefix(where: Where, version: string): string[] {
  switch (where.kind) {
    case 'project':
      return ['npx', 'tebench']
    case 'elsewhere':
      return ['npx', '-p', version === 'unknown' ? 'ferry-engine' : `ferry-engine@${version}`, 'tebench']
    case 'checkout':
      return where.inRoot ? ['npm', 'run', 'tebench', '--'] : ['npm', '--prefix', where.root, 'run', 'tebench', '--']
  }
}

/** The whole command: the prefix, then the flags, each quoted where needed. */
export function initiatorCommand(where: Where, version: string, flags: string[]): string {
  return [...commandPrefix(where, version), ...flags].map(shellQuote).join(' ')
}

/**
 * Where this tebench runs from: `script` is its entry, `root` its package's folder, `cwd`
 * the current folder.
 */
export function whereFrom(script: string, root: string | undefined, cwd: string): Where {
  const installed = script.split(path.sep).includes('node_modules')
  if (!installed && root) return { kind: 'checkout', root, inRoot: path.resolve(cwd) === path.resolve(root) }
  for (let dir = path.resolve(cwd); ; dir = path.dirname(dir)) {
    if (existsSync(path.join(dir, 'node_modules', '.bin', 'tebench')) && existsSync(path.join(dir, 'node_modules', 'ferry-engine'))) {
      return { kind: 'project' }
    }
    if (path.dirname(dir) === dir) return { kind: 'elsewhere' }
  }
}
