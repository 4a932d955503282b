#!/usr/bin/env bash
# Runs Ferry's RDMA transport on real NICs, where this machine has them:
#   1. the real-provider tests of crates/verbs (`cargo test -p ferry-verbs hw_`),
#   2. a two-process tebench rdma run on the HCA (loopback through the NIC),
#   3. ib_write_bw on the same device for comparison, when perftest is installed.
# Elsewhere it says why it skipped and exits 0. Needs a built checkout (npm ci).
set -uo pipefail
cd "$(dirname "$0")/.."

say() { echo "rdma-hw-check: $*"; }

if ! command -v ibv_devices >/dev/null 2>&1; then
  say "skipped: ibv_devices is not installed (apt-get install ibverbs-utils)"
  exit 0
fi
listing=$(ibv_devices 2>&1)
devices=$(printf '%s\n' "$listing" | awk 'NR > 2 && NF { print $1 }')
if [ -z "$devices" ]; then
  say "skipped: ibv_devices lists no RDMA device ($(printf '%s' "$listing" | head -n 1))"
  exit 0
fi
device=${FERRY_RDMA_DEVICE:-$(printf '%s\n' "$devices" | head -n 1)}
say "devices: $(echo $devices) — using $device"
command -v ibv_devinfo >/dev/null 2>&1 &&
  ibv_devinfo -d "$device" | grep -E 'hca_id|fw_ver|state|active_mtu|link_layer' || true

status=0

say "1/3 real-provider tests (cargo test -p ferry-verbs hw_)"
if ! FERRY_RDMA_DEVICE="$device" timeout 600 cargo test -q -p ferry-verbs hw_ -- --nocapture; then
  say "real-provider tests FAILED"
  status=1
fi

say "2/3 tebench over rdma, two processes on $device"
out=$(mktemp -d)
export FERRY_RDMA_PROVIDER=ibverbs
timeout 120 npx --no-install tebench --rpc_server_port=0 --total_buffer_size=1G >"$out/target.log" 2>&1 &
target=$!
segment=""
for _ in $(seq 1 200); do
  segment=$(grep -o -- '--target_seg_name=[^ ]*' "$out/target.log" 2>/dev/null | head -n 1 | cut -d= -f2)
  [ -n "$segment" ] && break
  sleep 0.1
done
if [ -z "$segment" ]; then
  say "tebench target did not start: $(cat "$out/target.log")"
  status=1
else
  if ! timeout 300 npx --no-install tebench --target_seg_name="$segment" --xport_type=rdma \
    --op_type=write --start_block_size=65536 --max_block_size=1048576 \
    --start_num_threads=1 --max_num_threads=4 --total_buffer_size=1G --duration=3; then
    say "tebench rdma run FAILED"
    status=1
  fi
fi
kill "$target" 2>/dev/null
wait "$target" 2>/dev/null
rm -rf "$out"

say "3/3 ib_write_bw on $device at 1 MiB (the line-rate reference)"
if command -v ib_write_bw >/dev/null 2>&1; then
  timeout 60 ib_write_bw -d "$device" -s 1048576 -D 3 >/dev/null 2>&1 &
  server=$!
  sleep 1
  timeout 60 ib_write_bw -d "$device" -s 1048576 -D 3 localhost || say "ib_write_bw client failed"
  wait "$server" 2>/dev/null
else
  say "ib_write_bw not installed (apt-get install perftest): no line-rate reference"
fi

exit $status
