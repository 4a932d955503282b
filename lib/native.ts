/** The native binding, loaded once for every module of the API. */
import * as path from 'node:path'
import type * as Native from '../binding'
import { loadBinding } from '../loader'

// This module runs from lib/ under the package root (tests, tsx) or from dist/lib/
// (compiled); binding.cjs is at the package root, one or two folders up.
export const native = loadBinding<typeof Native>([path.join(__dirname, '..'), path.join(__dirname, '..', '..')])
