/** tebench's native workers and its table layout (the bench crate's, as it is). */
import type * as Native from './native'
import { checkNumber, checkOpcode, describe, invalid, transportNumber } from './checks'
import { call } from './errors'
import { native } from './native'
import { Region } from './region'
import { Segment } from './segment'
import { OPCODE_NUMBERS } from './tables'

/** One tebench case for the native workers. */
export interface BenchCase extends Omit<Native.BenchCase, 'local' | 'segment' | 'peer' | 'extraTargets'> {
  /** This engine's region the workers read into or write from. */
  local: Region
  /** The target's segment. */
  remote: Segment
  /** Further targets: worker i works against target i % (1 + extraTargets.length). */
  extraTargets?: Array<{
    /** A further target's segment. */
    remote: Segment
    /** The buffer of that segment to work against. */
    remoteBuffer: number
  }>
}

/**
 * tebench's columns for one case (the bench crate's report row, as it is).
 * @interface
 */
export type BenchRow = Native.ReportRow
/**
 * One transport's part of a case: bytes and percent.
 * @interface
 */
export type TransportShare = Native.TransportShare
/**
 * Why a case failed: status, transport, peer and request.
 * @interface
 */
export type BenchFailure = Native.BenchFailure
/**
 * A case's outcome.
 * @interface
 */
export type BenchResult = Native.BenchResult

/** Mooncake's table header, two lines: the column names and a line of 160 `-`. */
export function benchMooncakeHeader(): string {
  return native.benchMooncakeHeader()
}

/** A row in Mooncake's layout (left-aligned fixed widths, 6 decimals for GB/s, 1 for µs). */
export function benchMooncakeLine(row: BenchRow): string {
  return call(() => native.benchMooncakeLine(row))
}

/**
 * Native benchmark workers (the tebench runner): `threads` threads that loop allocate →
 * submit → poll (with backoff) → free through the engine, timing every operation.
 */
export class Bench {
  readonly #native: Native.NativeBench
  /** @internal */
  constructor(n: Native.NativeBench) {
    this.#native = n
  }

  /** Runs one case on every worker; a failure stops the gate (later cases return it). */
  async runCase(c: BenchCase): Promise<BenchResult> {
    if (typeof c !== 'object' || c === null) throw invalid(`runCase takes a BenchCase, got ${describe(c)}`)
    const { local, remote, extraTargets, opcode, transport, ...rest } = c
    if (!(local instanceof Region)) throw invalid(`runCase: local must be a Region, got ${describe(local)}`)
    if (!(remote instanceof Segment)) throw invalid(`runCase: remote must be a Segment, got ${describe(remote)}`)
    const op = OPCODE_NUMBERS[checkOpcode('runCase: opcode', opcode)]
    const transportNo = transportNumber('runCase: transport', transport)
    return call(() =>
      this.#native.runCase({
        ...rest,
        opcode: op,
        transport: transportNo,
        local: local.handle,
        segment: remote.handle,
        peer: remote.name,
        extraTargets: extraTargets?.map((t) => ({ segment: t.remote.handle, peer: t.remote.name, remoteBuffer: t.remoteBuffer })),
      }),
    )
  }

  /** Stops the workers; a running case resolves as "stopped" with partial results. */
  stop(): void {
    this.#native.stop()
  }
}

/** Starts `threads` native benchmark workers on an engine (see `Engine.bench`). */
export function startBench(engine: Native.NativeEngine, threads: number): Bench {
  checkNumber('threads', threads, false)
  return new Bench(call(() => new native.NativeBench(engine, threads)))
}
