#!/usr/bin/env node
// Interleaved A/B of two builds of the addon on tebench's tcp 1 MiB case (batch 1,
// addressing fixed, a target child on 127.0.0.1: the scale suite's tcp point), WRITE and
// READ at --threads submitting threads, with N iperf3 client/server pairs side by side
// (`-l 1M`, N = the threads; not -P) as the baseline in the same round. Each round runs
// every case on both builds and the baseline, the order rotating per round, so that a load
// that rises or falls during the run weighs on all alike. Prints, per case, the median
// GB/s of each build, B/A, and each build's median ratio to the baseline of its round.
//
//   node scripts/tcp-1m-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 2] [--ops write,read]
//     [--xport tcp|shm] [--size BYTES]
//
// Each build is loaded through NAPI_RS_NATIVE_LIBRARY_PATH (binding.cjs); copy each addon
// aside after its build (`npm run build:native`). Every iperf3 process is killed by pid.
import { execFileSync, spawn } from 'node:child_process';

const args = process.argv.slice(2);
const flag = (name, dflt) => {
  const i = args.indexOf(name);
  return i < 0 ? dflt : args.splice(i, 2)[1];
};
const rounds = Number(flag('--rounds', '5'));
const duration = Number(flag('--duration', '3'));
const threads = Number(flag('--threads', '2'));
const ops = flag('--ops', 'write,read').split(',');
// Another transport or block size, to check that a change does not cost elsewhere (no
// baseline then: iperf3 is the tcp 1 MiB one).
const xport = flag('--xport', 'tcp');
const size = Number(flag('--size', String(1 << 20)));
const baseline = xport === 'tcp' && size === 1 << 20;
const [a, b] = args;
if (!a || !b) {
  console.error('usage: node scripts/tcp-1m-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 2] [--ops write,read]');
  process.exit(2);
}
const builds = { A: a, B: b };

function engineRun(build, op) {
  const out = execFileSync(
    process.execPath,
    ['--import=tsx', 'bench/tebench.ts', '--local', `--xport_type=${xport}`, `--op_type=${op}`, `--duration=${duration}`,
      `--start_block_size=${size}`, `--max_block_size=${size}`, `--start_num_threads=${threads}`, `--max_num_threads=${threads}`,
      '--total_buffer_size=256M', '--format=json'],
    { env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: builds[build] }, encoding: 'utf8', timeout: 300_000 },
  );
  for (const line of out.split('\n')) {
    if (line.includes('"record":"case"')) return JSON.parse(line).bwGbps;
  }
  throw new Error(`no case record from build ${build} ${op}`);
}

// N iperf3 pairs side by side: each server serves one test (-1), the clients' received
// rates summed (GB/s).
async function iperf3Run() {
  const base = 25200 + Math.floor(Math.random() * 500) * 4;
  const children = [];
  const kill = () => children.forEach((c) => { try { process.kill(c.pid, 'SIGKILL'); } catch {} });
  try {
    for (let i = 0; i < threads; i++) {
      children.push(spawn('iperf3', ['-s', '-1', '-p', String(base + i)], { stdio: 'ignore' }));
    }
    await new Promise((r) => setTimeout(r, 300));
    const clients = Array.from({ length: threads }, (_, i) => new Promise((resolve, reject) => {
      const c = spawn('iperf3', ['-c', '127.0.0.1', '-p', String(base + i), '-l', '1M', '-t', String(duration), '-J'], { stdio: ['ignore', 'pipe', 'ignore'] });
      children.push(c);
      let out = '';
      c.stdout.on('data', (d) => (out += d));
      const timer = setTimeout(() => reject(new Error('iperf3 timed out')), (duration + 20) * 1000);
      c.on('close', () => {
        clearTimeout(timer);
        try { resolve(JSON.parse(out).end.sum_received.bits_per_second / 8e9); } catch (e) { reject(e); }
      });
    }));
    return (await Promise.all(clients)).reduce((s, g) => s + g, 0);
  } finally {
    kill();
  }
}

const median = (xs) => {
  const s = xs.filter(Number.isFinite).sort((x, y) => x - y);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const cases = new Map(); // op -> { A: [gbps], B: [gbps], rA: [ratio], rB: [ratio] }
for (let round = 0; round < rounds; round++) {
  for (const op of ops) {
    const steps = baseline ? ['A', 'B', 'iperf3'] : ['A', 'B'];
    for (let k = 0; k < round % steps.length; k++) steps.push(steps.shift());
    if (baseline && round % 2) steps.reverse();
    const got = {};
    for (const step of steps) got[step] = step === 'iperf3' ? await iperf3Run() : engineRun(step, op);
    got.iperf3 ??= NaN;
    if (!cases.has(op)) cases.set(op, { A: [], B: [], base: [], rA: [], rB: [] });
    const c = cases.get(op);
    c.A.push(got.A);
    c.B.push(got.B);
    c.base.push(got.iperf3);
    c.rA.push(got.A / got.iperf3);
    c.rB.push(got.B / got.iperf3);
    console.error(`round ${round + 1} ${op}: A ${got.A.toPrecision(3)} B ${got.B.toPrecision(3)} iperf3x${threads} ${got.iperf3.toFixed(2)} GB/s (order ${steps.join(' ')})`);
  }
}
const f = (x) => (Number.isFinite(x) ? x.toPrecision(3) : '-');
console.log(`${xport} ${size} B, ${threads} threads, batch 1: medians over ${rounds} interleaved rounds of ${duration} s (A = ${a}, B = ${b}); baseline ${threads} x iperf3 -l 1M side by side`);
console.log('op    | A GB/s | B GB/s | B/A  | iperf3 GB/s | A/iperf3 | B/iperf3');
for (const [op, v] of cases) {
  const la = median(v.A);
  const lb = median(v.B);
  console.log(`${op.padEnd(5)} | ${f(la).padStart(6)} | ${f(lb).padStart(6)} | ${(lb / la).toFixed(2)} | ${f(median(v.base)).padStart(11)} | ${f(median(v.rA)).padStart(8)} | ${f(median(v.rB)).padStart(8)}`);
}
