#!/bin/bash
# Expert load balancing on a skewed workload: the default model (trained on Shakespeare) decoding
# 128 code and data prompts under EP4 (mpirun -np 4), without EPLB and with static placements from
# the load the first run records (R = 0 and R = 4 redundant experts). Prints the measured
# imbalance, decode throughput and a digest of the tokens (equal in every run) per launch, and
# online rebalancing (--eplb-interval, R = 4) with what its expert moves cost (experts, bytes,
# seconds, the longest step while moving). The R = 4 rows use the default replica dispatch
# (balanced), then again with --replica-dispatch own-rank and spread.
# Usage: scripts/bench-eplb.sh [BINARY] [REPEATS]
#   MPIRUN="$PWD/scripts/netns-cluster.sh mpirun 4" runs the ranks on emulated hosts (after
#   `scripts/netns-cluster.sh up 4`); the default is four ranks on this host. ROUNDS=N sends 8·N
#   prompts (default 16); WORKLOAD=heldout sends openings of held-out passages instead (text
#   like the model's training data); OUT_OF_SAMPLE=1 records the load on other prompts.
set -euo pipefail
B=$(realpath "${1:-build/switchyard}")
REPEATS=${2:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
base=('for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }' '0123456789 0123456789 0123456789'
      '{"key": [1, 2, 3], "value": null}' 'SELECT * FROM users WHERE id = 42;'
      'https://example.com/a/b/c?d=e&f=g' '$ ls -la /usr/bin | grep python3'
      '#include <stdio.h> int main() { return 0; }' 'x = np.zeros((3, 4)); y = x.T @ x')
# ROUNDS rounds of the eight prompts, each round with its own prefix (default 16: 128 prompts).
# WORKLOAD=heldout: instead, 8·ROUNDS openings (80 characters) of the held-out passages
# (configs/bench/heldout-prompts.jsonl), text like the model's training data.
# make_prompts OFFSET: the prompts into `made` (rounds or passages from OFFSET on).
make_prompts() {
  made=()
  local texts
  if [[ "${WORKLOAD:-skewed}" == heldout ]]; then
    mapfile -t texts < <(python3 - "$(dirname "$0")/../configs/bench/heldout-prompts.jsonl" \
      "$((8 * ${ROUNDS:-16}))" "$1" <<'PY'
import json, sys
passages = [json.loads(line)["text"] for line in open(sys.argv[1])]
start = 0 if sys.argv[3] == "0" else 200  # other prompts: text further into the passages
for i in range(int(sys.argv[3]), int(sys.argv[3]) + int(sys.argv[2])):
    print(passages[i % len(passages)][start:start + 80].replace("\n", " ") + " %x" % i)
PY
    )
    for p in "${texts[@]}"; do made+=(--prompt "$p"); done
  else
    for ((r = $1; r < $1 + ${ROUNDS:-16}; r++)); do
      for p in "${base[@]}"; do made+=(--prompt "$(printf %x "$r") $p"); done
    done
  fi
}
make_prompts 0
prompts=("${made[@]}")
# OUT_OF_SAMPLE=1: the static placements are balanced on a recording of other prompts (the next
# 8·ROUNDS), not on the served ones: what a placement balanced yesterday does today.
make_prompts "$([[ "${OUT_OF_SAMPLE:-0}" == 1 ]] && echo "${ROUNDS:-16}" || echo 0)"
record_prompts=("${made[@]}")
# --prefill-gemm own: "auto" times two GEMMs and keeps the faster, so its choice (and the
# rounding) may differ between launches.
MPIRUN=${MPIRUN:-mpirun --oversubscribe -np 4}
run() {
  local use=("${prompts[@]}")
  if [[ "${1:-}" == --record-expert-load ]]; then use=("${record_prompts[@]}"); fi
  $MPIRUN "$B" --threads 1 --prefill-gemm own generate "${use[@]}" \
    --max-tokens 32 --ignore-eos --json "$@" 2>stderr.txt | python3 -c '
import hashlib, json, sys
d = json.load(sys.stdin)
tokens = hashlib.md5(str([o["token_ids"] for o in d["outputs"]]).encode()).hexdigest()[:8]
print("imbalance %.3f  decode %6.0f tok/s  tokens %s" % (d["expert_imbalance"], d["decode_tokens_per_second"], tokens))'
}
work=$(mktemp -d)
cd "$work"
run --record-expert-load load.json > /dev/null
"$B" eplb --load load.json --ep 4 --num-redundant-experts 0 --out r0.json | sed -n 2,3p
"$B" eplb --load load.json --ep 4 --num-redundant-experts 4 --out r4.json | sed -n 2,3p
for _ in $(seq "$REPEATS"); do
  echo "contiguous: $(run)"
  echo "EPLB R=0:   $(run --expert-placement r0.json)"
  echo "EPLB R=4:   $(run --expert-placement r4.json --num-redundant-experts 4)"
  echo "online R=4: $(run --eplb-interval 8 --num-redundant-experts 4)"
  grep -h "experts moved" stderr.txt | sed 's/^switchyard: /            /'
  # Online from the static placement: moves only when the window's samples predict a gain.
  echo "static+online R=4: $(run --expert-placement r4.json --num-redundant-experts 4 \
    --eplb-interval 8)"
  # The same two with a token's own rank's replica first, and with an even share per replica.
  for d in own-rank spread; do
    echo "EPLB R=4 $d:   $(run --expert-placement r4.json --num-redundant-experts 4 \
      --replica-dispatch $d)"
    echo "online R=4 $d: $(run --eplb-interval 8 --num-redundant-experts 4 --replica-dispatch $d)"
  done
done
rm -rf "$work"
