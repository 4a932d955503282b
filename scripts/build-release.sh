#!/usr/bin/env bash
# Release build of this Linux host's addon (linux-x64-gnu, or linux-arm64-gnu on an arm64
# host), the one its npm package ships: linked against
# glibc FERRY_GLIBC_FLOOR (2.17 by default: RHEL/CentOS 7 and later, Ubuntu 14.04 and
# later) instead of this machine's, and stripped. `npm run build:native` builds for this
# machine only (it needs this machine's glibc or newer).
#
# napi-rs's `--cross-compile` builds through cargo-zigbuild, whose `zig cc` links against
# the glibc version named after the target (x86_64-unknown-linux-gnu.2.17). Both tools come
# from PyPI (cargo-zigbuild, ziglang) into target/zig-venv unless they are on PATH already.
set -euo pipefail
cd "$(dirname "$0")/.."

floor=${FERRY_GLIBC_FLOOR:-2.17}
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) triple=x86_64-unknown-linux-gnu platform=linux-x64-gnu ;;
  Linux-aarch64) triple=aarch64-unknown-linux-gnu platform=linux-arm64-gnu ;;
  *) echo "build-release: builds the Linux glibc addons, on a Linux x86_64 or aarch64 host" >&2; exit 1 ;;
esac

if ! command -v cargo-zigbuild >/dev/null || ! { command -v zig >/dev/null || python3 -m ziglang version >/dev/null 2>&1; }; then
  venv=target/zig-venv
  if [ ! -x "$venv/bin/cargo-zigbuild" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'cargo-zigbuild==0.24.1' 'ziglang==0.17.1'
  fi
  # cargo-zigbuild finds zig as `python3 -m ziglang`: the venv's python3 must come first.
  PATH="$(pwd)/$venv/bin:$PATH"
fi

# ferry_build_info names the commit built (FERRY_COMMIT, read by ferry-core at compile time).
FERRY_COMMIT=${FERRY_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
export FERRY_COMMIT

# rdma-sys's bindings are committed (vendor/rdma-sys), so no bindgen runs: no system header
# is needed here beyond what zig brings.
node_modules/.bin/napi build --platform --release --strip --cross-compile \
  --target "$triple.$floor" --manifest-path crates/node/Cargo.toml \
  --output-dir . --js binding.cjs --dts binding.d.ts

addon=ferry.$platform.node
max=$(objdump -T "$addon" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
echo "build-release: $addon needs glibc $max (floor $floor), $(stat -c %s "$addon") bytes"
# Its npm package (npm/<platform>/README.md) claims the floor: no newer glibc symbol ships.
[ "$(printf '%s\n%s\n' "$max" "$floor" | sort -V | tail -1)" = "$floor" ] ||
  { echo "build-release: $addon needs glibc $max, newer than the floor $floor" >&2; exit 1; }
