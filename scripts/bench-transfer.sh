#!/usr/bin/env bash
# The disaggregation transport alone (docs/benchmarks.md "Disaggregation"): `switchyard bench
# transfer` moving a 4,096-token prompt of DeepSeek-V3 rows (61 × 1,152 bytes = 70,272 bytes per
# token, 288 MB) in 512-token chunks from one process to another, against a plain TCP stream of
# the same bytes (Python's socket.sendall) measured in the same run:
#   1. one host (UCX picks TCP on loopback: see docs/architecture.md on shared memory);
#   2. two emulated hosts (scripts/netns-cluster.sh, links shaped to RATE): UCX over TCP.
# Usage: scripts/bench-transfer.sh [RATE (10gbit)] [TRANSFERS (5)]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/switchyard"
rate="${1:-10gbit}"; transfers="${2:-5}"
tmp="${TMPDIR:-/tmp}/bench-transfer"; mkdir -p "$tmp"
bytes=$((4096 * 70272))

# ucx PREFIX_SENDER PREFIX_RECEIVER HOST: prints the sender's median Gbit/s.
ucx() {
  local sender="$1" receiver="$2" host="$3"
  $receiver "$bin" bench transfer --listen "$host:0" --transfers "$transfers" > "$tmp/recv.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q listening "$tmp/recv.log" && break; sleep 0.1; done
  local address; address="$(sed -n 's/listening on //p' "$tmp/recv.log")"
  $sender "$bin" bench transfer --to "$address" --transfers "$transfers" | grep '^{' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["median_gbit_per_s"])'
  wait "$pid"
}
# tcp PREFIX_SENDER PREFIX_RECEIVER HOST: the same bytes over one TCP connection, median Gbit/s.
tcp() {
  local sender="$1" receiver="$2" host="$3" port=47123
  $receiver python3 - "$host" "$port" "$bytes" "$transfers" <<'PY' &
import socket, sys
host, port, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen(1)
c, _ = s.accept(); buf = bytearray(1 << 22); view = memoryview(buf)
for _ in range(k):
    left = n
    while left:
        left -= c.recv_into(view[:min(left, len(buf))])
    c.sendall(b"k")
PY
  local pid=$!
  sleep 0.5
  $sender python3 - "$host" "$port" "$bytes" "$transfers" <<'PY'
import socket, statistics, sys, time
host, port, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = socket.create_connection((host, port)); data = bytes(n); times = []
for _ in range(k):
    t = time.perf_counter(); c.sendall(data); c.recv(1); times.append(time.perf_counter() - t)
print(f"{n * 8 / statistics.median(times) / 1e9:.3f}")
PY
  wait "$pid"
}

echo "== transfer of 4,096 tokens x 70,272 bytes in 512-token chunks, median of $transfers ($(lscpu | sed -n 's/Model name: *//p'), $(nproc) cores)"
printf "%-44s %14s %14s %8s\n" path "UCX Gbit/s" "TCP Gbit/s" ratio
one() { printf "%-44s %14s %14s %8s\n" "$1" "$2" "$3" "$(python3 -c "print(f'{$2 / $3:.2f}')")"; }
base="$(tcp "" "" 127.0.0.1)"
one "one host (loopback)" "$(ucx "" "" 127.0.0.1)" "$base"
netns="$root/scripts/netns-cluster.sh"
if bash "$netns" up 2 "$rate" > /dev/null 2>&1; then
  trap 'bash "$netns" down 2' EXIT
  h0="ip netns exec sy-host0 env UCX_TLS=tcp UCX_NET_DEVICES=eth0"
  h1="ip netns exec sy-host1 env UCX_TLS=tcp UCX_NET_DEVICES=eth0"
  one "two emulated hosts, $rate links" "$(ucx "$h0" "$h1" 10.77.0.2)" \
    "$(tcp "ip netns exec sy-host0" "ip netns exec sy-host1" 10.77.0.2)"
else
  echo "(no network namespaces here: the emulated-host row is left out)"
fi
