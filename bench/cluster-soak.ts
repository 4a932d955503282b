/**
 * `npm run soak`: a cluster soak. N hosts (8 by default), each a process with an engine in a
 * network namespace of its own, registered in an etcd this starts, write verified blocks
 * with notifications to each other all-to-all, in rounds, while — by flag — hosts are
 * SIGKILLed and restarted on their address (`--storm`), etcd is paused (`--etcd-pause`) or a
 * host is flooded with idle connections (`--idle-flood`). Needs root, iproute2 and etcd.
 *
 *   npm run -s soak -- [--hosts=8] [--rounds=10] [--storm] [--etcd-pause] [--idle-flood] > soak.jsonl
 *
 * JSON records on stdout — `start`, one `round` per round (RSS per host, what the round did,
 * what it added), and `summary` (the figures; see bench/cluster-soak/summary.ts) — and
 * progress and a readable summary on stderr. Exit 0 when the run finished (whatever its
 * figures), 1 when it could not run, 2 on bad usage. The modules are in bench/cluster-soak/.
 */
import { installCleanup, killAll } from './lib/children'
import { UsageError } from './options'
import { runSoak } from './cluster-soak/driver'
import { parseSoakFlags, USAGE } from './cluster-soak/flags'
import { readable } from './cluster-soak/summary'

const log = (line: string) => process.stderr.write(`[soak] ${line}\n`)

async function main(): Promise<number> {
  let config
  try {
    config = parseSoakFlags(process.argv.slice(2))
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`soak: ${err.message}\n${USAGE}\n`)
      return 2
    }
    throw err
  }
  if (config === 'help') {
    process.stdout.write(`${USAGE}\n`)
    return 0
  }
  installCleanup((code) => process.exit(code))
  try {
    const summary = await runSoak(config, { emit: (r) => process.stdout.write(JSON.stringify(r) + '\n'), log })
    process.stdout.write(JSON.stringify(summary) + '\n')
    process.stderr.write(`${readable(summary)}\n`)
    return 0
  } catch (err) {
    log(`failed: ${(err as Error)?.stack ?? String(err)}`)
    return 1
  } finally {
    killAll('end')
  }
}

main().then((code) => {
  process.exitCode = code
})
