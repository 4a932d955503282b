/**
 * Finds and loads the napi-generated binding (`binding.cjs`, which loads
 * `ferry.<platform>.node` next to it or the `ferry-engine-<platform>` package). napi's own
 * failure blames an npm bug; this one names the platform, the prebuilt packages that exist
 * and what to install, and keeps napi's error (with each load error) as its `cause`.
 */
import * as fs from 'node:fs'
import * as path from 'node:path'

/**
 * The napi target triples of the package (package.json `napi.targets`), as platform names:
 * `<system>-<arch>[-<abi>]`, x86_64-unknown-linux-gnu as linux-x64-gnu.
 */
export function platformName(triple: string): string {
  const [cpu, , system, abi] = triple.split('-')
  const arch = cpu === 'x86_64' ? 'x64' : cpu === 'aarch64' ? 'arm64' : cpu
  return abi === undefined ? `${system}-${arch}` : `${system}-${arch}-${abi}`
}

/** A platform name in words: linux-x64-gnu as "Linux x64 with glibc". */
export function describePlatform(platform: string): string {
  const [system, arch, abi] = platform.split('-')
  const libc = abi === 'gnu' ? ' with glibc' : abi === 'musl' ? ' with musl' : abi === undefined ? '' : ` (${abi})`
  return `${systemName(system)} ${arch}${libc}`
}

function systemName(system: string): string {
  return system === 'linux' ? 'Linux' : system === 'darwin' ? 'macOS' : system === 'win32' ? 'Windows' : system
}

/** This machine's platform name, as the platform packages are named. */
export function hostPlatform(): string {
  if (process.platform !== 'linux') return `${process.platform}-${process.arch}`
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined
  return `linux-${process.arch}-${report?.header?.glibcVersionRuntime ? 'gnu' : 'musl'}`
}

interface Manifest {
  name?: string
  version?: string
  napi?: { targets?: string[] }
}

/** The error for a binding that did not load: what is missing here and what to install. */
export function bindingError(manifest: Manifest, host: string, cause: unknown): Error {
  const name = manifest.name ?? 'ferry-engine'
  const version = manifest.version ?? 'latest'
  const platforms = (manifest.napi?.targets ?? []).map(platformName)
  // The systems the core builds on at all (Linux: it uses memfd_create, file seals and robust
  // futex lists); on another one there is nothing to build from source either.
  const systems = [...new Set(platforms.map((p) => p.split('-')[0]))]
  const hostSystem = host.split('-')[0]
  const build = 'or build it from source (Node >= 20, a Rust toolchain and a C compiler: `npm install` in a clone of the repository)'
  const lines = platforms.includes(host)
    ? [
        `${name}: the native addon for ${host} did not load.`,
        `Install its prebuilt package: npm install ${name}-${host}@${version}`,
        `(npm installs it with ${name}, unless optional dependencies were left out: --omit=optional, or a lockfile made on another platform),`,
        build + '.',
      ]
    : [
        `${name}: unsupported platform ${host}: no prebuilt native addon for it.`,
        platforms.length > 0
          ? `Supported platforms: ${platforms.map(describePlatform).join(', ')} (prebuilt packages ${platforms.join(', ')}).`
          : 'Supported platforms: none listed (package.json has no napi.targets).',
        systems.length === 0 || systems.includes(hostSystem)
          ? `On ${host}, build it from source: Node >= 20, a Rust toolchain and a C compiler, then \`npm install\` in a clone of the repository.`
          : `${name} runs on ${systems.map(systemName).join(', ')} only: its native core does not build on ${systemName(hostSystem)}.`,
      ]
  const reasons = loadReasons(cause)
  if (reasons.length > 0) lines.push(`Load errors: ${reasons.join('; ')}`)
  return new Error(lines.join('\n'), { cause })
}

/** The messages of napi's chain of load errors (each one's `cause` is the next). */
function loadReasons(err: unknown): string[] {
  const out: string[] = []
  let e = (err as { cause?: unknown } | undefined)?.cause
  while (e instanceof Error && out.length < 8) {
    out.push(e.message.split('\n')[0])
    e = e.cause
  }
  return out
}

/** Loads `binding.cjs` from the first of `dirs` that has one (the package root). */
export function loadBinding<T>(dirs: string[]): T {
  for (const dir of dirs) {
    const file = path.join(dir, 'binding.cjs')
    if (!fs.existsSync(file)) continue
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      return require(file) as T
    } catch (err) {
      if (!(err instanceof Error) || !err.message.startsWith('Cannot find native binding')) throw err
      throw bindingError(readManifest(dir), hostPlatform(), err)
    }
  }
  throw new Error(`ferry-engine: binding.cjs not found in ${dirs.join(' or ')}; run \`npm install\` in the package`)
}

function readManifest(dir: string): Manifest {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')) as Manifest
  } catch {
    return {}
  }
}
