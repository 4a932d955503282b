#!/usr/bin/env node
// Interleaved A/B of two builds of the addon on tebench's shm 4 KiB case (batch 1), WRITE
// and READ, 1 and 2 threads: each round runs every case on both builds, the order
// alternating per round (A B, then B A), so that a load that rises or falls during the run
// weighs on both alike. Prints, per case, the median Avg Lat (µs an op, wall time per
// operation of one thread) and Avg Tx (submit to completion) of each build, and B/A.
//
//   node scripts/shm-4k-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 1,2]
//
// Each build is loaded through NAPI_RS_NATIVE_LIBRARY_PATH (binding.cjs); copy each addon
// aside after its build (`npm run build:native`).
import { execFileSync } from 'node:child_process';

const args = process.argv.slice(2);
const flag = (name, dflt) => {
  const i = args.indexOf(name);
  return i < 0 ? dflt : args.splice(i, 2)[1];
};
const rounds = Number(flag('--rounds', '5'));
const duration = flag('--duration', '2');
const threads = flag('--threads', '1,2').split(',').map(Number);
const [a, b] = args;
if (!a || !b) {
  console.error('usage: node scripts/shm-4k-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 1,2]');
  process.exit(2);
}
const builds = { A: a, B: b };
const cases = new Map(); // "op t" -> { A: [{lat, tx}], B: [...] }
for (let round = 0; round < rounds; round++) {
  for (const op of ['write', 'read']) {
    for (const t of threads) {
      for (const build of round % 2 === 0 ? ['A', 'B'] : ['B', 'A']) {
        const out = execFileSync(
          process.execPath,
          ['--import=tsx', 'bench/tebench.ts', '--local', '--xport_type=shm', `--op_type=${op}`, `--duration=${duration}`,
            '--start_block_size=4096', '--max_block_size=4096', `--start_num_threads=${t}`, `--max_num_threads=${t}`,
            '--total_buffer_size=64M', '--json'],
          { env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: builds[build] }, encoding: 'utf8', timeout: 300_000 },
        );
        for (const line of out.split('\n')) {
          if (!line.includes('"record":"case"')) continue;
          const r = JSON.parse(line);
          const key = `${op.toUpperCase()} threads=${t}`;
          if (!cases.has(key)) cases.set(key, { A: [], B: [] });
          cases.get(key)[build].push({ lat: r.avgLatUs, tx: r.avgTxUs });
        }
      }
    }
  }
}
const median = (xs) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const f = (x) => (Number.isFinite(x) ? x.toFixed(3) : '-');
console.log(`shm 4 KiB, batch 1: medians over ${rounds} interleaved rounds of ${duration} s (A = ${a}, B = ${b})`);
console.log('case               | A lat µs | B lat µs | B/A  | A tx µs | B tx µs');
for (const [key, v] of cases) {
  const la = median(v.A.map((x) => x.lat));
  const lb = median(v.B.map((x) => x.lat));
  const ta = median(v.A.map((x) => x.tx));
  const tb = median(v.B.map((x) => x.tx));
  console.log(`${key.padEnd(18)} | ${f(la).padStart(8)} | ${f(lb).padStart(8)} | ${(lb / la).toFixed(2)} | ${f(ta).padStart(7)} | ${f(tb).padStart(7)}`);
}
