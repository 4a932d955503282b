#!/usr/bin/env node
// Interleaved A/B of two builds of the addon over tebench's default shm sweep (4 KiB to
// 64 MiB), READ and WRITE, 1 thread and the machine's thread count: each round runs every
// case on both builds, the order alternating per round (A B, then B A) so that a load that
// rises or falls during the run weighs on both alike, and memcpy of every size on as many
// threads (bench/baselines/memcpy_bench.c, its working set one block per thread as
// tebench's `fixed` addressing) between them. Prints, per case, the median GB/s of each
// build and of memcpy over the rounds, B/A, and marks a dip: a size more than 10 % slower
// than the next smaller one and more than 10 % below memcpy's step at the same sizes, and
// below memcpy on every core there (bench/lib/sweep-dips.ts), so that a fall the caches or
// the memory make memcpy take too is not counted. 4 KiB also shows the median Avg Lat (µs an op).
//
//   node scripts/shm-sweep-ab.mjs OLD.node [NEW.node] [--rounds N] [--duration S] [--threads 1,16]
//
// With one build, its sweep alone against memcpy (the done-when check). Each build is loaded
// through NAPI_RS_NATIVE_LIBRARY_PATH (binding.cjs); run `npm run build` first (tebench's JS
// is dist/bench/tebench.js, the judgment dist/bench/lib/sweep-dips.js), and copy each addon
// aside after its build. Exits 1 where the last build shows a dip.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const { sweepSteps } = createRequire(import.meta.url)(path.join(root, 'dist/bench/lib/sweep-dips.js'));

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
// memcpy on every core: the memory's limit (bench/lib/sweep-dips.ts).
const allCores = os.availableParallelism();
const [a, b] = args;
if (!a) {
  console.error('usage: node scripts/shm-sweep-ab.mjs OLD.node [NEW.node] [--rounds N] [--duration S] [--threads 1,N]');
  process.exit(2);
}
const builds = b ? { A: a, B: b } : { A: a };
const names = Object.keys(builds);

// memcpy_bench, built once into a directory removed at exit.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shm-sweep-memcpy-'));
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
const memcpyBin = path.join(dir, 'memcpy_bench');
execFileSync('gcc', ['-O2', '-pthread', '-o', memcpyBin, path.join(root, 'bench/baselines/memcpy_bench.c')], { timeout: 120_000 });

const cases = new Map(); // "op t size" -> { A: [{bw, lat}], B: [...] }
const memcpy = new Map(); // "t size" -> [GB/s]
const sizes = new Set();
const tebench = (op, t, build) =>
  execFileSync(
    process.execPath,
    [path.join(root, 'dist/bench/tebench.js'), '--local', '--xport_type=shm', `--op_type=${op}`, `--duration=${duration}`,
      `--start_num_threads=${t}`, `--max_num_threads=${t}`, '--total_buffer_size=256M', '--json'],
    { env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: builds[build] }, encoding: 'utf8', timeout: 600_000 },
  );
const memcpyRun = (t) => {
  for (const size of [...sizes].sort((x, y) => x - y)) {
    const out = execFileSync(memcpyBin, ['--threads', String(t), String(size), String(size), duration, '0.2'], {
      encoding: 'utf8',
      timeout: 120_000,
    });
    const key = `${t} ${size}`;
    if (!memcpy.has(key)) memcpy.set(key, []);
    memcpy.get(key).push(JSON.parse(out).gbps);
  }
};
for (let round = 0; round < rounds; round++) {
  for (const op of ['read', 'write']) {
    for (const t of threads) {
      const order = round % 2 === 0 ? names : [...names].reverse();
      for (const [i, build] of order.entries()) {
        for (const line of tebench(op, t, build).split('\n')) {
          if (!line.includes('"record":"case"')) continue;
          const r = JSON.parse(line);
          const key = `${op} ${t} ${r.blockSize}`;
          sizes.add(r.blockSize);
          if (!cases.has(key)) cases.set(key, { A: [], B: [] });
          cases.get(key)[build].push({ bw: r.bwGbps, lat: r.avgLatUs });
        }
        // memcpy between the builds (after the first: it needs the sizes), on as many
        // threads and on every core.
        if (op === 'read' && i === 0) {
          memcpyRun(t);
          if (!threads.includes(allCores) && t === threads[0]) memcpyRun(allCores);
        }
      }
    }
  }
}
const median = (xs) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const pct = (step) => (step === null ? '     ' : `${((step - 1) * 100).toFixed(0).padStart(4)}%`);
let lastDips = 0;
for (const op of ['read', 'write']) {
  for (const t of threads) {
    console.log(
      `\nshm ${op.toUpperCase()} threads=${t}: median GB/s over ${rounds} rounds, step from the next smaller size ` +
        '(* = dip: >10 % down, >10 % below memcpy\'s step and below memcpy on every core)',
    );
    const rows = [...cases].filter(([key]) => key.startsWith(`${op} ${t} `)).map(([key, runs]) => [Number(key.split(' ')[2]), runs]);
    const mem = rows.map(([size]) => median(memcpy.get(`${t} ${size}`) ?? []));
    const limit = rows.map(([size]) => median(memcpy.get(`${allCores} ${size}`) ?? []));
    const judged = {};
    for (const build of names) {
      judged[build] = sweepSteps(
        rows.map(([size, runs], i) => ({ size, engine: median(runs[build].map((r) => r.bw)), memcpy: mem[i], memoryLimit: limit[i] })),
      );
    }
    rows.forEach(([size, runs], i) => {
      let line = String(size).padStart(9) + `  memcpy ${mem[i].toFixed(2).padStart(7)} ${pct(judged.A[i].memcpyStep)}`;
      if (t !== allCores) line += ` (${allCores} cores ${limit[i].toFixed(2).padStart(7)})`;
      for (const build of names) {
        const s = judged[build][i];
        line += `  ${build} ${median(runs[build].map((r) => r.bw)).toFixed(2).padStart(7)} ${pct(s.engineStep)}${s.dip ? '*' : ' '}`;
      }
      if (b) line += `  B/A ${(median(runs.B.map((r) => r.bw)) / median(runs.A.map((r) => r.bw))).toFixed(2)}`;
      if (size === 4096) {
        line += `  Avg Lat ${names.map((n) => `${n} ${median(runs[n].map((r) => r.lat)).toFixed(2)}`).join(', ')} µs`;
      }
      console.log(line);
    });
    lastDips += judged[names.at(-1)].filter((s) => s.dip).length;
  }
}
console.log(`\n${names.at(-1)}: ${lastDips} dip(s)`);
process.exitCode = lastDips > 0 ? 1 : 0;
