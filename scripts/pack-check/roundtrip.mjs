// An ES module user: named and default imports by name (Node's CommonJS interop), then
// roundtrip.cjs's check on the imported bindings.
import assert from 'node:assert/strict'
import ferry, { Engine, FerryError, TransferStatus } from 'ferry-engine'
import { roundtrip } from './roundtrip.cjs'

assert.equal(ferry.Engine, Engine)
await roundtrip({ Engine, FerryError, TransferStatus }, 9)
console.log('pack-check: import from ferry-engine moved 64 KiB')
