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
    { code: PEER_LOST, message: `peer ${peer} lost: ${reason}`, lostPeer: peer, lossReason: LOSS_REASON_NUMBERS.timeout, lossMessage: reason },
    // The same loss again (another task): emitted once.
    { code: PEER_LOST, message: `peer ${peer} lost: ${reason}`, lostPeer: peer, lossReason: LOSS_REASON_NUMBERS.timeout, lossMessage: reason },
  ])
  t.deepEqual(emitted, [['peerLost', { kind: 'peerLost', segment: peer, reason: 'timeout', message: reason }]])
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
  const said = 'the peer closed its engine (it said goodbye)'
  r.deliver({ kind: 'peerLost', segment: 'p:1', reason: said, lossReason: LOSS_REASON_NUMBERS.closed })
  r.explainLosses([{ code: PEER_LOST, message: 'peer p:1 lost: …', lostPeer: 'p:1', lossReason: LOSS_REASON_NUMBERS.closed, lossMessage: said }])
  r.deliver({ kind: 'failover', segment: 'p:1', from: TRANSPORT_NUMBERS.shm, to: TRANSPORT_NUMBERS.tcp, attempt: 1, reason: 'x' })
  t.deepEqual(emitted, [
    ['peerLost', { kind: 'peerLost', segment: 'p:1', reason: 'closed', message: said }],
    ['failover', { kind: 'failover', segment: 'p:1', from: 'shm', to: 'tcp', attempt: 1, reason: 'x' }],
  ])
})

test('peerLost says why by name: closed, crashed, timeout or restarted', (t) => {
  const { relay: r, emitted } = relay()
  const names = ['closed', 'crashed', 'timeout', 'restarted'] as const
  names.forEach((name, i) => {
    r.deliver({ kind: 'peerLost', segment: `p:${i}`, reason: `why ${i}`, lossReason: LOSS_REASON_NUMBERS[name] })
  })
  t.deepEqual(
    emitted.map(([, e]) => (e as { reason: string }).reason),
    [...names],
  )
})

test("a closed segment's failure is no loss: no peerLost, and the peer's real loss later is emitted", (t) => {
  const { relay: r, emitted } = relay()
  r.explainLosses([{ code: ERROR_CODE_NUMBERS.ERR_FERRY_SEGMENT_CLOSED, message: 'segment p:1 was closed' }])
  t.deepEqual(emitted, [])
  r.deliver({ kind: 'peerLost', segment: 'p:1', reason: 'gone', lossReason: LOSS_REASON_NUMBERS.crashed })
  t.deepEqual(emitted, [['peerLost', { kind: 'peerLost', segment: 'p:1', reason: 'crashed', message: 'gone' }]])
})
