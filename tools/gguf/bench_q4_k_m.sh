#!/usr/bin/env bash
# Q4_K_M (native GGML kernels) against fp8 on the bench model, alternating engines in one run:
# `bench decode` at 1 and 32 sequences (tok/s, resident memory) and prefill through `generate`
# (64-token prompts, 1 and 32 of them). Makes the bench checkpoint and its Q4_K_M GGUF
# (tools/gguf/make_default_gguf.py --type q4_k_m, in the pinned gguf-py venv of
# tests/gguf/make_models.sh) when missing.
# usage: tools/gguf/bench_q4_k_m.sh [REPS] [WORK_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
reps="${1:-3}"; work="${2:-$root/build}"
sy="$root/build/switchyard"
venv="$work/gguf-models/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q -r "$root/tools/gguf/requirements.txt"
fi
[ -f "$work/bench-model/model.safetensors" ] || "$sy" init-model --preset bench --out "$work/bench-model"
[ -f "$work/bench-q4_k_m.gguf" ] || "$venv/bin/python" "$root/tools/gguf/make_default_gguf.py" \
  "$work/bench-model" "$work/bench-q4_k_m.gguf" --type q4_k_m
prompts() {  # N prompts of 64 ids, fixed
  python3 -c "import random; random.seed(1); print(';'.join(','.join(str(random.randrange(100, 16000)) for _ in range(64)) for _ in range($1)))"
}
p1="$(prompts 1)"; p32="$(prompts 32)"
lscpu | grep -E "Model name|^CPU\(s\)|Model:|CPU family"
for rep in $(seq "$reps"); do
  for model in "$work/bench-model" "$work/bench-q4_k_m.gguf"; do
    echo "== rep $rep: $model"
    "$sy" bench decode --model "$model" --batches 1 32 --steps 16 2>&1 | tail -6
    for p in "$p1" "$p32"; do
      "$sy" generate --model "$model" --prompt-tokens "$p" --max-tokens 1 --json 2>/dev/null |
        python3 -c "import json, sys; d = json.load(sys.stdin); n = len(sys.argv[1].split(';')); print(f'prefill {n} x 64 tokens: {n * 64 / d[\"prefill_seconds\"]:.1f} tok/s')" "$p"
    done
  done
done
