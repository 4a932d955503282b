/**
 * What the driver keeps of the hosts' reports and of its own actions, for accounting.ts:
 * failures and recoveries, read-back mismatches, misdeliveries, peerLost events, each host
 * incarnation's latest counters, the kills and restarts. No I/O.
 */
import type { FailRecord, Kill, MismatchRecord, PeerLostRecord, UpRecord } from './accounting'
import type { MemorySample } from './memory'
import { addCounters, newCounters, type Counters, type Report } from './protocol'

/** Misdeliveries kept one by one for the summary; the rest only counted. */
const KEEP_MISDELIVERED = 20

export class Collector {
  readonly fails: FailRecord[] = []
  readonly ups: UpRecord[] = []
  readonly mismatches: MismatchRecord[] = []
  readonly peerLost: PeerLostRecord[] = []
  readonly peerRecovered: PeerLostRecord[] = []
  readonly misdelivered: Array<{ host: number; t: number; from: string; why: string; payload: string }> = []
  readonly kills: Kill[] = []
  readonly errors: Array<{ host: number; t: number; message: string }> = []
  /** Latest counters per host incarnation, key `host/inc`. */
  readonly #counters = new Map<string, Counters>()
  /** Host → its latest memory sample: the round it is for, the incarnation that took it. */
  readonly memory = new Map<number, { round: number; inc: number; memory: MemorySample }>()
  /** Host → current incarnation. */
  readonly incarnation = new Map<number, number>()
  readonly #opened = new Set<string>()
  readonly #quiet = new Set<string>()

  report(r: Report): void {
    switch (r.ev) {
      case 'ready':
        this.incarnation.set(r.host, r.inc)
        break
      case 'opened':
        this.#opened.add(`${r.host}/${r.inc}`)
        break
      case 'fail':
        this.fails.push({ host: r.host, target: r.target, code: r.code, tStart: r.tStart, tEnd: r.tEnd })
        break
      case 'up':
        this.ups.push({ host: r.host, target: r.target, tEnd: r.tEnd })
        break
      case 'mismatch':
        this.mismatches.push({ host: r.host, target: r.target, tStart: r.tStart, tEnd: r.tEnd, zero: r.zero })
        break
      case 'misdelivered':
        if (this.misdelivered.length < KEEP_MISDELIVERED) this.misdelivered.push({ host: r.host, t: r.t, from: r.from, why: r.why, payload: r.payload })
        break
      case 'peerLost':
        this.peerLost.push({ host: r.host, t: r.t, event: r.event })
        break
      case 'peerRecovered':
        this.peerRecovered.push({ host: r.host, t: r.t, event: r.event })
        break
      case 'counters':
        this.#counters.set(`${r.host}/${r.inc}`, r.counters)
        break
      case 'memory':
        this.memory.set(r.host, { round: r.round, inc: r.inc, memory: r.memory })
        break
      case 'quiet':
        this.#quiet.add(`${r.host}/${r.inc}`)
        break
      case 'error':
        this.errors.push({ host: r.host, t: r.t, message: r.message })
        break
    }
  }

  /** Whether host `host`'s incarnation `inc` has opened its peers. */
  opened(host: number, inc: number): boolean {
    return this.#opened.has(`${host}/${inc}`)
  }

  /** Whether host `host`'s incarnation `inc` has ended its traffic. */
  quiet(host: number, inc: number): boolean {
    return this.#quiet.has(`${host}/${inc}`)
  }

  /** Counters summed over every incarnation of every host, as last reported. */
  totals(): Counters {
    let sum = newCounters()
    for (const c of this.#counters.values()) sum = addCounters(sum, c)
    return sum
  }

  /** Host `host`'s memory sample for round `round` from incarnation `inc`, if it came. */
  sample(host: number, round: number, inc: number | undefined): MemorySample | undefined {
    const m = this.memory.get(host)
    return m && m.round === round && m.inc === inc ? m.memory : undefined
  }

  /** The restart of `host` after its latest kill said ready (`t`), its process having started at `tProcess` and begun its engine at `tEngineStart`. */
  restarted(host: number, ready: { t: number; tProcess: number; tEngineStart: number }): void {
    const k = this.kills.filter((x) => x.host === host).at(-1)
    if (k && k.tReady === null) Object.assign(k, { tReady: ready.t, tProcess: ready.tProcess, tEngineStart: ready.tEngineStart })
  }
}
