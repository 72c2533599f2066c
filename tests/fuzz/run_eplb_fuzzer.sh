#!/usr/bin/env bash
# Builds the expert-load and expert-placement parser fuzzer (tests/fuzz/eplb_fuzzer.cc) with clang
# (libFuzzer + AddressSanitizer + UBSan) and runs it for a bounded time.
# Usage: run_eplb_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin eplb "$@"
fuzz_build "$src/src/model/expert_load.cc" \
  "$src/src/model/expert_placement.cc" "$src/src/plan/eplb.cc" -lfmt
printf '\x00{"experts": 4, "ranks": 2, "redundant_experts": 2, "layers": [{"layer": 1, "ranks": [[0, 1, 3], [2, 3, 0]]}]}' \
  > "$corpus/seed-placement"
printf '\x01{"experts": 8, "top_k": 2, "groups": 4, "ranks": 2, "window": {"steps": 3, "tokens": 12}, "expert_imbalance": 1.5, "layers": [{"layer": 1, "counts": [9, 1, 0, 4, 2, 2, 3, 3], "imbalance": 1.5}, {"layer": 2, "counts": [0, 0, 0, 0, 0, 0, 0, 24]}]}' \
  > "$corpus/seed-load"
fuzz_run 4096
