// The loader's failure names the platform and what to install; platform names match the
// packages under npm/ (test-pack checks the same message from an install without them).
import test from 'ava'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { bindingError, describePlatform, hostPlatform, loadBinding, platformName } from '../loader'

const root = path.join(__dirname, '..')
const manifest = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as {
  name: string
  version: string
  os: string[]
  cpu: string[]
  napi: { targets: string[] }
}

// What npm reads to decide where a package installs: os, cpu and libc, as in process.platform,
// process.arch and npm's libc names.
const libcOf: Record<string, string> = { gnu: 'glibc', musl: 'musl' }

test('every napi target has its package under npm/, named after its platform, with its os, cpu and libc', (t) => {
  for (const triple of manifest.napi.targets) {
    const platform = platformName(triple)
    const [system, arch, abi] = platform.split('-')
    const sub = JSON.parse(fs.readFileSync(path.join(root, 'npm', platform, 'package.json'), 'utf8')) as {
      name: string
      main: string
      os?: string[]
      cpu?: string[]
      libc?: string[]
    }
    t.is(sub.name, `${manifest.name}-${platform}`, triple)
    t.is(sub.main, `ferry.${platform}.node`, triple)
    t.deepEqual(sub.os, [system], triple)
    t.deepEqual(sub.cpu, [arch], triple)
    t.deepEqual(sub.libc, abi === undefined ? undefined : [libcOf[abi]], triple)
  }
  t.deepEqual(manifest.napi.targets.map(platformName).sort(), fs.readdirSync(path.join(root, 'npm')).sort())
})

test("the main package's os and cpu are exactly those of its targets (Linux x64 and arm64 only)", (t) => {
  const platforms = manifest.napi.targets.map(platformName)
  t.deepEqual(platforms, ['linux-x64-gnu', 'linux-arm64-gnu'])
  t.deepEqual([...manifest.os].sort(), [...new Set(platforms.map((p) => p.split('-')[0]))].sort())
  t.deepEqual([...manifest.cpu].sort(), [...new Set(platforms.map((p) => p.split('-')[1]))].sort())
})

test('this machine is named as its platform package is (the test machines run glibc)', (t) => {
  t.is(hostPlatform(), process.platform === 'linux' ? `linux-${process.arch}-gnu` : `${process.platform}-${process.arch}`)
})

test('a supported platform without its package: the package to install and the load errors', (t) => {
  const napiError = new Error('Cannot find native binding.', { cause: new Error("Cannot find module 'ferry-engine-linux-x64-gnu'") })
  const e = bindingError(manifest, 'linux-x64-gnu', napiError)
  t.regex(e.message, /native addon for linux-x64-gnu did not load/)
  t.true(e.message.includes(`npm install ferry-engine-linux-x64-gnu@${manifest.version}`))
  t.regex(e.message, /Load errors: Cannot find module 'ferry-engine-linux-x64-gnu'/)
  t.is(e.cause, napiError)
})

test('an unsupported Linux: the supported platforms and building from source', (t) => {
  const e = bindingError(manifest, 'linux-x64-musl', new Error('Cannot find native binding.'))
  t.regex(e.message, /unsupported platform linux-x64-musl: no prebuilt native addon/)
  t.true(e.message.includes('Supported platforms: Linux x64 with glibc, Linux arm64 with glibc (prebuilt packages linux-x64-gnu, linux-arm64-gnu).'))
  t.regex(e.message, /build it from source/)
  t.false(e.message.includes('npm install ferry-engine-'))
})

test('macOS (and any other system): unsupported, the supported platforms, and no build from source', (t) => {
  for (const host of ['darwin-arm64', 'darwin-x64', 'win32-x64']) {
    const e = bindingError(manifest, host, new Error('Cannot find native binding.'))
    t.regex(e.message, new RegExp(`unsupported platform ${host}: no prebuilt native addon`), host)
    t.true(e.message.includes('Supported platforms: Linux x64 with glibc, Linux arm64 with glibc'), host)
    t.regex(e.message, /runs on Linux only: its native core does not build on (macOS|Windows)\./, host)
    t.false(e.message.includes('build it from source'), host)
    t.false(e.message.includes('npm install ferry-engine-'), host)
  }
})

test('platform names in words', (t) => {
  t.is(describePlatform('linux-x64-gnu'), 'Linux x64 with glibc')
  t.is(describePlatform('linux-arm64-musl'), 'Linux arm64 with musl')
  t.is(describePlatform('darwin-arm64'), 'macOS arm64')
  t.is(platformName('aarch64-unknown-linux-gnu'), 'linux-arm64-gnu')
  t.is(platformName('aarch64-apple-darwin'), 'darwin-arm64')
})

test("loadBinding turns napi's failure into that error and passes other errors through", (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-loader-'))
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify(manifest))
  fs.writeFileSync(path.join(dir, 'binding.cjs'), "throw new Error('Cannot find native binding. npm has a bug')")
  const e = t.throws(() => loadBinding([path.join(dir, 'missing'), dir]))
  t.true(e?.message.includes(`${manifest.name}: `))
  t.false(e?.message.includes('npm has a bug'))
  const other = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-loader-'))
  t.teardown(() => fs.rmSync(other, { recursive: true, force: true }))
  fs.writeFileSync(path.join(other, 'binding.cjs'), "throw new Error('something else')")
  t.throws(() => loadBinding([other]), { message: 'something else' })
  t.throws(() => loadBinding([path.join(dir, 'missing')]), { message: /binding.cjs not found/ })
})
