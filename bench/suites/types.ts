/** Shapes shared by the suites of bench/perf.ts. */

/** Settings from the command line, passed to every suite. */
export interface SuiteOptions {
  /** Measured seconds per throughput run (and per iperf3 run). */
  durationSeconds: number
  /** Warm-up seconds before each measurement. */
  warmupSeconds: number
  /** Timed operations per latency method. */
  latencyOps: number
  /** Hard limit on one latency method's timed phase, in seconds. */
  latencyMaxSeconds: number
  /** Outstanding Promise-API requests in throughput runs. */
  window: number
  /** Tasks per batch in batch-API throughput runs. */
  batchTasks: number
  /** Batches outstanding in batch-API throughput runs. */
  batchesInFlight: number
  /**
   * Bytes of the hot working set on each side (a multiple of 1 MiB): the primary throughput
   * cases cycle their 1 MiB blocks through it, small enough to stay in CPU cache, as
   * iperf3's one reused 1 MiB buffer does.
   */
  workingSetBytes: number
  /**
   * Bytes of the cold working set on each side (a multiple of 1 MiB, pre-touched): the
   * `-cold` throughput cases cycle through it, and the 4 KiB latency reads span it.
   */
  coldWorkingSetBytes: number
  /** Whether to measure the `-cold` throughput cases. */
  cold: boolean
  /**
   * `shm` suite: bytes of the working set on each side (a multiple of 1 MiB, pre-touched)
   * that its 1 MiB requests cycle through, and of each of the memcpy baseline's source and
   * destination; the 4 KiB latency writes span it too.
   */
  shmWorkingSetBytes: number
  /** `failover` suite: bytes of the working set on each side (a multiple of 1 MiB, pre-touched). */
  failoverWorkingSetBytes: number
  /** `failover` suite: share of shm completions reported FAILED (corruptCompletionRate). */
  faultRate: number
  /** `failover` suite: seed of the fault injection. */
  faultSeed: number
  /** Rounds per case; each round measures the engine and its baseline back to back. */
  repeat: number
  /**
   * Soft limit, in seconds, on the rounds of one phase (throughput, latency). When measuring
   * both API methods in every round would exceed it, later rounds measure only the method
   * that did better in round 1.
   */
  budgetSeconds: number
  /** `liveness` suite: trials per case. */
  trials: number
  /** `liveness` suite: peerTimeoutMs of the initiator in the silent-loss case. */
  peerTimeoutMs: number
  /** `soak` suite: transfers per case before the first memory reading. */
  soakWarmup: number
  /** `soak` suite: transfers per case measured after the warm-up. */
  soakTransfers: number
  /** `soak` suite: a memory sample every this many transfers. */
  soakSampleEvery: number
  /** `blocks` suite: the cases to run, by name (`--case`); empty: every case. */
  cases: string[]
  /** `scale` suite: submitting thread counts (`--threads`); empty: 1, 2, 4, … up to the cores. */
  scaleThreads: number[]
  /** `scale` suite: block sizes in bytes (`--sizes`). */
  scaleSizes: number[]
  /** `scale` suite: the ops measured (`--ops`). */
  scaleOps: Array<'read' | 'write'>
  /** `scale` suite: the transports measured (`--transports`). */
  scaleTransports: Array<'tcp' | 'shm'>
  /** `scale` suite: whether tcp points also run iperf3 pinned cross-core (`--no-companion`: not). */
  scaleCompanion: boolean
  /** `scale` suite: I/O threads of both engines (`--io-threads`); 0: the engine's default. */
  ioThreads: number
  /** scale: both engines' tcp lanes (`connectionsPerPeer`); 0 = the engine's default. */
  lanes: number
  /** `storm` suite: engines in the storm (`--engines`). */
  stormEngines: number
  /** `storm` suite: processes they are spread over (`--procs`). */
  stormProcs: number
  /** `storm` suite: the bound on each phase, in seconds (`--storm-timeout`). */
  stormTimeoutSeconds: number
  /** `storm` suite: the engines' transports, comma-separated (`--storm-transports`). */
  stormTransports: string
  /** `storm` suite: RLIMIT_NOFILE of each process (`--storm-nofile`); 0: inherited. */
  stormNofile: number
}

/** One result line. Extra fields (per-method figures, CPU use, notes) may follow. */
export interface CaseRecord {
  suite: string
  case: string
  value: number | null
  unit: string
  baseline: string
  baseline_value: number | null
  /** engine / baseline. */
  ratio: number | null
  /** How `value` was obtained, where there is a choice. */
  method?: string
  note?: string
  error?: string
  [extra: string]: unknown
}

/** One result line of a timing suite (`liveness`): statistics over trials, in ms. */
export interface TimingRecord {
  suite: string
  case: string
  median_ms: number | null
  max_ms: number | null
  /** Trials measured. */
  trials: number
  error?: string
  [extra: string]: unknown
}

/** A suite: runs its cases and returns one record per case. */
export type Suite = (options: SuiteOptions) => Promise<Array<CaseRecord | TimingRecord>>
