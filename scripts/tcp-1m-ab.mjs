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
//     [--xport tcp|shm] [--size BYTES] [--encrypt | --verify]
//
// --encrypt: both builds run sealed (tebench --encrypt, a cluster secret in a temporary
// file), and the baseline of each round is plaintext tcp (--noencrypt, the same secret) on
// build A instead of iperf3: B/A is the sealed speedup, A/base and B/base each build's
// sealed-to-plaintext ratio in the same round.
//
// --verify: the same with both builds checking CRC32Cs end to end (tebench --verify) and
// the baseline unverified tcp on build A.
//
// Each build is loaded through NAPI_RS_NATIVE_LIBRARY_PATH (binding.cjs); copy each addon
// aside after its build (`npm run build:native`). Every iperf3 process is killed by pid.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

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
const encryptAt = args.indexOf('--encrypt');
const encrypt = encryptAt >= 0;
if (encrypt) args.splice(encryptAt, 1);
const verifyAt = args.indexOf('--verify');
const verify = verifyAt >= 0;
if (verify) args.splice(verifyAt, 1);
// The option A and B both run with, measured against build A without it.
const option = encrypt || verify;
// The baseline: build A without the option (--encrypt, --verify), or iperf3 (tcp 1 MiB).
const baseline = option || (xport === 'tcp' && size === 1 << 20);
const baseName = encrypt ? 'plain' : verify ? 'unver' : 'iperf3';
let secretDir;
let secretFile;
if (encrypt) {
  secretDir = mkdtempSync(join(tmpdir(), 'ferry-ab-'));
  secretFile = join(secretDir, 'secret');
  writeFileSync(secretFile, randomBytes(32).toString('hex'), { mode: 0o600 });
  process.on('exit', () => rmSync(secretDir, { recursive: true, force: true }));
}
const [a, b] = args;
if (!a || !b) {
  console.error('usage: node scripts/tcp-1m-ab.mjs OLD.node NEW.node [--rounds N] [--duration S] [--threads 2] [--ops write,read] [--xport tcp|shm] [--size BYTES] [--encrypt | --verify]');
  process.exit(2);
}
const builds = { A: a, B: b };

function engineRun(build, op, withOption = option) {
  const sealing = encrypt ? [`--auth_secret_file=${secretFile}`, withOption ? '--encrypt' : '--noencrypt'] : [];
  if (verify && withOption) sealing.push('--verify');
  const out = execFileSync(
    process.execPath,
    ['--import=tsx', 'bench/tebench.ts', '--local', `--xport_type=${xport}`, `--op_type=${op}`, `--duration=${duration}`,
      `--start_block_size=${size}`, `--max_block_size=${size}`, `--start_num_threads=${threads}`, `--max_num_threads=${threads}`,
      '--total_buffer_size=256M', '--format=json', ...sealing],
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
    const steps = baseline ? ['A', 'B', 'base'] : ['A', 'B'];
    for (let k = 0; k < round % steps.length; k++) steps.push(steps.shift());
    if (baseline && round % 2) steps.reverse();
    const got = {};
    for (const step of steps) {
      if (step !== 'base') got[step] = engineRun(step, op);
      else got.base = option ? engineRun('A', op, false) : await iperf3Run();
    }
    got.base ??= NaN;
    if (!cases.has(op)) cases.set(op, { A: [], B: [], base: [], rA: [], rB: [] });
    const c = cases.get(op);
    c.A.push(got.A);
    c.B.push(got.B);
    c.base.push(got.base);
    c.rA.push(got.A / got.base);
    c.rB.push(got.B / got.base);
    console.error(`round ${round + 1} ${op}: A ${got.A.toPrecision(3)} B ${got.B.toPrecision(3)} ${baseName} ${got.base.toFixed(2)} GB/s (order ${steps.join(' ')})`);
  }
}
const f = (x) => (Number.isFinite(x) ? x.toPrecision(3) : '-');
const baseLabel = encrypt
  ? 'plaintext tcp on A (A and B sealed)'
  : verify
    ? 'unverified tcp on A (A and B verified)'
    : `${threads} x iperf3 -l 1M side by side`;
console.log(`${xport} ${size} B, ${threads} threads, batch 1: medians over ${rounds} interleaved rounds of ${duration} s (A = ${a}, B = ${b}); baseline ${baseLabel}`);
console.log(`op    | A GB/s | B GB/s | B/A  | ${baseName.padStart(6)} GB/s | A/${baseName} | B/${baseName}`);
for (const [op, v] of cases) {
  const la = median(v.A);
  const lb = median(v.B);
  console.log(`${op.padEnd(5)} | ${f(la).padStart(6)} | ${f(lb).padStart(6)} | ${(lb / la).toFixed(2)} | ${f(median(v.base)).padStart(11)} | ${f(median(v.rA)).padStart(8)} | ${f(median(v.rB)).padStart(8)}`);
}
