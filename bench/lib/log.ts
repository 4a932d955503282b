/** Progress goes to stderr; stdout carries only the JSON result lines. */
export function log(message: string): void {
  process.stderr.write(`[perf] ${message}\n`)
}

/** Writes one result record as a JSON line on stdout. */
export function emit(record: object): void {
  process.stdout.write(JSON.stringify(record) + '\n')
}
