#!/bin/bash
# Two switchyard builds side by side on one model: `bench decode` alternated A, B, A, B... so
# both see the same minutes of a shared machine, and the ratio taken pair by pair (its median is
# what to quote: a single pair moves by ±10% here). SWITCHYARD_MAX_ISA and the like pass through
# to both; A_FLAGS and B_FLAGS are global options for one side only (the same binary twice with
# A_FLAGS=--no-amx-bf16 compares two paths of one build).
# Usage: scripts/bench-ab-decode.sh BINARY_A BINARY_B MODEL [PAIRS] [BATCH] [STEPS]
#   (PAIRS 8, BATCH 1, STEPS 48)
set -euo pipefail
a=$(realpath "$1"); b=$(realpath "$2"); model=$3
pairs=${4:-8}; batch=${5:-1}; steps=${6:-48}
read -r -a a_flags <<< "${A_FLAGS:-}"
read -r -a b_flags <<< "${B_FLAGS:-}"
rate() {
  local binary=$1
  shift
  "$binary" "$@" bench decode --model "$model" --batches "$batch" --steps "$steps" 2>&1 |
    awk -v b="$batch" '$1 == b && NF >= 6 { print $2 }'
}
echo "A: $a ${A_FLAGS:-}"
echo "B: $b ${B_FLAGS:-}"
echo "model $model, batch $batch, $steps steps, $pairs pairs; $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$pairs"); do
  echo "$(rate "$a" "${a_flags[@]}") $(rate "$b" "${b_flags[@]}")"
done | python3 -c '
import statistics as st, sys
rows = [tuple(map(float, line.split())) for line in sys.stdin if len(line.split()) == 2]
a, b = [r[0] for r in rows], [r[1] for r in rows]
print("A tok/s:", ", ".join(f"{x:.1f}" for x in a), f"(median {st.median(a):.1f})")
print("B tok/s:", ", ".join(f"{x:.1f}" for x in b), f"(median {st.median(b):.1f})")
print(f"A/B pair by pair: median {st.median([x / y for x, y in rows]):.3f}")
'
