/**
 * Ferry: a data transfer engine for Node.js clusters.
 *
 * A process registers memory; another reads or writes it by segment name and offset.
 * This module wraps the native binding with Node conventions: Promises, AbortSignal,
 * events, and errors that carry a stable `code`.
 */
// The API lives in lib/, one concept per module; this file only names what is public.
export { Bench, benchMooncakeHeader, benchMooncakeLine } from './lib/bench'
export type { BenchCase, BenchFailure, BenchResult, BenchRow, TransportShare } from './lib/bench'
export type { BatchBlockList, BlockArray, BlockFailure, BlockList, BlocksRequest, BlocksResult, BlockSubmission } from './lib/blocks'
export { Engine } from './lib/engine'
export { FerryError } from './lib/errors'
export type { FerryErrorCode } from './lib/errors'
export type {
  EngineEvent,
  EngineEvents,
  FailoverEvent,
  LossReasonName,
  Notification,
  NotificationsDroppedEvent,
  PeerLostEvent,
  PeerRecoveredEvent,
  TransportDisabledEvent,
} from './lib/events'
export type { BytesByTransport, EngineMetrics, EngineSpread } from './lib/metrics'
export type { NotifyData, NotifyOptions } from './lib/notifications'
export type { CreateOptions, EngineOptions, FaultOptions, RdmaOptions } from './lib/options'
export { MAX_VIEW_BYTES, Region } from './lib/region'
export type { CallOptions, IoRequest, TransferRequest, TransferResult } from './lib/requests'
export { Segment } from './lib/segment'
export type { RemoteBuffer } from './lib/segment'
export { TransferStatus } from './lib/status'
export { TRANSFER_CHANNEL, transferChannel } from './lib/tracing'
export type { TransferTraceContext } from './lib/tracing'
export type { BatchStatus, TaskStatus, TransportName } from './lib/status'
