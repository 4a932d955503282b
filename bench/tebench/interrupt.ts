/**
 * Ctrl-C and SIGTERM: the first one stops what runs (the initiator's bench, whose results
 * so far are printed; the target's wait); a second one kills what registered to be forced
 * (the --local child) and calls what main gave `install` to end the process: only main
 * chooses the exit code.
 */

export const interrupt = {
  count: 0,
  signal: '' as '' | 'SIGINT' | 'SIGTERM',
  onStop: new Set<() => void>(),
  onForce: new Set<() => void>(),
  install(forceExit: () => void): void {
    const handler = (sig: 'SIGINT' | 'SIGTERM') => {
      this.count++
      if (this.count === 1) {
        this.signal = sig
        for (const f of this.onStop) f()
      } else {
        for (const f of this.onForce) f()
        forceExit()
      }
    }
    process.on('SIGINT', () => handler('SIGINT'))
    process.on('SIGTERM', () => handler('SIGTERM'))
  },
  get stopped(): boolean {
    return this.count > 0
  },
}
