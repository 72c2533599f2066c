#!/usr/bin/env bash
# Builds the Hugging Face int4 loader fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) and
# runs it for a bounded time. Usage: run_hf_int4_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin hf_int4 "$@"
fuzz_build \
  "$src/src/model/hf_int4.cc" "$src/src/model/config.cc" \
  "$src/src/model/safetensors.cc" "$src/src/tensor/ggml_quants.cc" "$src/src/tensor/dtype.cc" \
  "$src/src/tensor/packed_matrix.cc" "$src/src/base/mapped_file.cc" \
  "$src/src/base/thread_pool.cc" -lfmt -pthread
# Seeds: each format with its tensors present and well shaped, and a quantization_config text.
python3 - "$corpus" <<'PY'
import os, sys
out = sys.argv[1]
# AWQ 8x128: qweight I32 [128, 1], qzeros I32 [1, 1], scales F16 [1, 8].
awq = bytes([0, 0, 0]) + bytes([1, 0, 2, 0 | 1 << 3 | 2 << 3 * 0 + 0]) + bytes(range(256)) * 4
open(os.path.join(out, "seed-awq"), "wb").write(awq)
open(os.path.join(out, "seed-config"), "wb").write(
    b"\x80" + b'{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":'
    b'{"g":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","symmetric":true,'
    b'"strategy":"group","group_size":128}}},"ignore":["lm_head"]}')
# A group_size past int64's range as a float: the reader once cast it unchecked (undefined).
open(os.path.join(out, "seed-config-huge"), "wb").write(
    b"\x80" + b'{"quant_method":"awq","bits":4,"group_size":1.2e69,"zero_point":true,'
    b'"version":"gemm"}')
# A Kimi K2.5 wrapper: its text_config, quantization_config at the top level.
open(os.path.join(out, "seed-kimi-k25"), "wb").write(
    b"\x40" + b'"text_config":{"model_type":"kimi_k2","vocab_size":16,"hidden_size":128,'
    b'"num_hidden_layers":1,"num_attention_heads":1,"kv_lora_rank":16,"qk_nope_head_dim":8,'
    b'"qk_rope_head_dim":8,"v_head_dim":8},"quantization_config":{"quant_method":"fp8",'
    b'"fmt":"e4m3","weight_block_size":[128,128]}')
PY
fuzz_run 8192
