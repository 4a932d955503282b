/** Bounded waiting for the soak's processes. */

export const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** `p`, or a rejection with code ABORT_ERR after `ms` (`p` is then left to settle unheard). */
export function bounded<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(`no answer in ${ms} ms`), { code: 'ABORT_ERR' })), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

/** Resolves when `p` settles or after `ms`, whichever comes first (no timer left behind). */
export async function within(p: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  await Promise.race([p.catch(() => {}), new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))])
  clearTimeout(timer)
}

/** An error's `code` (a FerryError's, Node's), or ERR_UNKNOWN. */
export function codeOf(err: unknown): string {
  const code = (err as { code?: unknown })?.code
  return typeof code === 'string' ? code : 'ERR_UNKNOWN'
}
