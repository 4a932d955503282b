#!/usr/bin/env node
/**
 * tebench: Mooncake TENT's transfer benchmark, on Ferry.
 *
 * Layers, in bench/tebench/: flags (one schema with defaults, shared by parsing and --help)
 * → config (flags → typed Config, or a UsageError) → target / initiator, with local for
 * --local (call the Ferry API, produce records) → output (a header, then table, Mooncake's
 * layout, CSV or JSON lines on stdout, then a summary; progress on stderr only when it is
 * a TTY) → main, here (parses, picks the mode, runs it and sets the exit code in one place).
 *
 * Exit codes: 0 success, 1 a transfer failed (printed with status, transport and peer),
 * 2 bad usage, 130 interrupted by Ctrl-C (partial results printed).
 */
import { UsageError } from './options'
import { parseConfig, wantsJson, type Config } from './tebench/config'
import { helpText } from './tebench/flags'
import { runInitiator } from './tebench/initiator'
import { interrupt } from './tebench/interrupt'
import { startLocalTarget, type LocalTarget } from './tebench/local'
import { Output } from './tebench/output'
import { runInfo, versionLine } from './tebench/runinfo'
import { runTarget } from './tebench/target'

async function main(argv: string[]): Promise<number> {
  let cfg: Config
  try {
    cfg = parseConfig(argv)
  } catch (err) {
    if (err instanceof UsageError) {
      new Output(wantsJson(argv) ? 'json' : 'table').usage(err.message)
      return 2
    }
    throw err
  }
  if (cfg.help) {
    process.stdout.write(helpText())
    return 0
  }
  const info = runInfo(argv)
  if (cfg.version) {
    process.stdout.write(versionLine(info) + '\n')
    return 0
  }
  // A second Ctrl-C or SIGTERM forces the end: the only process.exit.
  interrupt.install(() => process.exit(130))
  const out = new Output(cfg.format)

  if (!cfg.local && cfg.targetSegNames.length === 0) return runTarget(cfg, out, info, __filename)

  let child: LocalTarget | undefined
  try {
    if (cfg.local) {
      // The child is this same entry script, in target mode.
      child = await startLocalTarget(__filename, cfg, out)
      cfg = { ...cfg, targetSegNames: [child.segment] }
      if (interrupt.stopped) return 130
    }
    const { code } = await runInitiator(cfg, out, info, child)
    return code === 130 && interrupt.signal === 'SIGTERM' ? 143 : code
  } finally {
    await child?.stop()
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code
    },
    (err: unknown) => {
      const e = err as { code?: string; message?: string; stack?: string }
      process.stderr.write(`tebench: ${e?.code ? `${e.code}: ` : ''}${e?.message ?? String(err)}\n`)
      process.exitCode = 1
    },
  )
}
