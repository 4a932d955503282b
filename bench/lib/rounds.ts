/**
 * Interleaved rounds, the one loop every perf suite measures in. These machines are shared
 * and noisy, so a figure is only compared with a baseline measured in the same run:
 * `--repeat` rounds, each measuring every entry (a case, an engine) with both API methods
 * and then the baselines, odd rounds in that order and even rounds reversed; the warm-up
 * runs in round 1 only. When measuring both methods every round would exceed `--budget`
 * (judged from round 1), rounds 2.. measure only the method that did better in round 1.
 *
 * `runRounds` runs the loop and keeps every result (or error) by entry, method and round;
 * `figures` and `compare` turn them into the per-round figures, medians and ratios of a
 * record. The suites say what a measurement is, what it logs and what the baselines are.
 */
import * as os from 'node:os'
import { log } from './log'
import { median, ratio, round } from './stats'
import type { SuiteOptions } from '../suites/types'

export type Method = 'promise' | 'batch'
export const METHODS: readonly Method[] = ['promise', 'batch']

/** Per-round outcome of one series: a result, an error, or undefined when not measured. */
export type Rounds<T> = Array<T | Error | undefined>

export const isResult = <T>(x: T | Error | undefined): x is T => x !== undefined && !(x instanceof Error)

/** 1-min load average now, for the record. */
export const hostLoad = () => round(os.loadavg()[0], 2)

/** Errors of a series as "round N method: message". */
export function roundErrors<T>(rounds: Rounds<T>, label: string): string[] {
  const out: string[] = []
  rounds.forEach((x, r) => {
    if (x instanceof Error) out.push(`round ${r + 1} ${label}: ${x.message}`)
  })
  return out
}

/** The method whose figures have the better median (ties and all-missing: promise). */
export function betterByMedian(figures: Record<Method, Array<number | null>>, higherIsBetter: boolean): Method {
  const p = median(figures.promise)
  const b = median(figures.batch)
  if (!Number.isFinite(b)) return 'promise'
  if (!Number.isFinite(p)) return 'batch'
  return (higherIsBetter ? b > p : b < p) ? 'batch' : 'promise'
}

/**
 * Whether rounds 2.. can measure both API methods within the budget, judged from the time
 * round 1 (which always measures both, plus the warm-ups) took.
 */
export function bothFit(options: SuiteOptions, phaseStart: number, round1Ms: number): boolean {
  const projected = (Date.now() - phaseStart + (options.repeat - 1) * round1Ms) / 1000
  return projected <= options.budgetSeconds
}

export const ORDER_NOTE = 'rounds alternate the order: odd rounds engine first, even rounds baseline first'

/** The record's `method_choice`: how `method` was picked. */
export const methodChoiceNote = (chosenInRound1: boolean) =>
  chosenInRound1
    ? 'picked in round 1 and used after (both methods every round would exceed --budget)'
    : 'both methods measured every round; the better median'

/** Runs `fn`, logging and returning its error instead of throwing. */
export async function attempt<T>(what: string, fn: () => Promise<T>): Promise<T | Error> {
  try {
    return await fn()
  } catch (err) {
    log(`${what} failed: ${(err as Error).stack ?? String(err)}`)
    return err instanceof Error ? err : new Error(String(err))
  }
}

/** Where a step runs. */
export interface RoundContext {
  /** 0-based round number. */
  round: number
  /** Warm-up seconds before a measurement: `--warmup` in round 1, 0 after. */
  warm: number
  /** Odd rounds (forward) run the steps in order, even rounds reversed. */
  forward: boolean
  /** `<suite>: round <n>/<repeat>`, the prefix of the round's progress lines. */
  tag: string
}

/** What one phase of a suite measures each round. */
export interface RoundsPlan<K extends string, T> {
  /** The suite's name, the first word of every progress line. */
  suite: string
  options: SuiteOptions
  /** What the engine side measures, with both methods, in odd rounds' order (cases, engines). */
  entries: readonly K[]
  /** One measurement of `entry` with method `m`. A throw is kept as that round's error. */
  measure: (entry: K, m: Method, ctx: RoundContext) => Promise<T>
  /** The progress line before a measurement. */
  starting: (entry: K, m: Method, ctx: RoundContext) => string
  /** The progress line after one that succeeded. */
  finished: (entry: K, m: Method, result: T, ctx: RoundContext) => string
  /** Called as each entry's turn comes, before its first method (e.g. to note the host load). */
  onEntry?: (entry: K, ctx: RoundContext) => void
  /**
   * The other steps of a round, after the entries in odd rounds and before them (in reverse
   * order) in even ones: the baselines, or what is measured without a method choice. Each
   * keeps its own results.
   */
  others?: ReadonlyArray<(ctx: RoundContext) => Promise<void>>
  /** A result's figure for the method choice after round 1. */
  figure: (result: T) => number | null
  higherIsBetter: boolean
  /**
   * Whose round-1 figures pick the method when the budget forces a choice: this entry's
   * for every entry, or (unset) each entry its own.
   */
  chooseBy?: K
  /** What the budget line calls the methods (default `methods`; e.g. `latency methods`). */
  methodsName?: string
}

/** Every measurement of a phase. */
export interface RoundsOutcome<K extends string, T> {
  /** By entry, method and round. */
  engine: Record<K, Record<Method, Rounds<T>>>
  /** Set when rounds 2.. measured only this method (budget), by entry. */
  chosen?: Record<K, Method>
}

/** The methods an entry measures in a round: both (alternating their order) or the chosen one. */
function methodsOf<K extends string>(entry: K, ctx: RoundContext, chosen?: Record<K, Method>): Method[] {
  if (chosen) return [chosen[entry]]
  return ctx.forward ? [...METHODS] : [...METHODS].reverse()
}

/** The per-entry method choice from round 1's figures. */
function chooseMethods<K extends string, T>(plan: RoundsPlan<K, T>, engine: RoundsOutcome<K, T>['engine']): Record<K, Method> {
  const pick = (entry: K): Method => {
    const e = engine[entry]
    const fig = (x: T | Error | undefined) => (isResult(x) ? plan.figure(x) : null)
    return betterByMedian({ promise: [fig(e.promise[0])], batch: [fig(e.batch[0])] }, plan.higherIsBetter)
  }
  const byOne = plan.chooseBy === undefined ? undefined : pick(plan.chooseBy)
  return Object.fromEntries(plan.entries.map((e) => [e, byOne ?? pick(e)])) as Record<K, Method>
}

/** Runs the rounds of `plan`; see the top of this file for the order. */
export async function runRounds<K extends string, T>(plan: RoundsPlan<K, T>): Promise<RoundsOutcome<K, T>> {
  const { options } = plan
  const engine = Object.fromEntries(plan.entries.map((e) => [e, { promise: [], batch: [] }])) as unknown as RoundsOutcome<K, T>['engine']
  const outcome: RoundsOutcome<K, T> = { engine }
  const phaseStart = Date.now()
  for (let r = 0; r < options.repeat; r++) {
    const roundStart = Date.now()
    const ctx: RoundContext = {
      round: r,
      warm: r === 0 ? options.warmupSeconds : 0,
      forward: r % 2 === 0,
      tag: `${plan.suite}: round ${r + 1}/${options.repeat}`,
    }
    const entryStep = async (entry: K) => {
      plan.onEntry?.(entry, ctx)
      for (const m of methodsOf(entry, ctx, outcome.chosen)) {
        log(plan.starting(entry, m, ctx))
        const res = await attempt(`${ctx.tag} ${entry} ${m}`, () => plan.measure(entry, m, ctx))
        engine[entry][m][r] = res
        if (isResult(res)) log(plan.finished(entry, m, res, ctx))
      }
    }
    const steps = [...plan.entries.map((e) => () => entryStep(e)), ...(plan.others ?? []).map((step) => () => step(ctx))]
    for (const step of ctx.forward ? steps : steps.reverse()) await step()

    if (r === 0 && options.repeat > 1 && !bothFit(options, phaseStart, Date.now() - roundStart)) {
      const chosen = chooseMethods(plan, engine)
      outcome.chosen = chosen
      const using = plan.chooseBy === undefined ? plan.entries.map((e) => `${e} ${chosen[e]}`).join(', ') : chosen[plan.chooseBy]
      log(`${plan.suite}: both ${plan.methodsName ?? 'methods'} every round would exceed --budget ${options.budgetSeconds} s; using ${using} from round 2`)
    }
  }
  return outcome
}

/** One figure per round (`repeat` of them), rounded to `digits`; null where a round has none. */
export function figures<T>(rounds: ReadonlyArray<T | Error | undefined>, repeat: number, figure: (x: T) => number | null, digits: number): Array<number | null> {
  return Array.from({ length: repeat }, (_, r) => {
    const x = rounds[r]
    const f = isResult(x) ? figure(x) : null
    return f === null ? null : round(f, digits)
  })
}

/** An entry's figures by method. */
export function perMethod<T>(series: Record<Method, Rounds<T>>, repeat: number, figure: (x: T) => number | null, digits: number): Record<Method, Array<number | null>> {
  return { promise: figures(series.promise, repeat, figure, digits), batch: figures(series.batch, repeat, figure, digits) }
}

/** The engine's figures against its baseline's, as a record reports them. */
export interface Comparison {
  /** The method reported: the chosen one, or the one with the better median. */
  method: Method
  /** Its figure per round. */
  rounds: Array<number | null>
  baselineRounds: Array<number | null>
  /** Medians over the rounds, rounded to the figures' digits. */
  value: number | null
  baselineValue: number | null
  /** value / baselineValue. */
  ratio: number | null
  ratioPerRound: Array<number | null>
  /** Median of the per-round ratios. */
  ratioMedian: number | null
}

/**
 * Picks the method (`chosen`, else the better median) and compares its rounds with
 * `baselineOf(method)`'s, round by round and as medians.
 */
export function compare(
  byMethod: Record<Method, Array<number | null>>,
  chosen: Method | undefined,
  higherIsBetter: boolean,
  baselineOf: (method: Method) => Array<number | null>,
  digits: number,
): Comparison {
  const method = chosen ?? betterByMedian(byMethod, higherIsBetter)
  const rounds = byMethod[method]
  const baselineRounds = baselineOf(method)
  const value = round(median(rounds), digits)
  const baselineValue = round(median(baselineRounds), digits)
  const ratioPerRound = rounds.map((v, r) => ratio(v, baselineRounds[r] ?? null))
  return {
    method,
    rounds,
    baselineRounds,
    value,
    baselineValue,
    ratio: ratio(value, baselineValue),
    ratioPerRound,
    ratioMedian: round(median(ratioPerRound), 3),
  }
}
