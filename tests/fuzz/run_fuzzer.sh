#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) and
# runs it for a bounded time. Usage: run_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
set -euo pipefail
src="$1"; build="$2"; seconds="${3:-30}"
mkdir -p "$build/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$src/src" \
  "$src/tests/fuzz/safetensors_fuzzer.cc" "$src/src/model/safetensors.cc" \
  "$src/src/base/mapped_file.cc" "$src/src/tensor/dtype.cc" -lfmt -o "$build/safetensors_fuzzer"
# Seeds: a valid file, and the first 4 KiB of a real fixture.
printf '\x40\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}          \x00\x00\x00\x00\x00\x00\x00\x00' > "$build/corpus/seed-valid"
head -c 4096 "$src/tests/fixtures/tiny-v3-fp8/model.safetensors" > "$build/corpus/seed-fixture"
"$build/safetensors_fuzzer" -max_total_time="$seconds" -max_len=8192 -timeout=10 \
  -print_final_stats=1 "$build/corpus" 2>&1 | tail -n 15
