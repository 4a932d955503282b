#!/usr/bin/env bash
# Packs the per-platform package (with the built addon) and the main package, installs
# both tarballs into an empty folder with no cargo or rustc on PATH, and runs
# `npx tebench --local --duration=1` there: what a user on this platform gets from npm.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d /tmp/ferry-pack.XXXXXX)
trap 'rm -rf "$work"' EXIT

triple=linux-x64-gnu
[ -f "ferry.$triple.node" ] || { echo "test-pack: build first (npm run build)" >&2; exit 1; }
[ -f dist/bench/tebench.js ] || { echo "test-pack: build first (npm run build)" >&2; exit 1; }

# The napi-rs flow: the addon goes into its platform package.
cp "ferry.$triple.node" "npm/$triple/"
(cd "npm/$triple" && npm pack --silent --pack-destination "$work" >/dev/null)
npm pack --silent --ignore-scripts --pack-destination "$work" >/dev/null
rm -f "npm/$triple/ferry.$triple.node"

mkdir "$work/app"
cd "$work/app"
echo '{"name":"ferry-pack-check","version":"1.0.0","private":true}' > package.json
# Only node's own directory on PATH: no cargo, no rustc.
node_dir=$(dirname "$(command -v node)")
env -i HOME="$HOME" PATH="$node_dir:/usr/bin:/bin" bash -c '
  set -euo pipefail
  if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "test-pack: cargo/rustc still on PATH" >&2; exit 1
  fi
  npm install --no-audit --no-fund --silent "$0"/ferry-engine-linux-x64-gnu-*.tgz "$0"/ferry-engine-[0-9]*.tgz
  timeout 300 npx --no-install tebench --local --duration=1 --max_block_size=1048576
' "$work"
echo "test-pack: OK (installed from tarballs, ran npx tebench --local without cargo or rustc)"
