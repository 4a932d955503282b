/**
 * The `tcp` suite's round-trip case, against a target engine in a child process:
 *
 *   write-4KiB-rtt   one 4 KiB WRITE in flight, mean µs per op   vs a bare C round trip
 *                    (4 KiB request, 16-byte answer), blocking and polling (same run)
 *
 * The engine side is tebench's native loop (ferry-bench's workers, as `npx tebench` and the
 * blocks suite's tebench cases run it): 1 thread, batch 1, addressing fixed, transport tcp,
 * allocate → submit → poll with backoff → free, one op at a time; its figure is tebench's
 * Avg Tx (the mean time of one op) and P99 Tx. The baseline, bench/baselines/tcp_rtt.c, is
 * what the same exchange costs with nothing in between (two processes, TCP_NODELAY): the
 * client waiting in a blocking read, and busy-polling a non-blocking socket. Rounds are
 * interleaved (odd rounds engine, blocking, polling; even rounds the reverse); `value` and
 * each form's figures are medians over the rounds; `ratio` = engine / the faster form (the
 * one with the lower median mean), lower is better, 1 the floor.
 */
import type { Engine, Region, Segment } from '../../index'
import { RTT_MODES, startTcpRttBaseline, type RttMode, type RttResult } from '../baselines/tcp_rtt'
import { log } from '../lib/log'
import { hostLoad, ORDER_NOTE } from '../lib/rounds'
import { median, ratio, round } from '../lib/stats'
import { STEAL_NOTE, withSteal } from '../lib/steal'
import type { CaseRecord, SuiteOptions } from './types'

const CASE = 'write-4KiB-rtt'
const REQUEST_BYTES = 4096
const ANSWER_BYTES = 16

/** What the case needs of the tcp suite's rig: a tcp-only engine, its region, the target. */
export interface RttRig {
  engine: Engine
  local: Region
  remote: Segment
  remoteBuffer: number
  options: SuiteOptions
}

/** One round: the engine's figures and each C form's, with the steal over each run. */
interface RttRound {
  engineAvgUs: number | null
  engineP99Us: number | null
  engineSteal: number | null
  c: Record<RttMode, (RttResult & { steal: number | null }) | null>
  load: number | null
  errors: string[]
}

/** Median of one C form's figure over the rounds. */
const formMedian = (rounds: RttRound[], mode: RttMode, pick: (r: RttResult) => number) =>
  round(median(rounds.map((r) => (r.c[mode] ? pick(r.c[mode]) : null))), 3)

export async function rttCase(rig: RttRig): Promise<CaseRecord> {
  const { options } = rig
  const c = startTcpRttBaseline(REQUEST_BYTES, ANSWER_BYTES)
  const bench = rig.engine.bench(1)
  const rounds: RttRound[] = []
  try {
    for (let r = 0; r < options.repeat; r++) {
      const warm = r === 0 ? options.warmupSeconds : 0
      const tag = `tcp: round ${r + 1}/${options.repeat} ${CASE}`
      const rd: RttRound = { engineAvgUs: null, engineP99Us: null, engineSteal: null, c: { blocking: null, polling: null }, load: hostLoad(), errors: [] }
      const engineStep = async () => {
        const { result: res, stealPct } = await withSteal(() =>
          bench
            .runCase({
              opcode: 'write',
              blockSize: REQUEST_BYTES,
              batchSize: 1,
              local: rig.local,
              remote: rig.remote,
              remoteBuffer: rig.remoteBuffer,
              stripeBase: 0,
              stripeLen: REQUEST_BYTES,
              addressing: 'fixed',
              transport: 'tcp',
              durationMs: Math.round(options.durationSeconds * 1000),
              warmupMs: Math.round(warm * 1000),
              requestIntervalUs: 0,
            })
            .catch((e: Error) => e),
        )
        rd.engineSteal = stealPct
        if (res instanceof Error) return void rd.errors.push(`engine: ${res.message}`)
        if (res.outcome !== 'ok' || !res.row) return void rd.errors.push(`engine: ${res.outcome} ${res.failure?.reason ?? ''}`.trim())
        if (res.servedLabel !== 'tcp (100 %)') rd.errors.push(`transport: expected tcp, served ${res.servedLabel}`)
        rd.engineAvgUs = res.row.avgTxUs
        rd.engineP99Us = res.row.p99TxUs
        log(`${tag}: engine Avg Tx ${res.row.avgTxUs.toFixed(1)} us, P99 ${res.row.p99TxUs.toFixed(1)} us (${res.row.ops} ops), steal ${stealPct ?? 'n/a'} %`)
      }
      const cStep = (mode: RttMode) => async () => {
        const { result: res, stealPct } = await withSteal(() => c.run(mode, options.durationSeconds, warm).catch((e: Error) => e))
        if (res instanceof Error) return void rd.errors.push(`${mode}: ${res.message}`)
        rd.c[mode] = { ...res, steal: stealPct }
        log(`${tag}: C ${mode} avg ${res.avgUs.toFixed(1)} us, p50 ${res.p50Us.toFixed(1)}, p99 ${res.p99Us.toFixed(1)} (${res.ops} ops), steal ${stealPct ?? 'n/a'} %`)
      }
      const steps = [engineStep, ...RTT_MODES.map(cStep)]
      for (const step of r % 2 === 0 ? steps : steps.reverse()) await step()
      rounds.push(rd)
    }
  } finally {
    bench.stop()
    c.close()
  }
  return rttRecord(rounds, c.label, options)
}

function rttRecord(rounds: RttRound[], label: (mode: RttMode) => string, options: SuiteOptions): CaseRecord {
  const value = round(median(rounds.map((r) => r.engineAvgUs)), 3)
  const forms = Object.fromEntries(
    RTT_MODES.map((m) => [
      m,
      {
        avg_us: formMedian(rounds, m, (x) => x.avgUs),
        p50_us: formMedian(rounds, m, (x) => x.p50Us),
        p99_us: formMedian(rounds, m, (x) => x.p99Us),
        ops: round(median(rounds.map((r) => r.c[m]?.ops ?? null)), 0),
        label: label(m),
      },
    ]),
  ) as Record<RttMode, { avg_us: number | null; p50_us: number | null; p99_us: number | null; ops: number | null; label: string }>
  // The faster form: the lower median mean (blocking where neither has one).
  const faster: RttMode = (forms.polling.avg_us ?? Infinity) < (forms.blocking.avg_us ?? Infinity) ? 'polling' : 'blocking'
  const base = forms[faster].avg_us
  const rec: CaseRecord = {
    suite: 'tcp',
    case: CASE,
    value,
    unit: 'us',
    baseline: label(faster),
    baseline_value: base,
    ratio: ratio(value, base),
    ratio_note: 'engine Avg Tx / the faster C form\'s mean (medians over rounds); lower is better, 1 the floor',
    lower_is_better: true,
    method: 'native tebench loop (ferry-bench workers), 1 thread, batch 1, addressing fixed, one 4 KiB WRITE in flight over tcp',
    engine_avg_us: value,
    engine_p99_us: round(median(rounds.map((r) => r.engineP99Us)), 3),
    faster_form: faster,
    c_blocking: forms.blocking,
    c_polling: forms.polling,
    ratio_blocking: ratio(value, forms.blocking.avg_us),
    ratio_polling: ratio(value, forms.polling.avg_us),
    ratio_p99: ratio(round(median(rounds.map((r) => r.engineP99Us)), 3), forms[faster].p99_us),
    rounds: rounds.map((r) => ({
      engine_avg_us: r.engineAvgUs === null ? null : round(r.engineAvgUs, 3),
      engine_p99_us: r.engineP99Us === null ? null : round(r.engineP99Us, 3),
      c_blocking_avg_us: r.c.blocking?.avgUs ?? null,
      c_polling_avg_us: r.c.polling?.avgUs ?? null,
      host_load: r.load,
      engine_steal_pct: r.engineSteal,
      c_blocking_steal_pct: r.c.blocking?.steal ?? null,
      c_polling_steal_pct: r.c.polling?.steal ?? null,
    })),
    steal_note: STEAL_NOTE,
    request_bytes: REQUEST_BYTES,
    answer_bytes: ANSWER_BYTES,
    seconds: options.durationSeconds,
    repeat: options.repeat,
    warmup_s_round1: options.warmupSeconds,
    order: `${ORDER_NOTE} (engine, C blocking, C polling)`,
    host_load: median(rounds.map((r) => r.load)),
  }
  const errors = rounds.flatMap((r, i) => r.errors.map((e) => `round ${i + 1} ${e}`))
  if (errors.length) rec.error = errors.join('; ')
  return rec
}
