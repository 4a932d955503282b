/**
 * scripts/module-graph.mjs on small trees written for each test: it passes an acyclic one
 * and fails, naming the cycle, on one with a cycle planted in the Rust or the TypeScript
 * graph; what it must not read (comments, strings, test modules) makes no edge; and it
 * names the files over their line limit.
 */
import test from 'ava'
import { spawnSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'

const script = join(__dirname, '..', 'scripts', 'module-graph.mjs')

type Tree = Record<string, string>

/** An acyclic crate and TypeScript tree that tests change one file of. */
const base: Tree = {
  'crates/core/src/lib.rs': 'mod a;\nmod b;\npub mod notify;\npub use a::A;\n',
  'crates/core/src/a.rs': 'use crate::b::B;\n\n/// A.\npub struct A(pub B);\n',
  'crates/core/src/b.rs': '/// B.\npub struct B;\n',
  'crates/core/src/notify/mod.rs': 'pub(crate) mod inbox;\npub use inbox::Note;\n',
  'crates/core/src/notify/inbox.rs': 'pub struct Note;\n',
  'index.ts': "import { load } from './loader'\nexport const x = load()\n",
  'loader.ts': 'export function load(): number {\n  return 1\n}\n',
  'bench/lib/stats.ts': "import { x } from '../../index'\nexport const y = x\n",
}

function withTree(t: { teardown(fn: () => void): void }, changes: Tree): string {
  const root = mkdtempSync(join(tmpdir(), 'module-graph-'))
  t.teardown(() => rmSync(root, { recursive: true, force: true }))
  for (const [file, text] of Object.entries({ ...base, ...changes })) {
    mkdirSync(dirname(join(root, file)), { recursive: true })
    writeFileSync(join(root, file), text)
  }
  return root
}

function check(root: string, ...args: string[]) {
  const r = spawnSync(process.execPath, [script, '--check', '--root', root, ...args], { encoding: 'utf8' })
  return { status: r.status, out: r.stdout, err: r.stderr }
}

test('an acyclic tree passes', (t) => {
  const r = check(withTree(t, {}))
  t.is(r.status, 0, r.err)
  t.regex(r.err, /no cycles/)
})

test('a cycle through use and a path in code fails, named as a path with the lines that make it', (t) => {
  const r = check(withTree(t, { 'crates/core/src/b.rs': 'pub struct B;\npub fn a() -> crate::a::A {\n  crate::a::A(B)\n}\n' }))
  t.is(r.status, 1)
  t.regex(r.err, /a → b → a/)
  t.regex(r.err, /crates\/core\/src\/a\.rs:1 use crate::b::B/)
  t.regex(r.err, /crates\/core\/src\/b\.rs:2 crate::a::A/)
})

test('a path through a re-export is resolved to the module that defines the item', (t) => {
  // `crate::A` is lib.rs's `pub use a::A`: the edge goes to a, not to lib.
  const r = check(withTree(t, { 'crates/core/src/b.rs': 'pub struct B;\npub type Also = crate::A;\n' }))
  t.is(r.status, 1)
  t.regex(r.err, /a → b → a/)
})

test('comments, doc comments, strings and test-only items make no edge', (t) => {
  const b = [
    '//! Uses crate::a::A in prose only.',
    '/// See crate::a::A.',
    'pub struct B;',
    '/* crate::a::A */',
    'pub const TEXT: &str = "crate::a::A";',
    "pub const C: char = 'a';",
    '#[cfg(test)]',
    'fn helper() -> crate::a::A { crate::a::A(B) }',
    '',
    '#[cfg(test)]',
    'mod tests {',
    '    use crate::a::A;',
    '}',
    '',
  ].join('\n')
  const r = check(withTree(t, { 'crates/core/src/b.rs': b }))
  t.is(r.status, 0, r.err)
})

test('a child that uses its parent while the parent uses it is a cycle (super::)', (t) => {
  const r = check(withTree(t, {
    'crates/core/src/notify/mod.rs': 'pub(crate) mod inbox;\npub use inbox::Note;\npub struct Counters;\n',
    'crates/core/src/notify/inbox.rs': 'use super::Counters;\npub struct Note(Counters);\n',
  }))
  t.is(r.status, 1)
  t.regex(r.err, /notify → notify::inbox → notify/)
})

test('a cycle among TypeScript modules fails, in any folder of modules next to index.ts', (t) => {
  const r = check(withTree(t, {
    'loader.ts': "import { helper } from './lib/helper'\nexport function load(): number {\n  return helper()\n}\n",
    'lib/helper.ts': "import { x } from '../index'\nexport function helper(): number {\n  return 1\n}\nexport const y = x\n",
  }))
  t.is(r.status, 1)
  t.regex(r.err, /index\.ts → loader\.ts → lib\/helper\.ts → index\.ts/)
})

test('a TypeScript import that keeps one value closes a cycle; a type-only one (erased) does not', (t) => {
  const tree = (helper: string) => ({
    'index.ts': "export { load } from './loader'\n",
    'loader.ts': "import { helper } from './lib/helper'\nexport function load(): number {\n  return helper()\n}\n",
    'lib/helper.ts': `${helper}\nexport function helper(): number {\n  return 1\n}\n`,
  })
  for (const erased of ["import type { load } from '../index'", "import { type load } from '../index'", "export type { load } from '../index'"]) {
    const r = check(withTree(t, tree(erased)))
    t.is(r.status, 0, `${erased}: ${r.err}`)
  }
  for (const kept of ["import { load, type X } from '../index'", "import * as all from '../index'", "export { load } from '../index'", "import '../index'", "const all = require('../index')"]) {
    const r = check(withTree(t, tree(kept)))
    t.is(r.status, 1, kept)
    t.regex(r.err, /lib\/helper\.ts → index\.ts/, kept)
  }
})

test('TypeScript imports in comments and test files make no edge', (t) => {
  const r = check(withTree(t, {
    'loader.ts': "// import { x } from './index'\nexport function load(): number {\n  return 1\n}\n",
    '__test__/a.spec.ts': "import { x } from '../index'\nimport { load } from '../loader'\n",
  }))
  t.is(r.status, 0, r.err)
})

test('files over their line limit are named; a Rust file counts up to its test module', (t) => {
  const lines = (n: number) => '// line\n'.repeat(n)
  const r = check(withTree(t, {
    // 700 lines of product code and a long test module: within the limit.
    'crates/core/src/b.rs': `${lines(699)}pub struct B;\n#[cfg(test)]\nmod tests {\n${lines(800)}}\n`,
    // A test-only module under a cfg of its own (the loom models) ends the count too.
    'crates/core/src/c.rs': `${lines(699)}pub struct C;\n#[cfg(all(test, ferry_loom))]\nmod model {\n${lines(800)}}\n`,
    // The engine is held to 600.
    'crates/core/src/engine.rs': `${lines(601)}#[cfg(test)]\n#[path = "engine_tests.rs"]\nmod tests;\n`,
    'crates/core/src/lib.rs': 'mod a;\nmod b;\nmod c;\nmod engine;\npub mod notify;\npub use a::A;\n',
    // Another crate; a file of tests only is not product code.
    'crates/other/src/lib.rs': lines(701),
    'crates/other/src/tests.rs': lines(900),
    'index.ts': `import { load } from './loader'\nexport const x = load()\n${lines(149)}`,
  }))
  t.is(r.status, 1)
  t.regex(r.err, /crates\/core\/src\/engine\.rs: 601 lines \(limit 600\)/)
  t.regex(r.err, /crates\/other\/src\/lib\.rs: 701 lines \(limit 700\)/)
  t.regex(r.err, /index\.ts: 151 lines \(limit 150\)/)
  t.notRegex(r.err, /src\/b\.rs/)
  t.notRegex(r.err, /src\/c\.rs/)
  t.notRegex(r.err, /tests\.rs/)
  t.notRegex(r.err, /cycle/)
})

test('--dot prints the graph for Graphviz', (t) => {
  const r = check(withTree(t, {}), '--dot')
  t.is(r.status, 0, r.err)
  t.regex(r.out, /^digraph modules \{/)
  t.regex(r.out, /"crates\/core\/src:a" -> "crates\/core\/src:b";/)
  t.regex(r.out, /"TypeScript:bench\/lib\/stats\.ts" -> "TypeScript:index\.ts";/)
})
