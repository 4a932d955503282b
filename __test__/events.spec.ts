// The event relay on its own (no engine): a peer-loss failure is explained by its fields —
// the lost peer and why — never by reading its message.
import { EventEmitter } from 'node:events'
import test from 'ava'
import { EventRelay, type Emit, type EngineEvents } from '../lib/events'
import { ERROR_CODE_NUMBERS, LOSS_REASON_NUMBERS, TRANSPORT_NUMBERS } from '../lib/tables'

function relay() {
  const emitted: Array<[keyof EngineEvents, unknown]> = []
  const emit: Emit = (name, payload) => {
    emitted.push([name, payload])
    return true
  }
  return { relay: new EventRelay(new EventEmitter(), emit), emitted }
}

const PEER_LOST = ERROR_CODE_NUMBERS.ERR_FERRY_PEER_LOST

test('a peer-loss failure emits peerLost with its own peer and reason, whatever its message says', (t) => {
  const { relay: r, emitted } = relay()
  // A peer name with the message's own wording in it: read out of the message, it would
  // name peer "a" lost for "b lost: …".
  const peer = 'a lost: b'
  const reason = 'no heartbeat answer for 250 ms'
  r.explainLosses([
    undefined,
    { code: ERROR_CODE_NUMBERS.ERR_FERRY_TIMEOUT, message: 'operation timed out' },
    { code: PEER_LOST, message: `peer ${peer} lost: ${reason}`, lostPeer: peer, lossReason: LOSS_REASON_NUMBERS.silent, lossMessage: reason },
    // The same loss again (another task): emitted once.
    { code: PEER_LOST, message: `peer ${peer} lost: ${reason}`, lostPeer: peer, lossReason: LOSS_REASON_NUMBERS.silent, lossMessage: reason },
  ])
  t.deepEqual(emitted, [['peerLost', { kind: 'peerLost', segment: peer, reason }]])
})

test('a message that reads like a peer loss explains nothing without the fields', (t) => {
  const { relay: r, emitted } = relay()
  r.explainLosses([
    { code: PEER_LOST, message: 'peer 10.0.0.2:7000 lost: control connection closed by peer' },
    { code: ERROR_CODE_NUMBERS.ERR_FERRY_IO, message: 'peer 10.0.0.3:7000 lost: reset', lostPeer: undefined },
  ])
  t.deepEqual(emitted, [])
})

test('the native peerLost event and a failure explaining the same loss emit it once', (t) => {
  const { relay: r, emitted } = relay()
  r.deliver({ kind: 'peerLost', segment: 'p:1', reason: 'control connection closed by peer', lossReason: LOSS_REASON_NUMBERS.closed })
  r.explainLosses([{ code: PEER_LOST, message: 'peer p:1 lost: …', lostPeer: 'p:1', lossReason: LOSS_REASON_NUMBERS.closed, lossMessage: 'control connection closed by peer' }])
  r.deliver({ kind: 'failover', segment: 'p:1', from: TRANSPORT_NUMBERS.shm, to: TRANSPORT_NUMBERS.tcp, attempt: 1, reason: 'x' })
  t.deepEqual(emitted, [
    ['peerLost', { kind: 'peerLost', segment: 'p:1', reason: 'control connection closed by peer' }],
    ['failover', { kind: 'failover', segment: 'p:1', from: 'shm', to: 'tcp', attempt: 1, reason: 'x' }],
  ])
})
