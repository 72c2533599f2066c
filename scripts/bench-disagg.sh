#!/usr/bin/env bash
# Prefill/decode disaggregation against colocated serving on the same two cores
# (docs/benchmarks.md "Disaggregation"): a mixed workload — streams decoding while long prompts
# arrive — through `switchyard route`, over
#   colocated:      two `serve` instances, one core each (taskset), route --engines
#   disaggregated:  one `serve --role prefill` on core 0 and one `serve --role decode` on core 1,
#                   route --prefill-engines --decode-engines
# Two `bench serve` loads run at once against the router: DECODE streams (64-token prompts, 256
# out, concurrency 8) and LONG prompts (1,536 tokens, 16 out, Poisson 0.5/s). Reported per
# repeat: the decode load's ITL and TPOT (median, p99) and output throughput, the long prompts'
# TTFT (median, p99); goodput within an SLO (DistServe's metric): requests per second, both loads
# together, whose TTFT and whose inter-token latencies meet GOODPUT, given as vLLM's
# `bench serve --goodput` takes it ("ttft:MS itl:MS"; vLLM's own keys are ttft, tpot and e2el —
# itl here means every gap of the request's stream, and tpot, its mean, is reported beside it);
# then the medians over the repeats, and disaggregated / colocated.
# Usage: [GOODPUT="ttft:1500 itl:20"] scripts/bench-disagg.sh [REPEATS (3)]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SWITCHYARD_BINARY:-$root/build/switchyard}"
repeats="${1:-3}"
goodput="${GOODPUT:-ttft:1500 itl:20}"
model="$root/models/default"
out="${TMPDIR:-/tmp}/bench-disagg"
mkdir -p "$out"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start NAME COMMAND…: runs it, waits for its "serving" line, sets $url.
start() {
  local log="$out/$1.log"; shift
  : > "$log"  # emptied here: the background redirection may come after the first grep below
  "$@" > "$log" 2>&1 & pids+=($!)
  for _ in $(seq 600); do grep -q "serving .* on http://" "$log" 2>/dev/null && break; sleep 0.1; done
  url="$(grep -o 'http://[^ ]*' "$log" | head -1)"
  [ -n "$url" ] || { echo "did not start: $*"; cat "$log"; exit 1; }
}
instance() {  # CORE ROLE: sets $address
  local port; port="$(free_port)"
  start "instance-$1-$2" taskset -c "$1" "$bin" --threads 1 serve --model "$model" --port 0 \
    --grpc-port "$port" --role "$2" --kv-cache-tokens 16384 --max-num-batched-tokens 512
  address="127.0.0.1:$port"
}

run() {  # SETUP REPEAT
  local setup="$1" r="$2"
  if [ "$setup" = colocated ]; then
    instance 0 both; a="$address"; instance 1 both; b="$address"
    start router "$bin" route --engines "$a,$b" --port 0 --probe-interval 0.1
  else
    instance 0 prefill; a="$address"; instance 1 decode; b="$address"
    start router "$bin" route --prefill-engines "$a" --decode-engines "$b" --port 0 \
      --probe-interval 0.1
  fi
  "$bin" bench serve --url "$url" --num-prompts 32 --input-len 64 --output-len 256 \
    --concurrency 8 --seed $((r * 2 + 1)) --json > "$out/$setup-$r-decode.json" &
  local decode_pid=$!
  sleep 1  # the streams are decoding when the long prompts start
  "$bin" bench serve --url "$url" --num-prompts 8 --input-len 1536 --output-len 16 \
    --request-rate 0.5 --seed $((r * 2 + 2)) --json > "$out/$setup-$r-long.json"
  wait "$decode_pid"
  cleanup; pids=()
}

echo "== mixed workload, $repeats repeats, goodput SLO \"$goodput\" ($(lscpu | sed -n 's/Model name: *//p'), $(nproc) cores, $(date -u +%FT%TZ))"
for r in $(seq "$repeats"); do
  for setup in colocated disaggregated; do run "$setup" "$r"; done
done
python3 - "$out" "$repeats" "$goodput" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
slo = {k: float(v) / 1e3 for k, v in (kv.split(":") for kv in sys.argv[3].split())}
keys = [("decode", "median_itl_ms"), ("decode", "p99_itl_ms"), ("decode", "median_tpot_ms"),
        ("decode", "p99_tpot_ms"), ("decode", "output_throughput"), ("long", "median_ttft_ms"),
        ("long", "p99_ttft_ms")]

def goodput(runs, gap):
    """Requests/s (both loads, over the longer load's duration) meeting the SLO; `gap`: how a
    request's inter-token latencies are judged (max: every gap, mean: TPOT)."""
    good = 0
    for run in runs.values():
        for ttft, itl, err in zip(run["ttfts"], run["itls"], run["errors"]):
            if err or ttft > slo.get("ttft", float("inf")):
                continue
            if itl and gap(itl) > slo.get("itl", float("inf")):
                continue
            good += 1
    return good / max(run["duration"] for run in runs.values())

keys += [("both", "goodput (every ITL) req/s"), ("both", "goodput (TPOT as ITL) req/s"),
         ("both", "throughput req/s")]
table = {}
for setup in ("colocated", "disaggregated"):
    for r in range(1, repeats + 1):
        runs = {load: json.load(open(f"{out}/{setup}-{r}-{load}.json")) for load in ("decode", "long")}
        row = [runs[load][k] for load, k in keys if load != "both"]
        row += [goodput(runs, max), goodput(runs, lambda g: sum(g) / len(g)),
                sum(run["completed"] for run in runs.values()) /
                max(run["duration"] for run in runs.values())]
        print(setup, r, " ".join(f"{v:.2f}" for v in row))
        table.setdefault(setup, []).append(row)
print("median of repeats: " + " | ".join(f"{load} {k}" for load, k in keys))
med = {s: [statistics.median(col) for col in zip(*rows)] for s, rows in table.items()}
for s in med:
    print(f"{s:<20}" + "".join(f"{v:>26.2f}" for v in med[s]))
print(f"{'disagg / coloc':<20}" + "".join(f"{d / c if c else float('nan'):>26.2f}" for d, c in zip(med['disaggregated'], med['colocated'])))
PY
