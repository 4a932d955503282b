/**
 * Target mode (no --target_seg_name, no --local): an engine that listens with one buffer,
 * prints the command line initiators should run, and serves until Ctrl-C (or, as the child
 * of --local, until its parent goes away). With --notifi it counts the notifications it
 * received and prints the count at its end.
 */
import { Engine } from '../../index'
import type { Config, EtcdAccess } from './config'
import { initiatorCommand, whereFrom } from './command'
import { authOptions, metadataOptions, reportDisabled, reportHeader, tuningOptions } from './engine-setup'
import { OPTIONS } from './flags'
import { interrupt } from './interrupt'
import { Output } from './output'
import { progress } from './progress'
import { packageRoot, type RunInfo } from './runinfo'

/** The etcd TLS/auth flags again, for the printed initiator command (paths only). */
function etcdFlags(e: EtcdAccess): string[] {
  const flags: Array<[string, string | undefined]> = [
    ['etcd_ca_file', e.caFile],
    ['etcd_cert_file', e.certFile],
    ['etcd_key_file', e.keyFile],
    ['etcd_user', e.user],
    ['etcd_password_file', e.passwordFile],
  ]
  return flags.filter(([, v]) => v !== undefined).map(([k, v]) => `--${k}=${v}`)
}

/** The flags of the command line an initiator runs against this target. */
function initiatorFlags(cfg: Config, segment: string): string[] {
  const parts = [`--target_seg_name=${segment}`]
  if (cfg.metadataType === 'etcd') {
    parts.push('--metadata_type=etcd', `--metadata_url_list=${cfg.metadataUrlList}`, ...etcdFlags(cfg.etcd))
  }
  if (cfg.totalBufferSize !== OPTIONS.total_buffer_size.default) parts.push(`--total_buffer_size=${cfg.totalBufferSize}`)
  if (cfg.xportType) parts.push(`--xport_type=${cfg.xportType}`)
  if (cfg.authSecretFile) parts.push(`--auth_secret_file=${cfg.authSecretFile}`)
  if (cfg.encrypt !== 'auto') parts.push(cfg.encrypt ? '--encrypt' : '--noencrypt')
  return parts
}

/** How long a stopping target waits for queued notifications to reach its listener. */
const HAND_OUT_MS = 5_000

/**
 * Resolves once every notification the engine queued was handed to the listener (counted by
 * `taken`; those dropped for a full queue were never queued), or after `HAND_OUT_MS`.
 */
export async function handedOut(engine: Engine, taken: () => number): Promise<void> {
  const deadline = Date.now() + HAND_OUT_MS
  for (;;) {
    const m = engine.metrics()
    if (taken() >= m.notificationsReceived || Date.now() > deadline) return
    await new Promise((resolve) => setImmediate(resolve))
  }
}

/** Runs target mode; resolves with the exit code once stopped. */
export async function runTarget(cfg: Config, out: Output, info: RunInfo, script: string): Promise<number> {
  // --notifi: room for bursts while JS counts them (a full queue drops, counted and printed).
  const queue = cfg.notifi ? { notifyQueueSize: 1 << 16 } : {}
  const engine = await Engine.create({
    listen: cfg.listen,
    advertise: cfg.advertise,
    ...tuningOptions(cfg),
    ...metadataOptions(cfg),
    ...authOptions(cfg),
    ...queue,
  })
  try {
    // Mooncake's layout is the initiator's table: a target prints in Ferry's.
    const notes = out.format === 'mooncake' ? new Output('table') : out
    reportDisabled(engine, notes)
    reportHeader(engine, notes, 'target', cfg, info)
    const region = engine.allocate(cfg.totalBufferSize)
    void region
    // Notifications are counted as they come (taken, so the queue never fills).
    let received = 0
    engine.on('notification', () => received++)
    // The command names the segment as peers must spell it: the advertised address in
    // p2p, the registered name with etcd.
    const where = whereFrom(script, packageRoot(), process.cwd())
    process.stdout.write(initiatorCommand(where, info.version, initiatorFlags(cfg, engine.segmentName)) + '\n')
    progress.show(`tebench: target ${engine.segmentName} ready (${cfg.totalBufferSize} B); Ctrl-C to stop`)
    // The open engine keeps the process alive while it serves.
    await new Promise<void>((resolve) => {
      const done = () => resolve()
      interrupt.onStop.add(done)
      // Started by --local: leave when the parent goes away.
      if (process.env.FERRY_TEBENCH_CHILD === '1') {
        process.stdin.on('end', done)
        process.stdin.on('error', done)
        process.stdin.resume()
      }
    })
    progress.clear()
    // Notifications the engine took in are handed to listeners a bounded share per turn of
    // the event loop: those still queued when the stop came are counted before the count
    // is printed (bounded), or the count misses the run's last burst.
    await handedOut(engine, () => received)
    if (cfg.notifi || received > 0) {
      notes.notifications({ record: 'notifications', role: 'target', count: received, lost: engine.metrics().notificationsDropped, perSecond: null })
    }
    return 0
  } finally {
    await engine.close()
    if (process.env.FERRY_TEBENCH_CHILD === '1') process.stdin.pause()
  }
}
