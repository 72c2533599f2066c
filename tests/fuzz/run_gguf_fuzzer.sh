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
# And a whole deepseek2 model small enough to mutate (one dense layer, every dimension 2-8, F32
# tensors), so the config and checkpoint conversions see files they accept, not only errors.
python3 - "$corpus/seed-deepseek2" <<'PY'
import struct, sys
def s(text): b = text.encode(); return struct.pack("<Q", len(b)) + b
def kv(key, kind, value):
    fmt = {4: "<I", 5: "<i", 6: "<f", 7: "<?"}
    return s(key) + struct.pack("<I", kind) + (s(value) if kind == 8 else struct.pack(fmt[kind], value))
H, hidden, r, rope, nope, dv, inter, vocab = 1, 4, 2, 2, 2, 2, 4, 8
meta = [kv("general.architecture", 8, "deepseek2"), kv("general.alignment", 4, 32)]
for key, value in [("block_count", 1), ("embedding_length", hidden), ("feed_forward_length", inter),
                   ("attention.head_count", H), ("context_length", 64), ("rope.dimension_count", rope),
                   ("attention.kv_lora_rank", r), ("attention.key_length_mla", nope + rope),
                   ("attention.value_length_mla", dv), ("leading_dense_block_count", 1),
                   ("vocab_size", vocab)]:
    meta.append(kv("deepseek2." + key, 4, value))
meta.append(kv("deepseek2.attention.layer_norm_rms_epsilon", 6, 1e-6))
tensors = [("token_embd.weight", [hidden, vocab]), ("output_norm.weight", [hidden]),
           ("output.weight", [hidden, vocab]), ("blk.0.attn_norm.weight", [hidden]),
           ("blk.0.attn_q.weight", [hidden, H * (nope + rope)]),
           ("blk.0.attn_kv_a_mqa.weight", [hidden, r + rope]), ("blk.0.attn_kv_a_norm.weight", [r]),
           ("blk.0.attn_k_b.weight", [nope, r, H]), ("blk.0.attn_v_b.weight", [r, dv, H]),
           ("blk.0.attn_output.weight", [H * dv, hidden]), ("blk.0.ffn_norm.weight", [hidden]),
           ("blk.0.ffn_gate.weight", [hidden, inter]), ("blk.0.ffn_up.weight", [hidden, inter]),
           ("blk.0.ffn_down.weight", [inter, hidden])]
infos, data = b"", b""
for name, dims in tensors:
    count = 1
    for d in dims: count *= d
    infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    infos += struct.pack("<IQ", 0, len(data))  # F32
    data += struct.pack(f"<{count}f", *[0.01 * (i % 7 - 3) for i in range(count)])
    data += b"\0" * (-len(data) % 32)
head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta) + infos
head += b"\0" * (-len(head) % 32)
open(sys.argv[1], "wb").write(head + data)
PY
fuzz_run 8192
