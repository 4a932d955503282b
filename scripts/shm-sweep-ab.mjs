#!/usr/bin/env node
// Interleaved A/B of two builds of the addon over tebench's default shm sweep (4 KiB to
// 64 MiB), READ and WRITE, 1 thread and the machine's thread count: each round runs every
// case on both builds, the order alternating per round (A B, then B A) so that a load that
// rises or falls during the run weighs on both alike. Prints, per case, the median GB/s of
// each build over the rounds, B/A, and marks a dip: a size more than 10 % slower than the
// next smaller one. 4 KiB also shows the median Avg Lat (µs an op).
//
//   node scripts/shm-sweep-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 1,16]
//
// Each build is loaded through NAPI_RS_NATIVE_LIBRARY_PATH (binding.cjs); run `npm run build`
// first (tebench's JS is dist/bench/tebench.js), and copy each addon aside after its build.
import { execFileSync } from 'node:child_process';
import os from 'node:os';

const args = process.argv.slice(2);
const flag = (name, dflt) => {
  const i = args.indexOf(name);
  return i < 0 ? dflt : args.splice(i, 2)[1];
};
const rounds = Number(flag('--rounds', '3'));
const duration = flag('--duration', '1');
const threads = flag('--threads', [...new Set([1, os.availableParallelism()])].join(','))
  .split(',')
  .map(Number);
const [a, b] = args;
if (!a || !b) {
  console.error('usage: node scripts/shm-sweep-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 1,N]');
  process.exit(2);
}
const builds = { A: a, B: b };
const cases = new Map(); // "op t size" -> { A: [{bw, lat}], B: [...] }
for (let round = 0; round < rounds; round++) {
  for (const op of ['read', 'write']) {
    for (const t of threads) {
      for (const build of round % 2 === 0 ? ['A', 'B'] : ['B', 'A']) {
        const out = execFileSync(
          process.execPath,
          ['dist/bench/tebench.js', '--local', '--xport_type=shm', `--op_type=${op}`, `--duration=${duration}`,
            `--start_num_threads=${t}`, `--max_num_threads=${t}`, '--total_buffer_size=256M', '--json'],
          { env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: builds[build] }, encoding: 'utf8', timeout: 600_000 },
        );
        for (const line of out.split('\n')) {
          if (!line.includes('"record":"case"')) continue;
          const r = JSON.parse(line);
          const key = `${op} ${t} ${r.blockSize}`;
          if (!cases.has(key)) cases.set(key, { A: [], B: [] });
          cases.get(key)[build].push({ bw: r.bwGbps, lat: r.avgLatUs });
        }
      }
    }
  }
}
const median = (xs) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
for (const op of ['read', 'write']) {
  for (const t of threads) {
    console.log(`\nshm ${op.toUpperCase()} threads=${t}: median GB/s over ${rounds} rounds (* = >10 % below the next smaller size)`);
    const prev = {};
    for (const [key, runs] of cases) {
      const [kop, kt, size] = key.split(' ');
      if (kop !== op || Number(kt) !== t) continue;
      let line = size.padStart(9);
      const med = {};
      for (const build of ['A', 'B']) {
        med[build] = median(runs[build].map((r) => r.bw));
        const dip = prev[build] !== undefined && med[build] < 0.9 * prev[build] ? '*' : ' ';
        line += `  ${build} ${med[build].toFixed(2).padStart(7)}${dip}`;
        prev[build] = med[build];
      }
      line += `  B/A ${(med.B / med.A).toFixed(2)}`;
      if (size === '4096') {
        line += `  Avg Lat A ${median(runs.A.map((r) => r.lat)).toFixed(2)} µs, B ${median(runs.B.map((r) => r.lat)).toFixed(2)} µs`;
      }
      console.log(line);
    }
  }
}
