#!/usr/bin/env bash
# The router's benchmarks (docs/benchmarks.md "Routing"), on this machine's cores:
#   1. each placement policy on a shared-prefix load (`switchyard bench serve --dataset
#      shared-prefix`) over INSTANCES instances, fresh ones per policy (caches start empty):
#      cached share of the prompt tokens (from the instances' counters), throughput, TTFT;
#   2. router overhead: TTFT straight to one instance and through the router, concurrency 1 and 64;
#   3. failover: a greedy stream whose instance is killed (-9): the longest gap between two
#      tokens the client sees, against the median gap.
# Usage: scripts/bench-route.sh [INSTANCES (3)] [PROMPTS (160)]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/switchyard"
n="${1:-3}"; prompts="${2:-160}"
model="$root/models/default"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start NAME ARGS…: runs switchyard, waits for its "serving" line, sets $url.
start() {
  local log="/tmp/bench-route-$1.log"; shift
  "$bin" "$@" > "$log" 2>&1 & pids+=($!)
  for _ in $(seq 600); do grep -q "serving" "$log" 2>/dev/null && break; sleep 0.1; done
  url="$(grep -o 'http://[^ ]*' "$log" | head -1)"
}
metric() { curl -s "$1/metrics" | awk -v m="switchyard:$2{" 'index($0, m) == 1 {print $2}'; }
instances() {
  engines=""; urls=()
  for i in $(seq "$n"); do
    local port; port="$(free_port)"
    start "instance$i" --threads 1 serve --model "$model" --port 0 --grpc-port "$port" \
      --kv-cache-tokens 32768
    engines+="${engines:+,}127.0.0.1:$port"; urls+=("$url")
  done
}
stop_all() { cleanup; pids=(); }

echo "== 1. placement policies: shared-prefix, $prompts prompts of 512 tokens (384 shared by 4), 32 out, concurrency 16, $n instances (lscpu: $(lscpu | sed -n 's/Model name: *//p'))"
printf "%-13s %8s %12s %12s %14s %14s\n" policy cached "req/s" "out tok/s" "TTFT med ms" "TTFT p99 ms"
for policy in round_robin least_load power_of_two cache_aware; do
  instances
  start router route --engines "$engines" --port 0 --policy "$policy" --probe-interval 0.1
  "$bin" bench serve --url "$url" --dataset shared-prefix --num-prompts "$prompts" --input-len 512 \
    --output-len 32 --concurrency 16 --num-prefixes $((prompts / 4)) --seed 7 --json > /tmp/bench-route.json
  hits=0; total=0
  for u in "${urls[@]}"; do
    hits=$((hits + $(metric "$u" prefix_cache_hits_total | cut -d. -f1)))
    total=$((total + $(metric "$u" prefix_cache_queries_total | cut -d. -f1)))
  done
  python3 - "$policy" "$hits" "$total" <<'PY'
import json, sys
r = json.load(open("/tmp/bench-route.json"))
policy, hits, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(f"{policy:<13} {hits / max(total, 1):8.2f} {r['request_throughput']:12.2f} {r['output_throughput']:12.1f} "
      f"{r['median_ttft_ms']:14.1f} {r['p99_ttft_ms']:14.1f}")
PY
  stop_all
done

echo "== 2. router overhead: one instance, random 128-token prompts, 32 out"
n=1 instances
direct="${urls[0]}"
start router route --engines "$engines" --port 0 --probe-interval 0.1
routed="$url"
printf "%-12s %10s %16s %16s\n" concurrency path "TTFT med ms" "TPOT med ms"
for c in 1 64; do
  for path in direct router; do
    # Fresh prompts for each run (a seed each): no run finds another's prompts cached.
    target="$direct"; seed=$((c * 10 + 1)); [ "$path" = router ] && target="$routed" && seed=$((seed + 1))
    "$bin" bench serve --url "$target" --num-prompts $((c == 1 ? 40 : 256)) --input-len 128 \
      --output-len 32 --concurrency "$c" --seed "$seed" --json > /tmp/bench-route.json
    python3 - "$c" "$path" <<'PY'
import json, sys
r = json.load(open("/tmp/bench-route.json"))
print(f"{sys.argv[1]:<12} {sys.argv[2]:>10} {r['median_ttft_ms']:16.2f} {r['median_tpot_ms']:16.2f}")
PY
  done
done
stop_all

echo "== 3. failover: kill -9 of the instance holding a greedy stream of 1500 tokens"
n=2 instances
start router route --engines "$engines" --port 0 --policy round_robin --probe-interval 0.1
python3 - "$url" "${pids[0]}" <<'PY'
import json, os, signal, sys, time, urllib.request
url, victim = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "default", "prompt": "ROMEO: But soft", "max_tokens": 1500,
                   "temperature": 0, "ignore_eos": True, "stream": True}).encode()
req = urllib.request.Request(url + "/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
times, killed_at = [], None
with urllib.request.urlopen(req, timeout=300) as r:  # round robin: the first goes to instance 1
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        times.append(time.monotonic())
        if len(times) == 200:
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
gaps = sorted(b - a for a, b in zip(times, times[1:]))
after = next(t for t in times if t > killed_at)
print(f"{len(times)} chunks; kill to the next token {1e3 * (after - killed_at):.1f} ms; "
      f"median gap {1e3 * gaps[len(gaps) // 2]:.2f} ms, longest {1e3 * gaps[-1]:.1f} ms")
PY
