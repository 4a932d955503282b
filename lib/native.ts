/**
 * The native binding, loaded once for every module of the API, and its types as the other
 * modules name them (`import type * as Native from './native'`): the binding's own
 * declarations, and the shapes this layer builds from what the binding gives as numbers,
 * with names from the core's tables (`tables.ts`).
 */
import * as path from 'node:path'
import type * as Binding from '../binding'
import { loadBinding } from '../loader'
import type { LossReasonName, OpcodeName, TransportName } from './tables'

export type * from '../binding'

// This module runs from lib/ under the package root (tests, tsx) or from dist/lib/
// (compiled); binding.cjs is at the package root, one or two folders up.
export const native = loadBinding<typeof Binding>([path.join(__dirname, '..'), path.join(__dirname, '..', '..')])

/** Status of one task: the binding's `TaskStatusJs` with names for its numbers. */
export interface TaskStatus {
  /** Raw status (TENT numbering). */
  status: number
  /** Status name. */
  name: string
  /** Bytes moved (a lower bound while pending). */
  transferredBytes: number
  /** Requested bytes. */
  length: number
  /** Transport of the latest attempt. */
  transport?: TransportName
  /** Attempts made. */
  attempts: number
  /** Error code when it did not complete. */
  code?: string
  /** Error message when it did not complete. */
  message?: string
  /** Why the peer was lost, when it failed with `ERR_FERRY_PEER_LOST`. */
  lossReason?: LossReasonName
}

/** Aggregate status of a batch: the binding's `BatchStatusJs` with its status's name. */
export interface BatchStatus {
  /** Raw status. */
  status: number
  /** Status name. */
  name: string
  /** Bytes moved. */
  transferredBytes: number
  /** Tasks in the batch. */
  tasks: number
}

/** One benchmark case: the binding's `BenchCaseJs` with opcode and transport by name. */
export interface BenchCase extends Omit<Binding.BenchCaseJs, 'opcode' | 'transport'> {
  /** "read" or "write". */
  opcode: OpcodeName
  /** Pin every request to this transport. */
  transport?: TransportName
}
