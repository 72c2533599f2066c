#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) and
# runs it for a bounded time. Usage: run_safetensors_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin safetensors "$@"
fuzz_build \
  "$src/src/model/safetensors.cc" \
  "$src/src/base/mapped_file.cc" "$src/src/tensor/dtype.cc" -lfmt
# Seeds: a valid file, and the first 4 KiB of a real fixture.
printf '\x40\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}          \x00\x00\x00\x00\x00\x00\x00\x00' > "$corpus/seed-valid"
head -c 4096 "$src/tests/fixtures/tiny-v3-fp8/model.safetensors" > "$corpus/seed-fixture"
fuzz_run 8192
