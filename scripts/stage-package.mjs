#!/usr/bin/env node
// Lays out the main package as it is published, in pack/stage/<name>/ (napi-rs's
// `napi pre-publish`, without its GitHub release and its `npm publish` of each platform
// package, which the caller does):
//  - the files npm would pack from the checkout (`files`, README, LICENSE), built already;
//  - a manifest without `scripts` (the checkout's `prepare` builds with cargo: users install
//    a prebuilt addon and must run no build), `devDependencies` or tool settings;
//  - `optionalDependencies` on every platform package of `napi.targets`, at this version,
//    so `npm install ferry-engine` brings the one for the user's platform.
// It refuses to stage when a platform package under npm/ is missing or out of step (run
// `npm version <v>`: its `version` script runs `napi version`).
import { execFileSync } from 'node:child_process'
import * as fs from 'node:fs'
import * as path from 'node:path'
import { fileURLToPath } from 'node:url'
// Built by `npm run build:ts`; the loader names platforms the same way at run time.
import { platformName } from '../dist/loader.js'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const manifest = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))

function fail(message) {
  console.error(`stage-package: ${message}`)
  process.exit(1)
}

const optional = {}
for (const triple of manifest.napi?.targets ?? []) {
  const platform = platformName(triple)
  const file = path.join(root, 'npm', platform, 'package.json')
  if (!fs.existsSync(file)) fail(`no platform package npm/${platform} for target ${triple}`)
  const sub = JSON.parse(fs.readFileSync(file, 'utf8'))
  const expected = `${manifest.name}-${platform}`
  if (sub.name !== expected) fail(`npm/${platform} is named ${sub.name}, expected ${expected}`)
  if (sub.version !== manifest.version) {
    fail(`npm/${platform} is at ${sub.version}, ${manifest.name} at ${manifest.version}: run \`npx napi version\``)
  }
  optional[sub.name] = manifest.version
}
if (Object.keys(optional).length === 0) fail('package.json names no napi.targets')

// The files npm itself would pack (its own rules for `files`, README and LICENSE).
const [listing] = JSON.parse(
  execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8' }),
)
const files = listing.files.map((f) => f.path).filter((f) => f !== 'package.json')
// An entry is a file, or a pattern whose `*` stands for any part of one name (dist/lib/*.js).
const escape = (s) => s.replace(/[.+?^${}()|[\]\\]/g, '\\$&')
const matches = (pattern) => {
  const re = new RegExp(`^${pattern.split('*').map(escape).join('[^/]*')}$`)
  return files.filter((f) => re.test(f))
}
for (const wanted of manifest.files) {
  if (matches(wanted).length === 0) fail(`${wanted} is not built: run \`npm run build\` first`)
}
for (const needed of ['LICENSE', 'README.md']) {
  if (!files.includes(needed)) fail(`${needed} would not be packed`)
}

const stage = path.join(root, 'pack', 'stage', manifest.name)
fs.rmSync(stage, { recursive: true, force: true })
for (const f of files) {
  fs.mkdirSync(path.dirname(path.join(stage, f)), { recursive: true })
  fs.copyFileSync(path.join(root, f), path.join(stage, f))
}

const published = { ...manifest, optionalDependencies: optional }
for (const key of ['scripts', 'devDependencies', 'ava']) delete published[key]
fs.writeFileSync(path.join(stage, 'package.json'), JSON.stringify(published, null, 2) + '\n')
console.log(path.relative(root, stage))
