/**
 * What both roles set up on their Engine from the Config: the metadata service, the cluster
 * secret, the transports, the run's header once the engine is up, and the report of
 * transports that could not be installed.
 */
import { readFileSync } from 'node:fs'
import type { Engine, EngineOptions, TransportName } from '../../index'
import type { Config } from './config'
import type { Output, SpreadRecord } from './output'
import type { RunInfo } from './runinfo'

/** Engine options of the metadata flags. */
export function metadataOptions(cfg: Config): EngineOptions {
  if (cfg.metadataType !== 'etcd') return {}
  const e = cfg.etcd
  return {
    metadata: `etcd://${cfg.metadataUrlList}`,
    segmentName: cfg.localServerName || undefined,
    etcdCaFile: e.caFile,
    etcdCertFile: e.certFile,
    etcdKeyFile: e.keyFile,
    etcdUser: e.user,
    etcdPasswordFile: e.passwordFile,
  }
}

/** The secret of `--auth_secret_file` (read here; the secret never is on a command line). */
export function authOptions(cfg: Config): { authSecret?: Buffer; encrypt?: 'auto' | boolean } {
  const encrypt = cfg.encrypt === 'auto' ? {} : { encrypt: cfg.encrypt }
  if (!cfg.authSecretFile) return encrypt
  let secret = readFileSync(cfg.authSecretFile)
  if (secret.at(-1) === 0x0a) secret = secret.subarray(0, secret.at(-2) === 0x0d ? -2 : -1)
  return { authSecret: secret, ...encrypt }
}

/** Engine options of the Ferry tuning flags (`--tcp_lanes`, `--verify`). */
export function tuningOptions(cfg: Config): EngineOptions {
  return { connectionsPerPeer: cfg.tcpLanes, verify: cfg.verify || undefined }
}

/**
 * Engine transports for `--xport_type`: only that transport (no fallback), else the
 * engine's default set.
 */
export function engineTransports(xport: TransportName | undefined): TransportName[] | undefined {
  return xport ? [xport] : undefined
}

/**
 * The run's header: what produced it (`info`), the role and what it asked for, then the
 * engines' lines — --local's target's (`others`) and this one's, as the engine reports
 * what it spreads its work over.
 */
export function reportHeader(
  engine: Engine,
  out: Output,
  role: 'initiator' | 'target',
  cfg: Config,
  info: RunInfo,
  others: SpreadRecord[] = [],
): void {
  const { name, ...rest } = info
  out.header({ record: 'header', tool: 'tebench', package: name, ...rest, role, requested: cfg.xportType ?? 'auto', addressing: cfg.addressing })
  for (const r of others) out.spread(r)
  out.spread({ record: 'engine', role, ...engine.spread() })
}

/** Reports every transport that was enabled but could not be installed, with the reason. */
export function reportDisabled(engine: Engine, out: Output): void {
  engine.on('transportDisabled', (e) => {
    if (e.segment === undefined) out.disabled({ record: 'transportDisabled', transport: e.transport, reason: e.reason })
  })
}
