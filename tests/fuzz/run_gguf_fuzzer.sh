#!/usr/bin/env bash
# Builds the GGUF reader fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) and runs it for
# a bounded time. Usage: run_gguf_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin gguf "$@"
fuzz_build \
  "$src/src/model/gguf.cc" "$src/src/tensor/ggml_quants.cc" \
  "$src/src/tensor/dtype.cc" "$src/src/base/mapped_file.cc" "$src/src/model/gguf_model.cc" \
  "$src/src/model/config.cc" "$src/src/model/safetensors.cc" \
  "$src/src/tokenizer/gguf_tokenizer.cc" "$src/src/base/thread_pool.cc" -lfmt -pthread
# Seeds: the start of the quantization fixture (metadata of every type, tensor infos), and a
# small whole file: the header, one Q4_K tensor info and its data.
head -c 4096 "$src/tests/fixtures/gguf/quants.gguf" > "$corpus/seed-fixture"
head -c 8192 "$src/tests/fixtures/gguf/default-tokenizer.gguf" > "$corpus/seed-tokenizer"
python3 - "$corpus/seed-small" <<'PY'
import struct, sys
info = struct.pack("<Q", 1) + b"w" + struct.pack("<IQQIQ", 2, 256, 2, 12, 0)
kv = struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<II", 4, 32)
head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + info
head += b"\0" * (-len(head) % 32)
open(sys.argv[1], "wb").write(head + bytes(range(256)) + bytes(32))
PY
fuzz_run 8192
