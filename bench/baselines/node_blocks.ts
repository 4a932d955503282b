/**
 * Pure-Node baseline of a block stream over loopback TCP: what a Node user gets moving the
 * same blocks to another process without Ferry. The server (node_blocks_server.ts) runs in
 * a child process. A call sends its blocks back to back (one frame each: a 12-byte header,
 * and for a write the block's bytes from the local buffer, written without copying) and
 * waits for every answer: one byte per write, the block's bytes per read (copied to the
 * block's local offset). Calls run one after another over one connection, as a Promise API
 * user awaits each `writeBlocks`.
 */
import * as path from 'node:path'
import { connectBaseline } from '../lib/loopback'

export interface BlockCall {
  localOffsets: Float64Array
  remoteOffsets: Float64Array
}

export interface NodeBlocksResult {
  blocks: number
  seconds: number
}

export interface NodeBlocksSession {
  label: string
  /** Cycles through `calls` for `seconds` (after `warmupSeconds` untimed). */
  run(opcode: 'read' | 'write', calls: BlockCall[], blockBytes: number, seconds: number, warmupSeconds: number): Promise<NodeBlocksResult>
  close(): Promise<void>
}

export async function startNodeBlocks(workingSetBytes: number): Promise<NodeBlocksSession> {
  const { sock: s, close } = await connectBaseline('node blocks server', path.join(__dirname, 'node_blocks_server.ts'), {
    FERRY_BENCH_BLOCKS_BYTES: String(workingSetBytes),
  })
  const local = Buffer.alloc(workingSetBytes, 0x3c)
  const header = (op: number, offset: number, length: number) => {
    const h = Buffer.allocUnsafe(12)
    h.writeUInt32LE(op, 0)
    h.writeUInt32LE(offset, 4)
    h.writeUInt32LE(length, 8)
    return h
  }
  /** One call: its frames out, every answer in. */
  const one = (opcode: 'read' | 'write', call: BlockCall, bs: number) =>
    new Promise<void>((resolve, reject) => {
      const n = call.localOffsets.length
      const want = opcode === 'write' ? n : n * bs
      let got = 0
      const onData = (chunk: Buffer) => {
        if (opcode === 'read') {
          // Answers arrive in order: byte `got` of the stream is block got/bs, at got%bs.
          let at = 0
          while (at < chunk.length) {
            const b = Math.floor(got / bs)
            const into = got % bs
            const take = Math.min(bs - into, chunk.length - at)
            chunk.copy(local, call.localOffsets[b] + into, at, at + take)
            at += take
            got += take
          }
        } else got += chunk.length
        if (got >= want) {
          s.off('data', onData)
          s.off('error', reject)
          resolve()
        }
      }
      s.on('data', onData)
      s.once('error', reject)
      s.cork()
      for (let b = 0; b < n; b++) {
        s.write(header(opcode === 'write' ? 1 : 0, call.remoteOffsets[b], bs))
        if (opcode === 'write') s.write(local.subarray(call.localOffsets[b], call.localOffsets[b] + bs))
      }
      s.uncork()
    })
  return {
    label: 'pure Node: one loopback TCP connection (Nagle off), the same block stream framed as 12-byte header (+ payload for writes), one call in flight (node_blocks.ts)',
    async run(opcode, calls, bs, seconds, warmupSeconds) {
      let c = 0
      const warmEnd = Date.now() + warmupSeconds * 1000
      while (Date.now() < warmEnd) await one(opcode, calls[c++ % calls.length], bs)
      let blocks = 0
      const t0 = process.hrtime.bigint()
      const end = Date.now() + seconds * 1000
      while (Date.now() < end) {
        const call = calls[c++ % calls.length]
        await one(opcode, call, bs)
        blocks += call.localOffsets.length
      }
      return { blocks, seconds: Number(process.hrtime.bigint() - t0) / 1e9 }
    },
    close,
  }
}
