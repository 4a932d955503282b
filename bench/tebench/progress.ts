/**
 * The progress line: which case of how many runs now and about how long the sweep has
 * left, rewritten in place on stderr, and only when stderr is a terminal (never in a pipe
 * or a file, where it would be noise among the results). While a case runs the line ticks
 * once a second.
 */

/** What the line is written to: stderr, or a test's stand-in. */
export interface ProgressStream {
  isTTY?: boolean
  write(text: string): unknown
}

/** `[3/18] write 16384 B × 1, 1 thread over shm, 12 s left`. Pure. */
export function progressText(done: number, total: number, what: string, leftS: number): string {
  const left = leftS >= 90 ? `${Math.round(leftS / 60)} min left` : `${Math.max(0, Math.round(leftS))} s left`
  return `tebench: [${done + 1}/${total}] ${what}, ${left}`
}

export class Progress {
  #tick: NodeJS.Timeout | undefined
  constructor(readonly stream: ProgressStream) {}

  get tty(): boolean {
    return Boolean(this.stream.isTTY)
  }

  /** Shows `text` in place of the last line. */
  show(text: string): void {
    if (this.tty) this.stream.write(`\r\x1b[K${text}`)
  }

  /**
   * Case `done` (0-based) of `total` starts, each case `caseS` seconds long: the line,
   * then a tick each second counting down the time left.
   */
  caseStarts(done: number, total: number, what: string, caseS: number): void {
    this.#stop()
    if (!this.tty) return
    const started = Date.now()
    const draw = () => {
      const intoCase = Math.min((Date.now() - started) / 1000, caseS)
      this.show(progressText(done, total, what, (total - done) * caseS - intoCase))
    }
    draw()
    this.#tick = setInterval(draw, 1000)
    this.#tick.unref()
  }

  /** Erases the line (before results are printed, and at the end). */
  clear(): void {
    this.#stop()
    if (this.tty) this.stream.write('\r\x1b[K')
  }

  #stop(): void {
    clearInterval(this.#tick)
    this.#tick = undefined
  }
}

/** The progress line of this process, on stderr. */
export const progress = new Progress(process.stderr)
