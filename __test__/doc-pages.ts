// What __test__/docs.spec.ts reads from the Markdown pages: their tables, links, headings,
// code spans and the shell commands they show. Plain text processing, no Markdown library:
// the pages keep to GitHub's Markdown, and fenced blocks are skipped where prose is read.
import * as fs from 'node:fs'
import * as path from 'node:path'

export const root = path.join(__dirname, '..')

/** The README and every guide page, by path relative to the repository. */
export function pages(): string[] {
  const docs = fs
    .readdirSync(path.join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`)
  return ['README.md', 'CHANGELOG.md', 'ARCHITECTURE.md', ...docs]
}

export const read = (page: string) => fs.readFileSync(path.join(root, page), 'utf8')

/** A page's prose: its text with fenced code blocks blanked (line count kept). */
export function prose(text: string): string {
  let inFence = false
  return text
    .split('\n')
    .map((line) => {
      if (/^\s*```/.test(line)) {
        inFence = !inFence
        return ''
      }
      return inFence ? '' : line
    })
    .join('\n')
}

/** The fenced code blocks of one language (`sh`), as their lines. */
export function fenced(text: string, lang: string): string[][] {
  const blocks: string[][] = []
  let current: string[] | undefined
  let inFence = false
  for (const line of text.split('\n')) {
    const fence = /^\s*```(\w*)/.exec(line)
    if (fence) {
      if (!inFence) current = fence[1] === lang ? [] : undefined
      else if (current) blocks.push(current)
      inFence = !inFence
      continue
    }
    if (inFence) current?.push(line)
  }
  return blocks
}

/** The inline code spans of a page's prose (a span may wrap across lines). */
export function codeSpans(text: string): string[] {
  return [...prose(text).replace(/\n/g, ' ').matchAll(/`([^`]+)`/g)].map((m) => m[1].trim())
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens. */
export function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-')
}

/** The anchors of a page's headings. */
export function anchors(text: string): Set<string> {
  return new Set(
    prose(text)
      .split('\n')
      .filter((l) => /^#{1,6} /.test(l))
      .map((l) => slug(l.replace(/^#+ /, ''))),
  )
}

/** The Markdown links of a page's prose: `[text](target)`. */
export function links(text: string): string[] {
  return [...prose(text).matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1])
}

/**
 * The rows of the first table whose header row starts with `firstHeader`, as cells (code
 * spans keep their backquotes; `\|` inside a cell is not used by these pages).
 */
export function table(text: string, firstHeader: string): string[][] {
  const lines = prose(text).split('\n')
  const start = lines.findIndex((l) => l.startsWith('|') && cells(l)[0] === firstHeader)
  if (start < 0) throw new Error(`no table headed "${firstHeader}"`)
  const rows: string[][] = []
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break
    rows.push(cells(line))
  }
  return rows
}

function cells(line: string): string[] {
  return line
    .replace(/^\|/, '')
    .replace(/\|$/, '')
    .split('|')
    .map((c) => c.trim())
}

/** The code spans in one table cell, without their backquotes. */
export const spansIn = (cell: string) => [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1])

/**
 * The shell commands a page shows: each line of its `sh` blocks (comments dropped, `&&`
 * chains split), and each inline span that starts like a command. `wordForWord` is set for
 * the ones meant to be copied as they stand: every command of an `sh` block, and a span
 * without placeholders (`PATH`, `<name>`, `[...]`, `a|b`, `…`).
 */
export function commands(text: string): Array<{ words: string[]; wordForWord: boolean; source: string }> {
  const out: Array<{ words: string[]; wordForWord: boolean; source: string }> = []
  const add = (line: string, fromBlock: boolean) => {
    for (const part of line.split('&&')) {
      const source = part.trim()
      if (source === '') continue
      const words = source.split(/\s+/)
      const placeholder = /[<>[\]|…]|=[A-Z][A-Z_]*\b|^[A-Z]+$/.test(source.replace(/^[A-Z_]+=\S+\s+/, ''))
      out.push({ words, wordForWord: fromBlock || !placeholder, source })
    }
  }
  for (const block of fenced(text, 'sh')) {
    for (const line of block) {
      const code = line.replace(/(^|\s)#.*$/, '').trim()
      if (code !== '') add(code, true)
    }
  }
  for (const span of codeSpans(text)) {
    if (/^([A-Z_]+=\S+\s+)*(npm|npx|cargo|node|bash|scripts\/)\S*\s/.test(span) || /^(npm test|npm install|npm ci)$/.test(span)) add(span, false)
  }
  return out
}
