/** Transfer statuses and transports: the values every other module speaks of. */
import type * as Native from '../binding'

/** Transfer status values, with Mooncake TENT's numbering. */
export enum TransferStatus {
  WAITING = 0,
  PENDING = 1,
  INVALID = 2,
  CANCELED = 3,
  COMPLETED = 4,
  TIMEOUT = 5,
  FAILED = 6,
}

/** Transports Ferry knows. */
export type TransportName = 'tcp' | 'shm' | 'rdma'

/** Status of one task: what happened, which transport served it, how many attempts. */
export interface TaskStatus extends Native.TaskStatus {
  status: TransferStatus
}

/** Aggregate status of a batch. */
export interface BatchStatus extends Native.BatchStatus {
  status: TransferStatus
}

/** A transport's number for the binding's all-numbers call: 0 none, 1 tcp, 2 shm, 3 rdma. */
export function transportCode(t: string | undefined | null): number {
  return t === 'tcp' ? 1 : t === 'shm' ? 2 : t === 'rdma' ? 3 : 0
}

const TRANSPORT_BY_CODE: ReadonlyArray<TransportName | undefined> = [undefined, 'tcp', 'shm', 'rdma']

/** The status of a task the binding reported completed as `transport + 256 * attempts`. */
export function completedTask(done: number, length: number): TaskStatus {
  return {
    status: TransferStatus.COMPLETED,
    name: 'COMPLETED',
    transferredBytes: length,
    length,
    transport: TRANSPORT_BY_CODE[done & 0xff],
    attempts: Math.floor(done / 256),
    code: undefined,
    message: undefined,
  }
}

export function toTaskStatus(s: Native.TaskStatus): TaskStatus {
  return {
    status: s.status,
    name: s.name,
    transferredBytes: s.transferredBytes,
    length: s.length,
    transport: s.transport,
    attempts: s.attempts,
    code: s.code ?? undefined,
    message: s.message ?? undefined,
  }
}
