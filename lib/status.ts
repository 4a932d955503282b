/**
 * Transfer statuses and transports: the values every other module speaks of, named by the
 * core's tables (`tables.ts`) from the numbers the binding gives.
 */
import { codeName } from './errors'
import type * as Native from './native'
import { LOSS_REASON_NAMES, STATUS_NAMES, TRANSPORT_NAMES, type StatusName, type STATUS_NUMBERS } from './tables'

/** Transfer status values, with Mooncake TENT's numbering. */
export enum TransferStatus {
  /** Not started yet. */
  WAITING = 0,
  /** In progress (possibly being retried on another transport). */
  PENDING = 1,
  /** Bad parameters. */
  INVALID = 2,
  /** Canceled by the caller (an aborted signal), by closing its segment, or by engine close. */
  CANCELED = 3,
  /** Done: every byte moved. */
  COMPLETED = 4,
  /** The last attempt passed its deadline (`attemptTimeoutMs`). */
  TIMEOUT = 5,
  /** Failed: transport error, peer lost, or the failover budget ran out. */
  FAILED = 6,
}

// TransferStatus is the core's table of statuses: each name with the core's number, and
// no other name (checked by the compiler).
TransferStatus satisfies { readonly [K in StatusName]: (typeof STATUS_NUMBERS)[K] }
true satisfies [Exclude<keyof typeof TransferStatus, StatusName>] extends [never] ? true : false

export type { TransportName } from './tables'

/** Status of one task: what happened, which transport served it, how many attempts. */
export interface TaskStatus extends Native.TaskStatus {
  status: TransferStatus
}

/** Aggregate status of a batch. */
export interface BatchStatus extends Native.BatchStatus {
  status: TransferStatus
}

/** A status's name (the core's; a number it does not know reads as itself). */
function statusName(status: number): string {
  return STATUS_NAMES[status] ?? String(status)
}

/** The status of a task the binding reported completed as `transport + 256 * attempts`. */
export function completedTask(done: number, length: number): TaskStatus {
  return {
    status: TransferStatus.COMPLETED,
    name: statusName(TransferStatus.COMPLETED),
    transferredBytes: length,
    length,
    transport: TRANSPORT_NAMES[done & 0xff],
    attempts: Math.floor(done / 256),
    code: undefined,
    message: undefined,
    lossReason: undefined,
  }
}

/** A task's status from the binding's numbers, with the names from the core's tables. */
export function toTaskStatus(s: Native.TaskStatusJs): TaskStatus {
  return {
    status: s.status,
    name: statusName(s.status),
    transferredBytes: s.transferredBytes,
    length: s.length,
    transport: TRANSPORT_NAMES[s.transport],
    attempts: s.attempts,
    code: s.error ? codeName(s.error.code) : undefined,
    message: s.error?.message ?? undefined,
    lossReason: s.error?.lossReason == null ? undefined : LOSS_REASON_NAMES[s.error.lossReason],
  }
}

/** A batch's status from the binding's, with its status's name. */
export function toBatchStatus(s: Native.BatchStatusJs): BatchStatus {
  return { status: s.status, name: statusName(s.status), transferredBytes: s.transferredBytes, tasks: s.tasks }
}
