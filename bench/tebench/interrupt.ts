/**
 * Ctrl-C and SIGTERM: the first one stops what runs (the initiator's bench, whose results
 * so far are printed; the target's wait); a second one kills what registered to be forced
 * (the --local child) and exits at once.
 */

export const interrupt = {
  count: 0,
  signal: '' as '' | 'SIGINT' | 'SIGTERM',
  onStop: new Set<() => void>(),
  onForce: new Set<() => void>(),
  install(): void {
    const handler = (sig: 'SIGINT' | 'SIGTERM') => {
      this.count++
      if (this.count === 1) {
        this.signal = sig
        for (const f of this.onStop) f()
      } else {
        for (const f of this.onForce) f()
        process.exit(130) // second Ctrl-C: force (the only process.exit)
      }
    }
    process.on('SIGINT', () => handler('SIGINT'))
    process.on('SIGTERM', () => handler('SIGTERM'))
  },
  get stopped(): boolean {
    return this.count > 0
  },
}
