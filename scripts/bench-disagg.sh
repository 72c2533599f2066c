#!/usr/bin/env bash
# Prefill/decode disaggregation against colocated serving on the same two cores
# (docs/benchmarks.md "Disaggregation"): a mixed workload — streams decoding while long prompts
# arrive — through `switchyard route`, over
#   colocated:      two `serve` instances, one core each (taskset), route --engines
#   disaggregated:  one `serve --role prefill` on core 0 and one `serve --role decode` on core 1,
#                   route --prefill-engines --decode-engines
# Two `bench serve` loads run at once against the router, both open-loop (Poisson arrivals at a
# fixed rate), so both setups are offered the same load and, if they sustain it, serve the same
# throughput; latency is then compared at equal throughput:
#   DECODE streams: DECODE_PROMPTS (192) prompts of 64 tokens, DECODE_OUT (256) out, Poisson
#                   DECODE_RATE (8)/s;
#   LONG prompts:   LONG_PROMPTS (16) prompts of LONG_LEN (1,536) tokens, 16 out, Poisson LONG_RATE
#                   (1)/s, starting LONG_DELAY (2) s later and ending before the decode load
#                   does, so every long prompt arrives while streams decode.
# Every request generates exactly its output length (bench serve sends ignore_eos). Reported per
# repeat: the decode load's ITL and TPOT (median, p99), the long prompts' TTFT (median, p99),
# throughput of both loads together (req/s and output tok/s over the whole run) and goodput
# within an SLO (DistServe's metric): requests per second, both loads together, whose TTFT and
# whose inter-token latencies meet GOODPUT, given as vLLM's `bench serve --goodput` takes it
# ("ttft:MS itl:MS"; vLLM's own keys are ttft, tpot and e2el — itl here means every gap of the
# request's stream, and tpot, its mean, is judged beside it); then the medians over the repeats,
# and disaggregated / colocated.
# Knobs (environment): MODEL (a model directory, or "bench": `init-model --preset bench`, written
# once under OUT; on one core it needs a load scaled down to it, as WORKLOAD=bench sets), CHUNK
# (serve --max-num-batched-tokens: tokens one step computes, decode
# tokens plus prefill chunks; 64 by default, the budget a deployment picks from its ITL SLO as
# Sarathi-Serve does: a 64-token chunk of the default model takes 13-20 ms on one core, within
# the SLO's 20 ms gap), PREFILL_CHUNK (the same for the --role prefill instance, which has no
# decoding streams to keep within the SLO: 512 by default), the load sizes above, OUT (where logs
# and JSON go). WORKLOAD=bench: the bench preset (`init-model --preset bench`, about 1 GB, written
# once under OUT; its decode steps are memory-bound, 40-120 ms on a core, as a real model's are)
# with loads sized to it: 32 decode prompts of 64 tokens, 32 out, 0.4/s; 8 long prompts of 256
# tokens at 0.12/s from 5 s on; CHUNK 32 (about 200 ms a chunk step, within the SLO gap),
# PREFILL_CHUNK 256, GOODPUT "ttft:5000 itl:300"; about 3 minutes a repeat. WORKLOAD=closed runs
# the thirteenth session's workload (32 decode streams at concurrency 8, 8 long prompts at 0.5/s,
# CHUNK 512 everywhere), whose decode load ends about when the long prompts begin.
# Usage: [WORKLOAD=open|bench|closed] [GOODPUT="ttft:1500 itl:20"] [MODEL=DIR|bench]
#        scripts/bench-disagg.sh [REPEATS (3)]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SWITCHYARD_BINARY:-$root/build/switchyard}"
repeats="${1:-3}"
goodput="${GOODPUT:-ttft:1500 itl:20}"
out="${OUT:-${TMPDIR:-/tmp}/bench-disagg-$(id -un)}"
mkdir -p "$out"
workload="${WORKLOAD:-open}"
case "$workload" in
  open)  # the trained default model
    model="${MODEL:-$root/models/default}" chunk="${CHUNK:-64}" prefill_chunk="${PREFILL_CHUNK:-512}"
    decode_load=(--num-prompts "${DECODE_PROMPTS:-192}" --request-rate "${DECODE_RATE:-8}")
    long_load=(--num-prompts "${LONG_PROMPTS:-16}" --request-rate "${LONG_RATE:-1}")
    long_len="${LONG_LEN:-1536}" long_delay="${LONG_DELAY:-2}" decode_out="${DECODE_OUT:-256}" ;;
  bench)  # the bench preset: decode steps of 40-120 ms a core, prefill 6 ms a token
    model="${MODEL:-bench}" chunk="${CHUNK:-32}" prefill_chunk="${PREFILL_CHUNK:-256}"
    goodput="${GOODPUT:-ttft:5000 itl:300}"
    decode_load=(--num-prompts "${DECODE_PROMPTS:-32}" --request-rate "${DECODE_RATE:-0.4}")
    long_load=(--num-prompts "${LONG_PROMPTS:-8}" --request-rate "${LONG_RATE:-0.12}")
    long_len="${LONG_LEN:-256}" long_delay="${LONG_DELAY:-5}" decode_out="${DECODE_OUT:-32}" ;;
  closed)
    model="${MODEL:-$root/models/default}" chunk="${CHUNK:-512}" prefill_chunk="${PREFILL_CHUNK:-$chunk}"
    decode_load=(--num-prompts 32 --concurrency 8); long_load=(--num-prompts 8 --request-rate 0.5)
    long_len=1536 long_delay=1 decode_out=256 ;;
  *) echo "WORKLOAD: open, bench or closed, not $workload"; exit 2 ;;
esac
if [ "$model" = bench ]; then
  model="$out/model-bench"
  [ -f "$model/config.json" ] || "$bin" init-model --preset bench --out "$model"
fi
[ -f "$model/config.json" ] || { echo "MODEL: no config.json in $model"; exit 2; }
vocab="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model/config.json")"
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
  local budget="$chunk"
  [ "$2" = prefill ] && budget="$prefill_chunk"
  start "instance-$1-$2" taskset -c "$1" "$bin" --threads 1 serve --model "$model" --port 0 \
    --grpc-port "$port" --role "$2" --kv-cache-tokens 16384 --max-num-batched-tokens "$budget"
  address="127.0.0.1:$port"
}

run() {  # SETUP REPEAT
  local setup="$1" r="$2"
  if [ "$setup" = colocated ]; then
    instance 0 both; a="$address"; instance 1 both; b="$address"
    start router "$bin" route --model "$model" --engines "$a,$b" --port 0 --probe-interval 0.1
  else
    instance 0 prefill; a="$address"; instance 1 decode; b="$address"
    start router "$bin" route --model "$model" --prefill-engines "$a" --decode-engines "$b" --port 0 \
      --probe-interval 0.1
  fi
  # The same seeds in both setups: the same prompts arriving at the same moments.
  "$bin" bench serve --url "$url" "${decode_load[@]}" --input-len 64 --output-len "$decode_out" \
    --vocab-size "$vocab" --seed $((r * 2 + 1)) --json > "$out/$setup-$r-decode.json" &
  local decode_pid=$!
  sleep "$long_delay"  # the streams are decoding when the long prompts start
  "$bin" bench serve --url "$url" "${long_load[@]}" --input-len "$long_len" --output-len 16 \
    --vocab-size "$vocab" --seed $((r * 2 + 2)) --json > "$out/$setup-$r-long.json"
  wait "$decode_pid"
  cleanup; pids=()
}

echo "== mixed workload ($workload), model $model, chunk $chunk (prefill instance $prefill_chunk), $repeats repeats, goodput SLO \"$goodput\" ($(lscpu | sed -n 's/Model name: *//p'), $(nproc) cores, $(date -u +%FT%TZ))"
for r in $(seq "$repeats"); do
  for setup in colocated disaggregated; do run "$setup" "$r"; done
done
python3 - "$out" "$repeats" "$goodput" "$long_delay" <<'PY'
import json, statistics, sys
out, repeats, long_delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[4])
slo = {k: float(v) / 1e3 for k, v in (kv.split(":") for kv in sys.argv[3].split())}
keys = [("decode", "median_itl_ms"), ("decode", "p99_itl_ms"), ("decode", "median_tpot_ms"),
        ("decode", "p99_tpot_ms"), ("long", "median_ttft_ms"), ("long", "p99_ttft_ms")]

def window(runs):
    """Seconds from the first load's start to the last request's end (the long load starts
    long_delay s after the decode load)."""
    return max(runs["decode"]["duration"], long_delay + runs["long"]["duration"])

def goodput(runs, gap):
    """Requests/s (both loads, over the whole run) meeting the SLO; `gap`: how a request's
    inter-token latencies are judged (max: every gap, mean: TPOT)."""
    good = 0
    for run in runs.values():
        for ttft, itl, err in zip(run["ttfts"], run["itls"], run["errors"]):
            if err or ttft > slo.get("ttft", float("inf")):
                continue
            if itl and gap(itl) > slo.get("itl", float("inf")):
                continue
            good += 1
    return good / window(runs)

keys += [("both", "goodput (every ITL) req/s"), ("both", "goodput (TPOT as ITL) req/s"),
         ("both", "throughput req/s"), ("both", "output tok/s"), ("both", "failed requests")]
table = {}
for setup in ("colocated", "disaggregated"):
    for r in range(1, repeats + 1):
        runs = {load: json.load(open(f"{out}/{setup}-{r}-{load}.json")) for load in ("decode", "long")}
        row = [runs[load][k] for load, k in keys if load != "both"]
        row += [goodput(runs, max), goodput(runs, lambda g: sum(g) / len(g)),
                sum(run["completed"] for run in runs.values()) / window(runs),
                sum(run["total_output_tokens"] for run in runs.values()) / window(runs),
                sum(1 for run in runs.values() for e in run["errors"] if e)]
        print(setup, r, " ".join(f"{v:.2f}" for v in row))
        table.setdefault(setup, []).append(row)
print("median of repeats: " + " | ".join(f"{load} {k}" for load, k in keys))
med = {s: [statistics.median(col) for col in zip(*rows)] for s, rows in table.items()}
for s in med:
    print(f"{s:<20}" + "".join(f"{v:>12.2f}" for v in med[s]))
print(f"{'disagg / coloc':<20}" + "".join(f"{d / c if c else float('nan'):>12.2f}" for d, c in zip(med['disaggregated'], med['colocated'])))
PY
