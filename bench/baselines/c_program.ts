/**
 * The C baselines (memcpy_bench.c, tcp_rtt.c): compiled at run time into a directory the
 * caller owns, or taken prebuilt from `FERRY_PERF_BIN_DIR` when that names a directory:
 * scripts/scale-check.sh's pack carries them compiled here (`cc -static -O2`) for a machine
 * with no compiler. A missing compiler or a failed compile is a note, never an exception.
 */
import { spawnSync } from 'node:child_process'
import * as fs from 'node:fs'
import * as path from 'node:path'

/** A baseline's binary and how it was built, or a note saying why there is none. */
export type Built = { binary: string; prebuilt: boolean } | { note: string }

/** The environment variable naming a directory of prebuilt baselines. */
export const PREBUILT_DIR_ENV = 'FERRY_PERF_BIN_DIR'

/**
 * Where `name.c` is: beside this module when it runs from bench/baselines/, or in the
 * repository's bench/baselines/ when it runs compiled under dist/.
 */
function sourceOf(name: string): string {
  const beside = path.join(__dirname, `${name}.c`)
  if (fs.existsSync(beside)) return beside
  return path.join(__dirname, '..', '..', '..', 'bench', 'baselines', `${name}.c`)
}

/**
 * The binary of bench/baselines/`name`.c: `$FERRY_PERF_BIN_DIR/name` if that directory is
 * set, else compiled with `compiler flags` into `dir`.
 */
export function buildCProgram(name: string, dir: string, compiler: string, flags: string[]): Built {
  const prebuiltDir = process.env[PREBUILT_DIR_ENV]
  if (prebuiltDir) {
    const binary = path.join(prebuiltDir, name)
    try {
      fs.accessSync(binary, fs.constants.X_OK)
      return { binary, prebuilt: true }
    } catch {
      return { note: `${PREBUILT_DIR_ENV}=${prebuiltDir} has no executable ${name}` }
    }
  }
  const version = spawnSync(compiler, ['--version'], { stdio: 'ignore', timeout: 10_000 })
  if (version.error !== undefined || version.status !== 0) {
    return { note: `${compiler} not found: the baseline bench/baselines/${name}.c was not measured` }
  }
  const binary = path.join(dir, name)
  const r = spawnSync(compiler, [...flags, '-o', binary, sourceOf(name)], { encoding: 'utf8', timeout: 60_000 })
  if (r.error !== undefined || r.status !== 0) {
    const why = r.error?.message ?? `${r.stderr ?? ''}`.trim().slice(-500)
    return { note: `${compiler} ${flags.join(' ')} ${name}.c failed: ${why}` }
  }
  return { binary, prebuilt: false }
}
