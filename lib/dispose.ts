/**
 * `Symbol.dispose` and `Symbol.asyncDispose` on a runtime that lacks them (Node 20 before
 * 20.5): defined as Node defines them from 20.5 on, by the registered names
 * `Symbol.for('nodejs.dispose')` and `Symbol.for('nodejs.asyncDispose')`. TypeScript
 * compiles `using` and `await using` to read them at run time, so without them neither
 * works; with these, the classes' `[Symbol.dispose]` and `[Symbol.asyncDispose]` are the
 * symbols a later Node, or a polyfill that follows it, uses. One already there is kept.
 */
const symbols = Symbol as unknown as { dispose?: symbol; asyncDispose?: symbol }
symbols.dispose ??= Symbol.for('nodejs.dispose')
symbols.asyncDispose ??= Symbol.for('nodejs.asyncDispose')

export {}
