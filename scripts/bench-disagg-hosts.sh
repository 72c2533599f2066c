#!/usr/bin/env bash
# Disaggregation with one side an mpirun job spread over machines: where a request's latent rows
# travel (docs/benchmarks.md "A decode job's groups receive their own rows"). Two builds side by
# side on the same emulated hosts (scripts/netns-cluster.sh: network namespaces on a bridge,
# every host link shaped to RATE per direction, TCP between them). JOB=decode (the default):
#   host 0, host 1: `serve --role decode` as an mpirun job of two ranks (EP2, DP groups 0 and 1)
#   host 2:         `serve --role prefill`, one process
#   host 3:         `switchyard route --prefill-engines … --decode-engines group0,group1`
# JOB=prefill: the prefill side is the two-rank job on hosts 0 and 1, and decode one process on
# host 2.
# and this machine's own namespace runs the loads against the router, as bench-disagg.sh does:
#   DECODE streams: DECODE_PROMPTS (64) prompts of 64 tokens, DECODE_OUT (128) out, Poisson
#                   DECODE_RATE (4)/s;
#   LONG prompts:   LONG_PROMPTS (12) of LONG_LEN (1,536) tokens, 16 out, Poisson LONG_RATE (1)/s,
#                   from LONG_DELAY (2) s on, so every long prompt's rows arrive while streams
#                   decode on both groups.
# A build before 5ac8e99 receives every row on rank 0 and broadcasts it to every rank inside the
# job's lockstep loop (each rank waits for it), and before 8eee563 a prefill job gathers every
# group's rows to rank 0 in each step, which sends them on; from then on each group's first rank
# receives or sends its own rows beside the steps. Reported per repeat and build: the decode load's ITL (median,
# p99), the long prompts' TTFT (median, p99), the router's mean handoff (the prefill's first
# token to the decode group's first: router_handoff_seconds) and output tok/s; then the medians
# over the repeats and candidate / baseline. Builds alternate, baseline first in odd repeats.
# Needs root (network namespaces). Knobs (environment): MODEL (a model directory, or "rows", the
# default: the tests' small shapes with DeepSeek-V3's latent row — kv_lora_rank 512,
# qk_rope_head_dim 64, 1,152 bytes a layer, 8 KB a token over its 6 layers and MTP layer — so
# rows weigh as a real model's per layer while the two cores keep up with the compute; written
# once under OUT), CHUNK (--max-num-batched-tokens, 512), the load sizes above, OUT.
# Usage: scripts/bench-disagg-hosts.sh BASELINE_BINARY CANDIDATE_BINARY [REPEATS (3)] [RATE (1gbit)]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
baseline="${1:?baseline binary}" candidate="${2:?candidate binary}"
repeats="${3:-3}" rate="${4:-1gbit}"
model="${MODEL:-rows}" chunk="${CHUNK:-512}" job="${JOB:-decode}"
case "$job" in decode) single=prefill ;; prefill) single=decode ;; *) echo "JOB: decode or prefill"; exit 2 ;; esac
out="${OUT:-${TMPDIR:-/tmp}/bench-disagg-hosts-$(id -un)}"
mkdir -p "$out"
if [ "$model" = rows ]; then
  model="$out/model-rows"
  [ -f "$model/config.json" ] ||
    "$candidate" init-model --preset small --kv-lora-rank 512 --qk-rope-head-dim 64 --out "$model"
fi
netns="$root/scripts/netns-cluster.sh"
vocab="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model/config.json")"
decode_load=(--num-prompts "${DECODE_PROMPTS:-64}" --request-rate "${DECODE_RATE:-4}")
long_load=(--num-prompts "${LONG_PROMPTS:-12}" --request-rate "${LONG_RATE:-1}")
long_len="${LONG_LEN:-1536}" long_delay="${LONG_DELAY:-2}" decode_out="${DECODE_OUT:-128}"
ucx=(env UCX_TLS=tcp UCX_NET_DEVICES=eth0)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap 'cleanup; bash "$netns" down 4' EXIT
bash "$netns" down 4
bash "$netns" up 4 "$rate"

# start NAME COMMAND…: runs it, waits for its "serving" line, sets $url.
start() {
  local log="$out/$1.log"; shift
  : > "$log"
  "$@" > "$log" 2>&1 & pids+=($!)
  for _ in $(seq 600); do grep -q "serving .* on http://" "$log" 2>/dev/null && break; sleep 0.1; done
  url="$(grep -o 'http://[^ ]*' "$log" | head -1)"
  [ -n "$url" ] || { echo "did not start: $*"; cat "$log"; exit 1; }
}

run() {  # NAME BINARY REPEAT
  local name="$1" bin="$2" r="$3"
  start "$name-$job-job" bash "$netns" mpirun 2 "${ucx[@]}" "$bin" --threads 1 serve --model "$model" \
    --host 10.77.0.1 --port 0 --grpc-port 50051 --role "$job" --kv-cache-tokens 16384 \
    --max-num-batched-tokens "$chunk"
  start "$name-$single" ip netns exec sy-host2 "${ucx[@]}" "$bin" --threads 1 serve --model "$model" \
    --host 10.77.0.3 --port 0 --grpc-port 50051 --role "$single" --kv-cache-tokens 16384 \
    --max-num-batched-tokens "$chunk"
  local pools=(--prefill-engines 10.77.0.3:50051 --decode-engines 10.77.0.1:50051,10.77.0.1:50052)
  [ "$job" = prefill ] &&
    pools=(--prefill-engines 10.77.0.1:50051,10.77.0.1:50052 --decode-engines 10.77.0.3:50051)
  start "$name-router" ip netns exec sy-host3 "$bin" route --model "$model" "${pools[@]}" \
    --host 10.77.0.4 --port 0 --probe-interval 0.1
  local router="$url"
  sleep 1  # the router's first probes
  # The same seeds for both builds: the same prompts arriving at the same moments.
  "$bin" bench serve --url "$router" "${decode_load[@]}" --input-len 64 --output-len "$decode_out" \
    --vocab-size "$vocab" --seed $((r * 2 + 1)) --json > "$out/$name-$r-decode.json" &
  local decode_pid=$!
  sleep "$long_delay"
  "$bin" bench serve --url "$router" "${long_load[@]}" --input-len "$long_len" --output-len 16 \
    --vocab-size "$vocab" --seed $((r * 2 + 2)) --json > "$out/$name-$r-long.json"
  wait "$decode_pid"
  curl -s "$router/metrics" > "$out/$name-$r-router.metrics"
  cleanup; pids=()
  sleep 1
}

echo "== a $job job over two emulated hosts ($rate links), model $model, $repeats repeats ($(lscpu | sed -n 's/Model name: *//p'), $(nproc) cores, $(date -u +%FT%TZ))"
echo "baseline  $baseline"
echo "candidate $candidate"
for r in $(seq "$repeats"); do
  if ((r % 2)); then order=(baseline candidate); else order=(candidate baseline); fi
  for name in "${order[@]}"; do
    if [ "$name" = baseline ]; then run baseline "$baseline" "$r"; else run candidate "$candidate" "$r"; fi
  done
done
python3 - "$out" "$repeats" <<'PY'
import json, re, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
keys = ["decode ITL p50 ms", "decode ITL p99 ms", "long TTFT p50 ms", "long TTFT p99 ms",
        "handoff mean ms", "output tok/s", "failed"]

def handoff(path):
    text = open(path).read()
    total = re.search(r'router_handoff_seconds_sum\{[^}]*\} (\S+)', text)
    count = re.search(r'router_handoff_seconds_count\{[^}]*\} (\S+)', text)
    return 1e3 * float(total.group(1)) / max(float(count.group(1)), 1) if total and count else float("nan")

table = {}
for name in ("baseline", "candidate"):
    for r in range(1, repeats + 1):
        d = json.load(open(f"{out}/{name}-{r}-decode.json"))
        l = json.load(open(f"{out}/{name}-{r}-long.json"))
        row = [d["median_itl_ms"], d["p99_itl_ms"], l["median_ttft_ms"], l["p99_ttft_ms"],
               handoff(f"{out}/{name}-{r}-router.metrics"),
               (d["total_output_tokens"] + l["total_output_tokens"]) / max(d["duration"], l["duration"]),
               sum(1 for run in (d, l) for e in run["errors"] if e)]
        print(f"{name:<10} {r} " + " ".join(f"{v:.2f}" for v in row))
        table.setdefault(name, []).append(row)
print("median of repeats: " + " | ".join(keys))
med = {n: [statistics.median(col) for col in zip(*rows)] for n, rows in table.items()}
for n in med:
    print(f"{n:<22}" + "".join(f"{v:>12.2f}" for v in med[n]))
print(f"{'candidate / baseline':<22}" + "".join(
    f"{c / b if b else float('nan'):>12.2f}" for c, b in zip(med["candidate"], med["baseline"])))
PY
