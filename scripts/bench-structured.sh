#!/usr/bin/env bash
# Structured output against the same load unconstrained, side by side in one run: `bench serve`
# with a json_schema response_format (a list of function calls — every request runs to its
# max_tokens inside the grammar, so constrained and unconstrained runs generate the same number
# of tokens from the same prompts) at concurrency 1 and 32, output throughput and its ratio to the
# unconstrained run; TTFT at concurrency 1 with a cold grammar (each request's schema text new,
# so compiled afresh) and a cached one. The constrained runs are repeated against a second
# server started with --grammar-masks after-forward (masks made after the forward, as before).
# Medians of REPEATS runs. Usage: scripts/bench-structured.sh [MODEL_DIR] [REPEATS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SWITCHYARD_BINARY:-$root/build/switchyard}"
model="${1:-$root/models/default}"
repeats="${2:-3}"
input=128 output=64
work="$(mktemp -d)"
servers=()
trap 'for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
[ -f "$model/model.safetensors" ] || "$bin" generate --prompt x --max-tokens 1 >/dev/null
cat >"$work/format.json" <<'EOF'
{"type": "json_schema", "json_schema": {"name": "calls", "schema": {
  "type": "object",
  "properties": {"calls": {"type": "array", "minItems": 8, "items": {
    "type": "object",
    "properties": {
      "name": {"enum": ["get_weather", "search_flights", "send_email", "create_event"]},
      "arguments": {
        "type": "object",
        "properties": {
          "location": {"type": "string", "maxLength": 40},
          "date": {"type": "string", "format": "date"},
          "units": {"enum": ["celsius", "fahrenheit"]},
          "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
        "required": ["location", "units"],
        "additionalProperties": false}},
    "required": ["name", "arguments"],
    "additionalProperties": false}}},
  "required": ["calls"],
  "additionalProperties": false}}}
EOF
start_server() {  # $1: log file, rest: serve flags; prints the URL
  "$bin" serve --model "$model" --port 0 --kv-cache-tokens 32768 "${@:2}" >"$1" 2>&1 &
  servers+=($!)
  for _ in $(seq 600); do grep -q "http://" "$1" && break; sleep 0.1; done
  echo "http://$(sed -n 's/.*http:\/\/\([0-9.:]*\).*/\1/p' "$1")"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
bench() {  # $1 url, $2 concurrency, $3 prompts, $4 output len, $5 seed, $6 key, rest: flags
  "$bin" bench serve --url "$1" --concurrency "$2" --num-prompts "$3" --input-len $input \
    --output-len "$4" --seed "$5" --json "${@:7}" |
    python3 -c "import json,sys; d=json.load(sys.stdin); assert d['completed']==d['num_prompts'], d['errors']; print(round(d['$6'], 2))"
}
beside="$(start_server "$work/beside.log")"
after="$(start_server "$work/after.log" --grammar-masks after-forward)"
fmt=(--response-format "$work/format.json")
# Warm both servers' grammar caches and mask tables.
bench "$beside" 4 8 $output 1 output_throughput "${fmt[@]}" >/dev/null
bench "$after" 4 8 $output 1 output_throughput "${fmt[@]}" >/dev/null
declare -A runs out_tokens
for i in $(seq "$repeats"); do
  for c in 1 32; do
    n=$((c == 1 ? 8 : 96))
    # Each run its own prompts (seed), so none finds another's in the prefix cache.
    runs[plain$c]+="$(bench "$beside" $c $n $output $((1000 * c + 10 * i)) output_throughput) "
    runs[beside$c]+="$(bench "$beside" $c $n $output $((1000 * c + 10 * i + 1)) output_throughput "${fmt[@]}") "
    runs[after$c]+="$(bench "$after" $c $n $output $((1000 * c + 10 * i + 2)) output_throughput "${fmt[@]}") "
    out_tokens[$c]+="$(bench "$after" $c $n $output $((1000 * c + 10 * i + 3)) total_output_tokens "${fmt[@]}") "
  done
  runs[ttft_plain]+="$(bench "$beside" 1 10 16 $((500 + 10 * i)) median_ttft_ms) "
  runs[ttft_cached]+="$(bench "$beside" 1 10 16 $((500 + 10 * i + 1)) median_ttft_ms "${fmt[@]}") "
  runs[ttft_cold]+="$(bench "$beside" 1 10 16 $((500 + 10 * i + 2)) median_ttft_ms "${fmt[@]}" --cold-grammar) "
done
m() { printf '%s\n' ${runs[$1]} | median; }
for c in 1 32; do
  p=$(m plain$c) b=$(m beside$c) a=$(m after$c)
  echo "concurrency $c, ${input} in / ${output} out, output tok/s:"
  echo "  unconstrained:                      ${runs[plain$c]}-> median $p"
  echo "  json_schema, masks beside forward:  ${runs[beside$c]}-> median $b"
  echo "  json_schema, masks after forward:   ${runs[after$c]}-> median $a"
  echo "  constrained output tokens per run (of $((c == 1 ? 8 : 96)) x $output): ${out_tokens[$c]}"
  python3 -c "print(f'  ratio to unconstrained: beside {$b / $p:.3f}x, after {$a / $p:.3f}x')"
done
echo "TTFT at concurrency 1 (${input}-token prompts), median ms:"
echo "  unconstrained:          ${runs[ttft_plain]}-> median $(m ttft_plain)"
echo "  json_schema, cached:    ${runs[ttft_cached]}-> median $(m ttft_cached)"
echo "  json_schema, cold:      ${runs[ttft_cold]}-> median $(m ttft_cold)"
