/**
 * The soak's own single-member etcd (support/etcd.ts, as the tests start theirs): its client
 * port on `host` (the cluster's gateway address), paused and resumed for `--etcd-pause`,
 * started through bench/lib/children.ts so that its process is killed by pid and its folder
 * removed on exit, Ctrl-C or a crash as well as by `stop()`.
 */
import * as fs from 'node:fs'
import { startEtcd as startEtcdProcess, type Etcd } from '../../support/etcd'
import { atCleanup, startChild } from '../lib/children'

export type { Etcd }

export async function startEtcd(host: string, timeoutMs = 30_000): Promise<Etcd> {
  let removeDir: (() => void) | undefined
  const etcd = await startEtcdProcess({
    host,
    timeoutMs,
    name: 'ferry-soak',
    spawn: (command, args, options) => startChild('etcd', command, args, options),
    onStart: (_, dir) => (removeDir = atCleanup(() => fs.rmSync(dir, { recursive: true, force: true }))),
  }).catch((err: unknown) => {
    removeDir?.()
    throw err
  })
  return {
    ...etcd,
    stop: async () => {
      await etcd.stop()
      removeDir?.()
    },
  }
}
