/**
 * Engine options: their types (each field's default and bounds live in the core's
 * `EngineConfig`) and their form for the binding.
 */
import type * as Native from './native'

/**
 * Engine settings. Every field is optional; each one's default and bounds are declared
 * once, in the core (`EngineConfig`), and documented in docs/configuration.md. A key that is not an
 * option (a typo such as `peerTimeoutMS`) is refused with `ERR_FERRY_INVALID_ARGUMENT`.
 * @interface
 */
export type EngineOptions = Omit<Native.EngineOptions, 'authSecret' | 'authSecretHex' | 'encrypt'> & {
  /** The cluster secret (a string or its bytes, at least 32 bytes); see docs/security.md. */
  authSecret?: string | Uint8Array
  /**
   * Seal tcp connections — data, control, notifications (AES-256-GCM, per-connection keys
   * from the authenticated handshake): `'auto'` (default) to and from peers beyond
   * loopback, `true` every one, `false` none. See docs/security.md.
   */
  encrypt?: 'auto' | boolean
}
/**
 * What `Engine.create` takes: the engine's settings and, for the start itself, an
 * AbortSignal (`signal`).
 * @interface
 */
export type CreateOptions = EngineOptions & {
  /** Aborts the start: the call rejects with an `AbortError` and no engine is left running. */
  signal?: AbortSignal
}
/**
 * RDMA transport settings. Every field is optional.
 * @interface
 */
export type RdmaOptions = Native.RdmaOptions
/**
 * Fault injection on one transport (seeded, reproducible).
 * @interface
 */
export type FaultOptions = Native.FaultOptions

/** The options as the binding takes them: a secret given as bytes goes as hex. */
export function toNativeOptions(options: EngineOptions): Native.EngineOptions {
  const { authSecret, ...rest } = options
  return authSecret instanceof Uint8Array
    ? { ...rest, authSecretHex: Buffer.from(authSecret.buffer, authSecret.byteOffset, authSecret.byteLength).toString('hex') }
    : authSecret === undefined ? rest : { ...rest, authSecret }
}

/** How many notifications one `notifications()` iterator holds: the engine's receive queue size. */
export function notifyQueueSize(options: EngineOptions): number {
  return typeof options.notifyQueueSize === 'number' ? options.notifyQueueSize : 1024
}
