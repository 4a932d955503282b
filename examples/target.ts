/**
 * A target process: allocates a region and serves it until stdin closes.
 * Prints `{"segment": "...", "buffer": N}` when ready.
 */
import { Engine } from '../index'

async function main() {
  const bytes = Number(process.argv[2] ?? 1 << 30)
  const engine = await Engine.create({ listen: '127.0.0.1:0' })
  const region = engine.allocate(bytes)
  region.buffer.fill(0) // touch every page now, not during the transfer
  process.stdout.write(JSON.stringify({ segment: engine.segmentName, buffer: region.id }) + '\n')
  process.stdin.resume()
  process.stdin.on('end', () => void engine.close())
  process.stdin.on('error', () => void engine.close())
}

main().catch((err) => {
  process.stderr.write(`target: ${err?.stack ?? err}\n`)
  process.exitCode = 1
})
