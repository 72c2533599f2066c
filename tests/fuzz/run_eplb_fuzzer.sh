#!/usr/bin/env bash
# Builds the expert-load and expert-placement parser fuzzer (tests/fuzz/eplb_fuzzer.cc) with clang
# (libFuzzer + AddressSanitizer + UBSan) and runs it for a bounded time.
# Usage: run_eplb_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
set -euo pipefail
src="$1"; build="$2"; seconds="${3:-30}"
corpus="$build/eplb_corpus"
mkdir -p "$corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$src/src" "$src/tests/fuzz/eplb_fuzzer.cc" "$src/src/model/expert_load.cc" \
  "$src/src/model/expert_placement.cc" "$src/src/plan/eplb.cc" -lfmt -o "$build/eplb_fuzzer"
printf '\x00{"experts": 4, "ranks": 2, "redundant_experts": 2, "layers": [{"layer": 1, "ranks": [[0, 1, 3], [2, 3, 0]]}]}' \
  > "$corpus/seed-placement"
printf '\x01{"experts": 8, "top_k": 2, "groups": 4, "ranks": 2, "window": {"steps": 3, "tokens": 12}, "expert_imbalance": 1.5, "layers": [{"layer": 1, "counts": [9, 1, 0, 4, 2, 2, 3, 3], "imbalance": 1.5}, {"layer": 2, "counts": [0, 0, 0, 0, 0, 0, 0, 24]}]}' \
  > "$corpus/seed-load"
"$build/eplb_fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 "$corpus" 2>&1 | tail -n 15
