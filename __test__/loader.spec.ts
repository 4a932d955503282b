// The loader's failure names the platform and what to install; platform names match the
// packages under npm/ (test-pack checks the same message from an install without them).
import test from 'ava'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { bindingError, hostPlatform, loadBinding, platformName } from '../loader'

const root = path.join(__dirname, '..')
const manifest = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as {
  name: string
  version: string
  napi: { targets: string[] }
}

test('every napi target has its package under npm/, named after its platform', (t) => {
  for (const triple of manifest.napi.targets) {
    const platform = platformName(triple)
    const sub = JSON.parse(fs.readFileSync(path.join(root, 'npm', platform, 'package.json'), 'utf8')) as { name: string; main: string }
    t.is(sub.name, `${manifest.name}-${platform}`, triple)
    t.is(sub.main, `ferry.${platform}.node`, triple)
  }
  t.deepEqual(manifest.napi.targets.map(platformName).sort(), fs.readdirSync(path.join(root, 'npm')).sort())
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

test('an unsupported platform: the platforms that exist and building from source', (t) => {
  const e = bindingError(manifest, 'linux-x64-musl', new Error('Cannot find native binding.'))
  t.regex(e.message, /no prebuilt native addon for linux-x64-musl/)
  t.regex(e.message, /linux-x64-gnu, linux-arm64-gnu, darwin-arm64, darwin-x64/)
  t.regex(e.message, /build it from source/)
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
