#!/usr/bin/env bash
# Server overhead on this machine, side by side in one run: `switchyard generate` at batch 32
# against `switchyard bench serve` at concurrency 32 on a server of the same model and lengths
# (output throughput), and TTFT at concurrency 1 against the prefill time of the same prompt
# length. Medians of REPEATS runs. Usage: scripts/bench-serve.sh [MODEL_DIR] [REPEATS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/switchyard"
model="${1:-$root/models/default}"
repeats="${2:-3}"
input=128 output=64 batch=32
[ -f "$model/model.safetensors" ] || "$bin" generate --prompt x --max-tokens 1 >/dev/null
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
prompts() {  # $1 prompts of $input random ids, seed $2
  python3 -c "import random,sys; r=random.Random($2); print(';'.join(','.join(str(r.randint(16,4095)) for _ in range($input)) for _ in range($1)))"
}
prefill=()
# generate's own overall figure (tokens / wall time of prefill + decode), as it prints it.
gen_tp=(); for i in $(seq "$repeats"); do
  gen_tp+=("$("$bin" generate --model "$model" --prompt-tokens "$(prompts $batch $i)" --max-tokens $output --ignore-eos |
    sed -n 's/.* s: \([0-9.]*\) tok\/s overall.*/\1/p')")
  prefill+=("$("$bin" generate --model "$model" --prompt-tokens "$(prompts 1 $((100 + i)))" --max-tokens 1 --json |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['prefill_seconds'] * 1e3, 2))")")
done
log="$(mktemp)"
"$bin" serve --model "$model" --port 0 --kv-cache-tokens 32768 >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 600); do grep -q "http://" "$log" && break; sleep 0.1; done
url="http://$(sed -n 's/.*http:\/\/\([0-9.:]*\).*/\1/p' "$log")"
serve_tp=(); ttft=()
for i in $(seq "$repeats"); do
  serve_tp+=("$("$bin" bench serve --url "$url" --num-prompts $((batch * 3)) --input-len $input \
    --output-len $output --concurrency $batch --seed $((1000 + i)) --json |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['output_throughput'], 1))")")
  ttft+=("$("$bin" bench serve --url "$url" --num-prompts 20 --input-len $input --output-len 16 \
    --concurrency 1 --seed $((2000 + i)) --json |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['median_ttft_ms'], 2))")")
done
g=$(printf '%s\n' "${gen_tp[@]}" | median); s=$(printf '%s\n' "${serve_tp[@]}" | median)
p=$(printf '%s\n' "${prefill[@]}" | median); t=$(printf '%s\n' "${ttft[@]}" | median)
echo "generate batch $batch (${input} in / ${output} out): ${gen_tp[*]} tok/s -> median $g"
echo "serve concurrency $batch, same lengths:          ${serve_tp[*]} tok/s -> median $s"
python3 -c "print(f'serve / generate output throughput: {$s / $g:.2f}x')"
echo "prefill of one ${input}-token prompt (generate): ${prefill[*]} ms -> median $p"
echo "TTFT at concurrency 1 through the server:        ${ttft[*]} ms -> median $t"
python3 -c "print(f'TTFT - prefill: {$t - $p:+.1f} ms')"
