/**
 * Command-line options of the bench CLIs (tebench, npm run perf), declared once: each CLI
 * writes a schema — name, type, default, bounds, help — and this module parses argv against
 * it in gflags' forms and prints the help from it, so the two CLIs cannot drift apart in
 * syntax or in the bounds of the options they share (`SHARED`).
 *
 * Forms accepted (gflags', which Mooncake's users type): `--flag=value`, `--flag value`,
 * `-flag` for `--flag`; booleans `--flag`, `--flag=true|false` (also 1/0, yes/no, t/f,
 * y/n), `--noflag` (and `--no-flag`); `--` ends the flags. Everything else is a UsageError
 * whose message names the flag.
 */

export type OptionType = 'string' | 'boolean' | 'integer' | 'number' | 'size'

export interface OptionSpec {
  type: OptionType
  default: string | number | boolean
  /** Help text; a refused flag needs none (its message is shown instead). */
  help?: string
  /** Bounds of integer, number and size options (inclusive). */
  min?: number
  max?: number
  /** The values a string option takes. */
  choices?: readonly string[]
  /** Values refused with a message (a Mooncake value this port does not implement). */
  refusedChoices?: Readonly<Record<string, string>>
  /** The flag is refused, with this message, when given any value but its default. */
  refused?: string
  /** Other names (perf's `-h`). */
  aliases?: readonly string[]
  /** Shown in help as the value's name (`--listen=ADDR[:PORT]`). */
  metavar?: string
}

export type Schema = Record<string, OptionSpec>

type ValueOf<T extends OptionType> = T extends 'boolean' ? boolean : T extends 'string' ? string : number
export type Values<S extends Schema> = { -readonly [K in keyof S]: ValueOf<S[K]['type']> }

/** Bad usage: exit code 2 in both CLIs. `code` is stable for JSON output. */
export class UsageError extends Error {
  readonly code = 'ERR_USAGE'
}

const KiB = 1024

/** Options both CLIs take, with one meaning and one set of bounds. */
export const SHARED = {
  peerTimeoutMs: {
    type: 'integer',
    default: 3000,
    min: 10,
    max: 3_600_000,
    help: 'a silent peer is declared lost (its in-flight work FAILED) after this many ms (the engine bounds: 10 ms .. 1 h)',
  },
  durationS: {
    type: 'number',
    default: 5,
    min: 0.1,
    max: 86_400,
    help: 'measured seconds per case (tebench: after a 1 s warm-up)',
  },
} as const satisfies Record<string, OptionSpec>

const TRUE = new Set(['true', '1', 'yes', 't', 'y'])
const FALSE = new Set(['false', '0', 'no', 'f', 'n'])

/** A byte count with an optional K/M/G/T suffix (`4K`, `1MiB`); a UsageError naming `--name` otherwise. */
export function parseSize(name: string, text: string): number {
  const m = /^(\d+)([kKmMgGtT]?)[iI]?[bB]?$/.exec(text.trim())
  if (!m) throw new UsageError(`--${name}: expected a whole number of bytes (K/M/G suffix allowed), got "${text}"`)
  const mult = { '': 1, k: KiB, m: KiB ** 2, g: KiB ** 3, t: KiB ** 4 }[m[2].toLowerCase() as '' | 'k' | 'm' | 'g' | 't']
  return Number(m[1]) * mult
}

function convert(name: string, spec: OptionSpec, text: string): string | number | boolean {
  switch (spec.type) {
    case 'boolean': {
      const t = text.trim().toLowerCase()
      if (TRUE.has(t)) return true
      if (FALSE.has(t)) return false
      throw new UsageError(`--${name}: expected true or false, got "${text}"`)
    }
    case 'string': {
      if (spec.refusedChoices && Object.hasOwn(spec.refusedChoices, text)) {
        throw new UsageError(`--${name}=${text}: ${spec.refusedChoices[text]}`)
      }
      if (spec.choices && !spec.choices.includes(text)) {
        throw new UsageError(`--${name} must be ${orList(spec.choices)}, got "${text}"`)
      }
      return text
    }
    default: {
      let n: number
      if (spec.type === 'size') n = parseSize(name, text)
      else if (spec.type === 'integer') {
        if (!/^\s*-?\d+\s*$/.test(text)) throw new UsageError(`--${name}: expected a whole number, got "${text}"`)
        n = Number(text)
      } else {
        n = text.trim() === '' ? NaN : Number(text)
        if (!Number.isFinite(n)) throw new UsageError(`--${name}: expected a number, got "${text}"`)
      }
      const min = spec.min ?? -Infinity
      const max = spec.max ?? Number.MAX_SAFE_INTEGER
      if (!Number.isSafeInteger(n) && spec.type !== 'number') throw new UsageError(`--${name}: ${text} is too large`)
      if (n < min || n > max) {
        const range = spec.max === undefined ? `>= ${min}` : `between ${min} and ${max}`
        throw new UsageError(`--${name}: must be ${range}, got ${text}`)
      }
      return n
    }
  }
}

function orList(xs: readonly string[]): string {
  return xs.length <= 1 ? (xs[0] ?? '') : `${xs.slice(0, -1).join(', ')} or ${xs[xs.length - 1]}`
}

export interface ParseOptions {
  /** Flags refused by name prefix, with the message (Mooncake's families of QoS flags). */
  refusedPrefixes?: ReadonlyArray<readonly [string, string]>
}

export interface Parsed<S extends Schema> {
  values: Values<S>
  /** The options the command line set. */
  given: Set<keyof S & string>
}

/** Parses `argv` against `schema`; throws UsageError naming the flag on bad usage. */
export function parseFlags<S extends Schema>(schema: S, argv: readonly string[], opts: ParseOptions = {}): Parsed<S> {
  const byName = new Map<string, string>()
  for (const [name, spec] of Object.entries(schema)) {
    byName.set(name, name)
    for (const a of spec.aliases ?? []) byName.set(a, name)
  }
  const values = Object.fromEntries(Object.entries(schema).map(([k, s]) => [k, s.default])) as Record<string, unknown>
  const given = new Set<string>()
  for (let i = 0; i < argv.length; i++) {
    const raw = argv[i]
    if (raw === '--') {
      if (i + 1 < argv.length) throw new UsageError(`unexpected argument "${argv[i + 1]}"`)
      break
    }
    const m = /^--?([^=]+)(?:=([\s\S]*))?$/.exec(raw)
    if (!m || raw === '-') throw new UsageError(`unexpected argument "${raw}" (flags are --name=value)`)
    const [, flag, inline] = m
    let name = byName.get(flag)
    let negated = false
    if (name === undefined) {
      const bare = flag.startsWith('no-') ? flag.slice(3) : flag.startsWith('no') ? flag.slice(2) : undefined
      const target = bare === undefined ? undefined : byName.get(bare)
      if (target !== undefined && schema[target].type === 'boolean') {
        if (inline !== undefined) throw new UsageError(`--${flag} takes no value`)
        name = target
        negated = true
      }
    }
    if (name === undefined) {
      const prefix = opts.refusedPrefixes?.find(([p]) => flag.startsWith(p))
      if (prefix) throw new UsageError(`--${flag}: ${prefix[1]}`)
      throw new UsageError(`unknown flag --${flag}`)
    }
    const spec = schema[name]
    let value: string | number | boolean
    if (negated) value = false
    else if (spec.type === 'boolean') value = inline === undefined ? true : convert(name, spec, inline)
    else {
      let text = inline
      if (text === undefined) {
        text = argv[i + 1]
        if (text === undefined || (text.startsWith('-') && text.length > 1 && !/^-\d/.test(text))) {
          throw new UsageError(`--${name} needs a value`)
        }
        i++
      }
      value = convert(name, spec, text)
    }
    if (spec.refused !== undefined && value !== spec.default) throw new UsageError(`--${name}: ${spec.refused}`)
    values[name] = value
    given.add(name)
  }
  return { values: values as Values<S>, given: given as Set<keyof S & string> }
}

/** One help line per option: `--name=VALUE  help (default …)`. */
export function helpLines(schema: Schema, width = 26): string[] {
  const lines: string[] = []
  for (const [name, spec] of Object.entries(schema)) {
    if (spec.refused !== undefined) continue
    const valueName = spec.metavar ?? (spec.choices ? spec.choices.filter((c) => c !== '').join('|') : spec.type.toUpperCase())
    const metavar = spec.type === 'boolean' ? '' : `=${valueName}`
    const flag = `--${name}${metavar}`
    const dflt = spec.type === 'string' ? JSON.stringify(spec.default) : String(spec.default)
    const head = `  ${flag.padEnd(width)} `
    lines.push(`${head.length > width + 3 ? `  ${flag}\n${' '.repeat(width + 3)}` : head}${spec.help ?? ''} (default ${dflt})`)
  }
  return lines
}

/** The refused flags with their messages, for help. */
export function refusedLines(schema: Schema, opts: ParseOptions = {}): string[] {
  const out = Object.entries(schema)
    .filter(([, s]) => s.refused !== undefined)
    .map(([n, s]) => `  --${n}: ${s.refused}`)
  for (const [p, why] of opts.refusedPrefixes ?? []) out.push(`  --${p}*: ${why}`)
  return out
}
