#!/usr/bin/env node
// The import graph of the product sources, and the checks that keep it layered.
//
//   node scripts/module-graph.mjs [--check] [--dot] [--root DIR]
//
// Rust: one node per module file of each crate named in RUST_GRAPHS (inline modules count
// as their file). An edge for each `use crate::…`, `use super::…`, `use self::…`, a `use` of a
// child module, and each such path written in code (`crate::x::y`, `super::x`, `child::x`, or
// a path through a module brought in by `use`), resolved to the module file that defines
// the named item: re-exports (`pub use`) are followed to where the item is defined. Items
// under `#[cfg(test)]`, comments and strings are not read.
//
// TypeScript: one node per product source (TS_SOURCES); an edge for each relative import,
// export-from, require or dynamic import.
//
// Checks: no cycle in either graph (each printed as a path a → b → … → a, with the line that
// makes each edge), and no product source over its line limit (LIMITS; a Rust file counted
// up to its `#[cfg(test)]` module). Exits 1 when a check fails, 2 on a usage error.
//
// Prints the graph (one line per module: its imports) unless --check; --dot prints it in
// Graphviz's format instead. --root checks another tree (the tests plant cycles in one).

import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// ---- What is checked ----------------------------------------------------------------------

/** Line limits: every product source, and the files held to a tighter one. */
const LIMITS = {
  default: 700,
  files: {
    'crates/core/src/engine.rs': 600,
    'index.ts': 150,
  },
};

/** The crates whose module graph must have no cycle (their `src/lib.rs` is the root). */
const RUST_GRAPHS = ['crates/core'];

/** Rust sources under the size rule: every `crates/*\/src` file but test-only ones. */
const RUST_SIZE = {
  roots: ['crates'],
  srcDir: 'src',
  skipDirs: ['vendor', 'target'],
  testOnlyFile: /(^|_)tests\.rs$/,
};

/**
 * TypeScript product sources: these files, and every .ts file under these folders and under
 * any other folder next to index.ts (a new folder of modules) but the ones listed in
 * `notProduct`.
 */
const TS_SOURCES = {
  files: ['index.ts', 'loader.ts'],
  dirs: ['bench', 'support'],
  notProduct: [
    '__test__', 'examples', 'scripts', 'node_modules', 'dist', 'target', 'crates', 'npm',
    'vendor',
  ],
};

// ---- Command line -------------------------------------------------------------------------

function usage() {
  const text = fs.readFileSync(fileURLToPath(import.meta.url), 'utf8');
  const lines = text.split('\n').slice(1);
  const end = lines.findIndex((l) => !l.startsWith('//'));
  return lines.slice(0, end).map((l) => l.replace(/^\/\/ ?/, '')).join('\n');
}

function parseArgs(argv) {
  const opts = { check: false, dot: false, root: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--check') opts.check = true;
    else if (a === '--dot') opts.dot = true;
    else if (a === '--root' && i + 1 < argv.length) opts.root = argv[++i];
    else if (a.startsWith('--root=')) opts.root = a.slice('--root='.length);
    else if (a === '-h' || a === '--help') opts.help = true;
    else return { error: `module-graph: unknown argument '${a}'` };
  }
  return opts;
}

// ---- Rust: tokens -------------------------------------------------------------------------

/**
 * Rust source as tokens ({ t, line }): identifiers, `::` and single punctuation. Comments
 * (doc comments included), strings, chars, lifetimes and numbers are dropped.
 */
export function rustTokens(src) {
  const out = [];
  let i = 0;
  let line = 1;
  const n = src.length;
  const isIdStart = (c) => /[A-Za-z_]/.test(c);
  const isId = (c) => /[A-Za-z0-9_]/.test(c);
  const skipTo = (j) => {
    for (; i < j && i < n; i++) if (src[i] === '\n') line++;
  };
  while (i < n) {
    const c = src[i];
    const d = src[i + 1];
    if (c === '\n') { line++; i++; continue; }
    if (/\s/.test(c)) { i++; continue; }
    if (c === '/' && d === '/') {
      const j = src.indexOf('\n', i);
      i = j < 0 ? n : j;
      continue;
    }
    if (c === '/' && d === '*') {
      let depth = 0;
      let j = i;
      while (j < n) {
        if (src[j] === '/' && src[j + 1] === '*') { depth++; j += 2; }
        else if (src[j] === '*' && src[j + 1] === '/') { depth--; j += 2; if (depth === 0) break; }
        else j++;
      }
      skipTo(j);
      continue;
    }
    // Raw strings: r"…", r#"…"#, br#"…"#.
    const raw = /^b?r(#*)"/.exec(src.slice(i, i + 260));
    if (raw) {
      const close = '"' + raw[1];
      const j = src.indexOf(close, i + raw[0].length);
      skipTo(j < 0 ? n : j + close.length);
      continue;
    }
    if (c === '"' || (c === 'b' && d === '"')) {
      let j = c === 'b' ? i + 2 : i + 1;
      while (j < n && src[j] !== '"') j += src[j] === '\\' ? 2 : 1;
      skipTo(j + 1);
      continue;
    }
    if (c === '\'' || (c === 'b' && d === '\'')) {
      // A char literal ('a', '\n', '\u{1F600}', b'x') or a lifetime ('a, 'static).
      const start = c === 'b' ? i + 1 : i;
      const lit = /^'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'/u.exec(src.slice(start, start + 16));
      if (lit) { skipTo(start + lit[0].length); continue; }
      if (c === '\'') {
        let j = i + 1;
        while (j < n && isId(src[j])) j++;
        i = j;
        continue;
      }
    }
    if (/[0-9]/.test(c)) {
      let j = i;
      while (j < n && /[0-9A-Za-z_.]/.test(src[j])) {
        if (src[j] === '.' && !/[0-9]/.test(src[j + 1] ?? '')) break;
        j++;
      }
      i = j;
      continue;
    }
    if (c === 'r' && d === '#' && isIdStart(src[i + 2] ?? '')) {
      // Raw identifier r#type.
      let j = i + 2;
      while (j < n && isId(src[j])) j++;
      out.push({ t: src.slice(i + 2, j), line });
      i = j;
      continue;
    }
    if (isIdStart(c)) {
      let j = i;
      while (j < n && isId(src[j])) j++;
      out.push({ t: src.slice(i, j), line });
      i = j;
      continue;
    }
    if (c === ':' && d === ':') { out.push({ t: '::', line }); i += 2; continue; }
    out.push({ t: c, line });
    i++;
  }
  return out;
}

// ---- Rust: one file's declarations --------------------------------------------------------

const OPEN = { '(': ')', '[': ']', '{': '}' };
/** Keywords followed by the name of the item they define (`macro_rules!` by `!` first). */
const DEFINING = new Set([
  'fn', 'struct', 'enum', 'trait', 'type', 'const', 'static', 'union', 'mod', 'macro_rules',
]);

/** Index just past the group opened at `i` (a bracket token). */
function skipGroup(toks, i) {
  const stack = [];
  for (let j = i; j < toks.length; j++) {
    const t = toks[j].t;
    if (OPEN[t]) stack.push(OPEN[t]);
    else if (t === stack[stack.length - 1]) {
      stack.pop();
      if (stack.length === 0) return j + 1;
    }
  }
  return toks.length;
}

/** Index just past the item that starts at `i` (after its attributes). */
function skipItem(toks, i) {
  // Items that end with `;` after any braces (use, const, static, type) versus those whose
  // body is one brace group or that end with `;` (fn, struct, mod, impl, …).
  let j = i;
  while (j < toks.length && ['pub', 'unsafe', 'async', 'extern', 'default'].includes(toks[j].t)) {
    j++;
    if (toks[j]?.t === '(') j = skipGroup(toks, j);
  }
  const untilSemicolon = ['use', 'const', 'static', 'type'].includes(toks[j]?.t);
  for (; j < toks.length; j++) {
    const t = toks[j].t;
    if (t === ';') return j + 1;
    if (t === '{' && !untilSemicolon) return skipGroup(toks, j);
    if (OPEN[t]) j = skipGroup(toks, j) - 1;
  }
  return toks.length;
}

/** Whether an attribute's tokens (inside `#[…]`) make its item test-only. */
function isTestOnly(attr) {
  const s = attr.map((x) => x.t).join(' ');
  return s === 'cfg ( test )' || /^cfg \( all \( (.* , )?test( ,|\s*\))/.test(s);
}

/**
 * Parses a use tree starting at `i` (after `use`). Returns the expanded imports
 * ({ segs, name, glob }) and the index past the `;`.
 */
function parseUse(toks, i) {
  const imports = [];
  function tree(j, prefix) {
    const segs = [...prefix];
    if (toks[j]?.t === '::') j++;
    for (;;) {
      const t = toks[j]?.t;
      if (t === '{') {
        j++;
        while (toks[j] && toks[j].t !== '}') {
          j = tree(j, segs);
          if (toks[j]?.t === ',') j++;
        }
        return j + 1;
      }
      if (t === '*') {
        imports.push({ segs, name: null, glob: true, line: toks[j].line });
        return j + 1;
      }
      if (t && /^[A-Za-z_]/.test(t)) {
        segs.push(t);
        const line = toks[j].line;
        j++;
        if (toks[j]?.t === '::') { j++; continue; }
        let name = t;
        if (toks[j]?.t === 'as') { name = toks[j + 1].t; j += 2; }
        if (t === 'self') {
          segs.pop();
          if (name === 'self') name = segs[segs.length - 1];
        }
        imports.push({ segs, name, glob: false, line });
        return j;
      }
      return j;
    }
  }
  let j = tree(i, []);
  while (j < toks.length && toks[j].t !== ';') j++;
  return { imports, next: j + 1 };
}

/**
 * Reads one file's tokens into the module scopes it defines: the file's module and its
 * inline modules. Each scope gets its child module declarations, its `use` imports, the
 * names it defines and the paths its code writes. Test-only items are skipped.
 */
function readScopes(toks, modPath, file, scopes) {
  const scope = (p) => {
    const key = p.join('::');
    if (!scopes.has(key)) {
      scopes.set(key, {
        path: p, file, fileMods: new Set(), inline: new Set(), imports: [], defines: new Set(),
        codePaths: [],
      });
    }
    return scopes.get(key);
  };
  scope(modPath);
  // Inline modules open: [{ path, depth: the brace depth inside it }].
  const stack = [{ path: modPath, depth: 0 }];
  let depth = 0;
  let attrs = [];
  let i = 0;
  while (i < toks.length) {
    const cur = stack[stack.length - 1];
    const t = toks[i].t;
    if (t === '#' && toks[i + 1]?.t === '[') {
      const end = skipGroup(toks, i + 1);
      attrs.push(toks.slice(i + 2, end - 1));
      i = end;
      continue;
    }
    if (t === '#' && toks[i + 1]?.t === '!' && toks[i + 2]?.t === '[') {
      i = skipGroup(toks, i + 2);
      continue;
    }
    if (attrs.some(isTestOnly)) {
      attrs = [];
      i = skipItem(toks, i);
      continue;
    }
    attrs = [];
    if (t === 'mod' && /^[A-Za-z_]/.test(toks[i + 1]?.t ?? '') && (toks[i + 2]?.t === ';' || toks[i + 2]?.t === '{')) {
      const name = toks[i + 1].t;
      if (toks[i + 2].t === ';') {
        scope(cur.path).fileMods.add(name);
        i += 3;
      } else {
        scope(cur.path).inline.add(name);
        scope([...cur.path, name]);
        depth++;
        stack.push({ path: [...cur.path, name], depth });
        i += 3;
      }
      continue;
    }
    if (t === 'use' && (i === 0 || toks[i - 1].t !== '::')) {
      const { imports, next } = parseUse(toks, i + 1);
      scope(cur.path).imports.push(...imports);
      i = next;
      continue;
    }
    if (DEFINING.has(t)) {
      const name = t === 'macro_rules' ? toks[i + 2]?.t : toks[i + 1]?.t;
      if (name && /^[A-Za-z_]/.test(name)) scope(cur.path).defines.add(name);
    }
    if (t === '{') depth++;
    if (t === '}') {
      depth--;
      if (stack.length > 1 && depth < cur.depth) stack.pop();
    }
    // A path in code: ident (:: ident)+ not preceded by `::` or `$` (macro `$crate`).
    if (/^[A-Za-z_]/.test(t) && toks[i + 1]?.t === '::' && toks[i - 1]?.t !== '::' && toks[i - 1]?.t !== '$') {
      const segs = [t];
      let j = i + 1;
      while (toks[j]?.t === '::' && /^[A-Za-z_]/.test(toks[j + 1]?.t ?? '')) {
        segs.push(toks[j + 1].t);
        j += 2;
      }
      scope(cur.path).codePaths.push({ segs, line: toks[i].line });
      i = j;
      continue;
    }
    i++;
  }
}

// ---- Rust: the crate's modules and their edges --------------------------------------------

/** The module file of `name` declared in `parentFile` (a `mod name;`). */
function childFile(parentFile, parentIsDirOwner, name, pathAttr) {
  const dir = parentIsDirOwner
    ? path.dirname(parentFile)
    : path.join(path.dirname(parentFile), path.basename(parentFile, '.rs'));
  if (pathAttr) return path.join(path.dirname(parentFile), pathAttr);
  const flat = path.join(dir, `${name}.rs`);
  if (fs.existsSync(flat)) return flat;
  const nested = path.join(dir, name, 'mod.rs');
  if (fs.existsSync(nested)) return nested;
  return null;
}

/** Reads a crate from `src/lib.rs` through its `mod` declarations. */
function readCrate(srcDir) {
  const scopes = new Map();
  const files = new Map(); // module key → file
  const missing = [];
  const visit = (file, modPath, ownsDir) => {
    files.set(modPath.join('::'), file);
    const src = fs.readFileSync(file, 'utf8');
    const toks = rustTokens(src);
    // #[path = "…"] needs the literal, which the tokens drop: read it from the source.
    const pathAttrs = [...src.matchAll(/#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;/g)];
    readScopes(toks, modPath, file, scopes);
    for (const sc of scopes.values()) {
      if (sc.file !== file) continue;
      for (const name of sc.fileMods) {
        const attr = pathAttrs.find((m) => m[2] === name);
        // Inline modules own a folder named after them under the file's folder.
        const base = sc.path.length > modPath.length
          ? path.join(ownsDir ? path.dirname(file) : path.join(path.dirname(file), path.basename(file, '.rs')), ...sc.path.slice(modPath.length))
          : null;
        let child;
        if (base) {
          child = attr ? path.join(base, attr[1]) : [path.join(base, `${name}.rs`), path.join(base, name, 'mod.rs')].find((f) => fs.existsSync(f));
        } else {
          child = childFile(file, ownsDir, name, attr ? attr[1] : null);
        }
        if (!child || !fs.existsSync(child)) {
          missing.push(`${path.relative(srcDir, file)}: mod ${name}`);
          continue;
        }
        const owns = path.basename(child) === 'mod.rs' || Boolean(attr);
        visit(child, [...sc.path, name], owns);
      }
    }
  };
  visit(path.join(srcDir, 'lib.rs'), [], true);
  return { scopes, files, missing };
}

/** Resolution of paths to the module file that defines what they name. */
function resolver(scopes) {
  const get = (p) => scopes.get(p.join('::'));
  const isModule = (p) => Boolean(get(p));
  const children = (p) => {
    const sc = get(p);
    return sc ? new Set([...sc.fileMods, ...sc.inline]) : new Set();
  };

  /**
   * Resolves `segs` as written in module `from`. Returns { mod, isModule } (the module that
   * defines the named item, or the module named) or null for a path outside the crate.
   */
  function resolve(from, segs, seen = 0) {
    if (seen > 32 || segs.length === 0) return null;
    let cur;
    let k = 0;
    const first = segs[0];
    if (first === 'crate') { cur = []; k = 1; }
    else if (first === 'self') { cur = from; k = 1; }
    else if (first === 'super') {
      cur = from;
      while (segs[k] === 'super') {
        if (cur.length === 0) return null;
        cur = cur.slice(0, -1);
        k++;
      }
    } else if (children(from).has(first)) { cur = [...from, first]; k = 1; }
    else {
      const imp = importNamed(from, first);
      if (!imp) return null;
      const r = resolve(from, imp.segs, seen + 1);
      if (!r) return null;
      if (!r.isModule) return r;
      cur = r.mod;
      k = 1;
    }
    return walk(cur, segs.slice(k), seen);
  }

  function walk(cur, rest, seen) {
    for (let k = 0; k < rest.length; k++) {
      const seg = rest[k];
      if (children(cur).has(seg)) { cur = [...cur, seg]; continue; }
      const sc = get(cur);
      if (sc && !sc.defines.has(seg)) {
        // Not defined here: a re-export, named or through a glob.
        const imp = importNamed(cur, seg);
        if (imp) {
          const r = resolve(cur, imp.segs, seen + 1);
          if (!r) return { mod: cur, isModule: false };
          if (!r.isModule) return r;
          return walk(r.mod, rest.slice(k + 1), seen + 1);
        }
        for (const g of sc.imports.filter((x) => x.glob)) {
          const r = resolve(cur, g.segs, seen + 1);
          if (r && r.isModule && definesOrExports(r.mod, seg, seen + 1)) {
            return walk(r.mod, rest.slice(k), seen + 1);
          }
        }
      }
      return { mod: cur, isModule: false };
    }
    return { mod: cur, isModule: isModule(cur) };
  }

  function importNamed(mod, name) {
    const sc = get(mod);
    return sc ? sc.imports.find((x) => !x.glob && x.name === name) : undefined;
  }

  function definesOrExports(mod, name, seen) {
    if (seen > 32) return false;
    const sc = get(mod);
    if (!sc) return false;
    return sc.defines.has(name) || children(mod).has(name) || Boolean(importNamed(mod, name));
  }

  return { resolve, get };
}

/** The module graph of one crate: nodes (module names), edges with the line that makes them. */
export function rustGraph(crateDir) {
  const srcDir = path.join(crateDir, 'src');
  const { scopes, files, missing } = readCrate(srcDir);
  const { resolve } = resolver(scopes);
  const fileOf = (modPath) => {
    // An inline module belongs to its file.
    for (let p = modPath; ; p = p.slice(0, -1)) {
      const f = files.get(p.join('::'));
      if (f) return p.join('::');
      if (p.length === 0) return '';
    }
  };
  const name = (key) => key || 'lib';
  const nodes = [...files.keys()].map(name).sort();
  const edges = new Map(); // "a\u0000b" → { from, to, where }
  const add = (scope, target, line, what) => {
    const from = name(fileOf(scope.path));
    const to = name(fileOf(target));
    if (from === to) return;
    const key = `${from}\u0000${to}`;
    if (!edges.has(key)) {
      edges.set(key, { from, to, where: `${path.relative(process.cwd(), scope.file)}:${line} ${what}` });
    }
  };
  for (const sc of scopes.values()) {
    for (const imp of sc.imports) {
      const r = resolve(sc.path, imp.segs);
      if (r) add(sc, r.mod, imp.line, `use ${imp.segs.join('::')}${imp.glob ? '::*' : ''}`);
    }
    for (const cp of sc.codePaths) {
      // The first segment names the crate, a module in scope or something `use` brought in.
      const r = resolve(sc.path, cp.segs);
      if (r) add(sc, r.mod, cp.line, cp.segs.join('::'));
    }
  }
  return { nodes, edges: [...edges.values()], missing };
}

// ---- TypeScript ---------------------------------------------------------------------------

function walkFiles(dir, accept, skipDir = () => false) {
  const out = [];
  if (!fs.existsSync(dir)) return out;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) {
      if (!skipDir(e.name, p)) out.push(...walkFiles(p, accept, skipDir));
    } else if (e.isFile() && accept(e.name, p)) out.push(p);
  }
  return out.sort();
}

/** The TypeScript product sources, relative to `root`. */
export function tsSources(root) {
  const isTs = (n) => n.endsWith('.ts') && !n.endsWith('.d.ts');
  const found = new Set(TS_SOURCES.files.filter((f) => fs.existsSync(path.join(root, f))));
  const dirs = new Set(TS_SOURCES.dirs);
  for (const e of fs.readdirSync(root, { withFileTypes: true })) {
    if (e.isDirectory() && !e.name.startsWith('.') && !TS_SOURCES.notProduct.includes(e.name)) dirs.add(e.name);
  }
  for (const d of dirs) {
    const skip = (n) => n === 'node_modules' || n === '__test__';
    for (const f of walkFiles(path.join(root, d), isTs, skip)) found.add(path.relative(root, f));
  }
  return [...found].sort();
}

let ts;
function typescript() {
  if (!ts) ts = createRequire(import.meta.url)('typescript');
  return ts;
}

/**
 * The relative imports of one TypeScript file that reach its JavaScript, with their lines.
 * Type-only imports (`import type …`, or every named element marked `type`) are erased by
 * the compiler and left out: a public API whose types name each other (`Engine.allocate()`
 * returns a `Region`, `Region.engine` is an `Engine`) is one strongly connected web at the
 * type level wherever its classes live, while the order modules load in, and what each
 * needs from the others, is decided by the imports that remain.
 */
export function tsImports(src) {
  const t = typescript();
  const file = t.createSourceFile('x.ts', src, t.ScriptTarget.Latest, false, t.ScriptKind.TS);
  const lineOf = (pos) => file.getLineAndCharacterOfPosition(pos).line + 1;
  const out = [];
  const relative = (spec) => spec.startsWith('./') || spec.startsWith('../');
  const typeOnlyImport = (clause) => {
    if (!clause) return false; // `import './x'`: loaded for its effects
    if (clause.isTypeOnly) return true;
    const b = clause.namedBindings;
    return !clause.name && b !== undefined && t.isNamedImports(b) && b.elements.length > 0 && b.elements.every((e) => e.isTypeOnly);
  };
  const typeOnlyExport = (d) =>
    d.isTypeOnly || (d.exportClause !== undefined && t.isNamedExports(d.exportClause) && d.exportClause.elements.length > 0 && d.exportClause.elements.every((e) => e.isTypeOnly));
  const visit = (node) => {
    if (t.isImportDeclaration(node) && t.isStringLiteral(node.moduleSpecifier)) {
      if (!typeOnlyImport(node.importClause)) out.push({ spec: node.moduleSpecifier.text, pos: node.getStart(file) });
    } else if (t.isExportDeclaration(node) && node.moduleSpecifier && t.isStringLiteral(node.moduleSpecifier)) {
      if (!typeOnlyExport(node)) out.push({ spec: node.moduleSpecifier.text, pos: node.getStart(file) });
    } else if (t.isImportEqualsDeclaration(node) && !node.isTypeOnly && t.isExternalModuleReference(node.moduleReference)) {
      const e = node.moduleReference.expression;
      if (t.isStringLiteral(e)) out.push({ spec: e.text, pos: node.getStart(file) });
    } else if (t.isCallExpression(node) && node.arguments.length === 1 && t.isStringLiteral(node.arguments[0]) &&
      ((t.isIdentifier(node.expression) && node.expression.text === 'require') || node.expression.kind === t.SyntaxKind.ImportKeyword)) {
      out.push({ spec: node.arguments[0].text, pos: node.getStart(file) });
    }
    t.forEachChild(node, visit);
  };
  visit(file);
  return out.filter((i) => relative(i.spec)).map((i) => ({ spec: i.spec, line: lineOf(i.pos) }));
}

function resolveTs(root, fromRel, spec) {
  const base = path.join(path.dirname(path.join(root, fromRel)), spec);
  const stem = base.replace(/\.(c|m)?js$/, '');
  for (const f of [base, `${stem}.ts`, `${stem}.mts`, `${stem}.cts`, path.join(base, 'index.ts')]) {
    if (f.endsWith('.ts') && fs.existsSync(f) && fs.statSync(f).isFile()) return path.relative(root, f);
  }
  return null;
}

/** The TypeScript graph over `tsSources`: imports of other files are not nodes. */
export function tsGraph(root) {
  const nodes = tsSources(root);
  const inGraph = new Set(nodes);
  const edges = [];
  for (const from of nodes) {
    const seen = new Set();
    for (const imp of tsImports(fs.readFileSync(path.join(root, from), 'utf8'))) {
      const to = resolveTs(root, from, imp.spec);
      if (!to || to === from || !inGraph.has(to) || seen.has(to)) continue;
      seen.add(to);
      edges.push({ from, to, where: `${from}:${imp.line} '${imp.spec}'` });
    }
  }
  return { nodes, edges };
}

// ---- Cycles -------------------------------------------------------------------------------

/** Strongly connected components with more than one node (Tarjan, iterative). */
export function cycleGroups(nodes, edges) {
  const adj = new Map(nodes.map((n) => [n, []]));
  for (const e of edges) {
    if (!adj.has(e.from)) adj.set(e.from, []);
    if (!adj.has(e.to)) adj.set(e.to, []);
    adj.get(e.from).push(e.to);
  }
  let index = 0;
  const idx = new Map();
  const low = new Map();
  const onStack = new Set();
  const stack = [];
  const groups = [];
  for (const start of adj.keys()) {
    if (idx.has(start)) continue;
    const work = [[start, 0]];
    idx.set(start, index); low.set(start, index); index++;
    stack.push(start); onStack.add(start);
    while (work.length) {
      const frame = work[work.length - 1];
      const [v, k] = frame;
      const next = adj.get(v);
      if (k < next.length) {
        frame[1]++;
        const w = next[k];
        if (!idx.has(w)) {
          idx.set(w, index); low.set(w, index); index++;
          stack.push(w); onStack.add(w);
          work.push([w, 0]);
        } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), idx.get(w)));
        continue;
      }
      work.pop();
      if (work.length) {
        const u = work[work.length - 1][0];
        low.set(u, Math.min(low.get(u), low.get(v)));
      }
      if (low.get(v) === idx.get(v)) {
        const group = [];
        let w;
        do { w = stack.pop(); onStack.delete(w); group.push(w); } while (w !== v);
        if (group.length > 1) groups.push(group.sort());
      }
    }
  }
  return groups;
}

/**
 * Cycles that together use every edge inside each group: for each edge a → b not yet on a
 * listed cycle, the shortest way back b → … → a.
 */
export function cyclesOf(groups, edges) {
  const cycles = [];
  for (const group of groups) {
    const members = new Set(group);
    const inner = edges.filter((e) => members.has(e.from) && members.has(e.to));
    inner.sort((a, b) => (a.from + a.to).localeCompare(b.from + b.to));
    const adj = new Map(group.map((n) => [n, []]));
    for (const e of inner) adj.get(e.from).push(e.to);
    const covered = new Set();
    for (const e of inner) {
      if (covered.has(`${e.from}\u0000${e.to}`)) continue;
      // BFS from e.to back to e.from.
      const prev = new Map([[e.to, null]]);
      const queue = [e.to];
      while (queue.length && !prev.has(e.from)) {
        const v = queue.shift();
        for (const w of adj.get(v)) if (!prev.has(w)) { prev.set(w, v); queue.push(w); }
      }
      const back = [];
      for (let v = e.from; v !== null; v = prev.get(v)) back.unshift(v);
      const cycle = [e.from, ...back];
      for (let k = 0; k + 1 < cycle.length; k++) covered.add(`${cycle[k]}\u0000${cycle[k + 1]}`);
      cycles.push(fromSmallest(cycle));
    }
  }
  return cycles;
}

/** The cycle a → … → a written from its smallest module, so that each reads one way. */
function fromSmallest(cycle) {
  const ring = cycle.slice(0, -1);
  const k = ring.indexOf([...ring].sort()[0]);
  const turned = [...ring.slice(k), ...ring.slice(0, k)];
  return [...turned, turned[0]];
}

// ---- Sizes --------------------------------------------------------------------------------

/**
 * Lines of a Rust file before its first test-only module: `#[cfg(test)]`, or
 * `#[cfg(all(test, …))]` such as the loom models' (all lines when it has none).
 */
export function rustProductLines(src) {
  const lines = src.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  for (let k = 0; k < lines.length; k++) {
    if (!/^#\[cfg\((test|all\(test\s*,.*\))\)\]$/.test(lines[k].trim())) continue;
    // The attribute of a module: only attributes, doc comments or blank lines between.
    let j = k + 1;
    while (j < lines.length && /^\s*(#\[.*\]|\/\/.*|)\s*$/.test(lines[j])) j++;
    if (/^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+/.test(lines[j] ?? '')) return k;
  }
  return lines.length;
}

function countLines(src) {
  const lines = src.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines.length;
}

/** Product sources over their limit: { file, lines, limit }. */
export function oversized(root) {
  const out = [];
  const limitOf = (rel) => LIMITS.files[rel] ?? LIMITS.default;
  const check = (rel, lines) => {
    const limit = limitOf(rel);
    if (lines > limit) out.push({ file: rel, lines, limit });
  };
  for (const r of RUST_SIZE.roots) {
    const cratesDir = path.join(root, r);
    if (!fs.existsSync(cratesDir)) continue;
    for (const c of fs.readdirSync(cratesDir, { withFileTypes: true })) {
      if (!c.isDirectory()) continue;
      const src = path.join(cratesDir, c.name, RUST_SIZE.srcDir);
      const files = walkFiles(
        src,
        (n) => n.endsWith('.rs') && !RUST_SIZE.testOnlyFile.test(n),
        (n) => RUST_SIZE.skipDirs.includes(n),
      );
      for (const f of files) check(path.relative(root, f), rustProductLines(fs.readFileSync(f, 'utf8')));
    }
  }
  for (const rel of tsSources(root)) check(rel, countLines(fs.readFileSync(path.join(root, rel), 'utf8')));
  return out;
}

// ---- Output -------------------------------------------------------------------------------

function printGraph(title, graph) {
  console.log(`# ${title}`);
  const by = new Map(graph.nodes.map((n) => [n, []]));
  for (const e of graph.edges) by.get(e.from)?.push(e.to);
  for (const [n, to] of by) console.log(`${n} → ${to.sort().join(', ') || '(nothing)'}`);
  console.log('');
}

function dot(graphs) {
  const lines = ['digraph modules {', '  rankdir=LR;', '  node [shape=box, fontsize=10];'];
  for (const [title, g] of graphs) {
    const id = (n) => JSON.stringify(`${title}:${n}`);
    lines.push(`  subgraph ${JSON.stringify(`cluster_${title}`)} {`, `    label=${JSON.stringify(title)};`);
    for (const n of g.nodes) lines.push(`    ${id(n)} [label=${JSON.stringify(n)}];`);
    for (const e of g.edges) lines.push(`    ${id(e.from)} -> ${id(e.to)};`);
    lines.push('  }');
  }
  lines.push('}');
  return lines.join('\n');
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.error) { console.error(opts.error); console.error(usage()); return 2; }
  if (opts.help) { console.log(usage()); return 0; }
  const root = path.resolve(opts.root ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '..'));
  process.chdir(root);

  const graphs = [];
  for (const c of RUST_GRAPHS) {
    if (fs.existsSync(path.join(root, c, 'src', 'lib.rs'))) graphs.push([`${c}/src`, rustGraph(path.join(root, c))]);
  }
  graphs.push(['TypeScript', tsGraph(root)]);

  if (opts.dot) console.log(dot(graphs));
  else if (!opts.check) for (const [title, g] of graphs) printGraph(title, g);

  let failed = false;
  for (const [title, g] of graphs) {
    for (const m of g.missing ?? []) {
      console.error(`module-graph: ${title}: no file for ${m}`);
      failed = true;
    }
    const cycles = cyclesOf(cycleGroups(g.nodes, g.edges), g.edges);
    if (cycles.length === 0) continue;
    failed = true;
    const edgeOf = new Map(g.edges.map((e) => [`${e.from}\u0000${e.to}`, e]));
    console.error(`module-graph: ${cycles.length} import cycle(s) in ${title}:`);
    for (const c of cycles) {
      console.error(`  ${c.join(' → ')}`);
      for (let k = 0; k + 1 < c.length; k++) {
        console.error(`      ${c[k]} → ${c[k + 1]}: ${edgeOf.get(`${c[k]}\u0000${c[k + 1]}`).where}`);
      }
    }
  }
  const big = oversized(root);
  if (big.length) {
    failed = true;
    console.error(`module-graph: ${big.length} source file(s) over their line limit (Rust counted before #[cfg(test)]):`);
    for (const b of big) console.error(`  ${b.file}: ${b.lines} lines (limit ${b.limit})`);
  }
  if (!failed) {
    const counts = graphs.map(([t, g]) => `${t}: ${g.nodes.length} modules, ${g.edges.length} edges`).join('; ');
    console.error(`module-graph: no cycles, no file over its limit (${counts})`);
  }
  return failed ? 1 : 0;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = main();
}
