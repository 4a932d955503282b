// FerryErrorCode is a closed union: every `ERR_FERRY_*` code the Rust crates or the
// TypeScript API (index.ts, lib/) can produce must be a member (a code missing from it would reach users typed as one it
// is not), and every member must be one of them (no stale names). Read from the sources:
// the union is generated into lib/tables.ts from the core's `ErrorCode` table, so a code
// written anywhere else (a literal in Rust or TS outside that table) fails this test until
// the table has it and the file is generated anew. lib/tables.ts itself is not a source of
// codes here (it would vouch for its own members).
import test from 'ava'
import * as fs from 'node:fs'
import * as path from 'node:path'
import ts from 'typescript'

const root = path.join(__dirname, '..')
const CODE = /["'](ERR_FERRY_[A-Z0-9_]+)["']/g

function sources(dir: string, ext: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name)
    if (e.isDirectory()) return e.name === 'target' ? [] : sources(p, ext)
    return e.name.endsWith(ext) ? [p] : []
  })
}

/** The TypeScript API's sources: index.ts and its modules in lib/. */
const apiSources = () => [path.join(root, 'index.ts'), ...sources(path.join(root, 'lib'), '.ts')]
/** The file generated from the core's tables, which declares the union. */
const generated = path.join(root, 'lib', 'tables.ts')

/** Codes written as string literals in the crates' Rust sources and in the TypeScript API. */
function emittedCodes(): Map<string, string> {
  const where = new Map<string, string>()
  for (const file of [...sources(path.join(root, 'crates'), '.rs'), ...apiSources()].filter((f) => f !== generated)) {
    for (const m of fs.readFileSync(file, 'utf8').matchAll(CODE)) {
      if (!where.has(m[1])) where.set(m[1], path.relative(root, file))
    }
  }
  return where
}

/** The members of `FerryErrorCode` where the TypeScript API declares it, as written (a non-literal member as `<type>`). */
function unionMembers(): string[] {
  for (const file of apiSources()) {
    const sf = ts.createSourceFile(file, fs.readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true)
    const alias = sf.statements.find((s): s is ts.TypeAliasDeclaration => ts.isTypeAliasDeclaration(s) && s.name.text === 'FerryErrorCode')
    if (!alias) continue
    const members = ts.isUnionTypeNode(alias.type) ? alias.type.types : [alias.type]
    return members.map((m) => (ts.isLiteralTypeNode(m) && ts.isStringLiteral(m.literal) ? m.literal.text : `<${m.getText(sf)}>`))
  }
  throw new Error('neither index.ts nor lib/ declares FerryErrorCode')
}

test('every ERR_FERRY_ code the Rust side or the TypeScript API emits is a member of FerryErrorCode', (t) => {
  const members = new Set(unionMembers())
  const missing = [...emittedCodes()].filter(([code]) => !members.has(code)).map(([code, file]) => `${code} (${file})`)
  t.deepEqual(missing, [])
})

test('FerryErrorCode is closed: string literals only, each one emitted somewhere (or ABORT_ERR)', (t) => {
  const emitted = emittedCodes()
  const stale = unionMembers().filter((m) => m !== 'ABORT_ERR' && !emitted.has(m))
  t.deepEqual(stale, [])
  t.true(emitted.size > 10, `found only ${emitted.size} codes: is the pattern still right?`)
})

test('the union is the core\'s table of codes (ErrorCode::name) and ABORT_ERR', (t) => {
  const table = fs.readFileSync(path.join(root, 'crates', 'core', 'src', 'error.rs'), 'utf8')
  const body = table.slice(table.indexOf('impl ErrorCode {'), table.indexOf('impl Numbered for ErrorCode'))
  const names = [...body.matchAll(CODE)].map((m) => m[1])
  t.true(names.length > 10, `read only ${names.length} names from ErrorCode::name`)
  t.deepEqual([...unionMembers()].sort(), [...names, 'ABORT_ERR'].sort())
})
