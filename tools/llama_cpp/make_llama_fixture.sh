#!/usr/bin/env bash
# llama.cpp's logits on the default model's Q8_0 GGUF and on its Q4_K mix (Q4_K with Q6_K, Q5_0
# and Q8_0 where llama.cpp's Q4_K_M puts them) — the files tests/gguf/make_models.sh writes, byte
# for byte the same on every build and CPU (pinned gguf-py; the Q4_K/Q6_K encoder written here
# uses only element-wise arithmetic, min and max) — committed so that gguf_model_test compares
# switchyard with llama.cpp on every run without building llama.cpp (~35 minutes of two cores).
# Writes tests/fixtures/gguf/llama-cpp-NAME-logits.bin (llama_logits.py's format) and
# llama-cpp-NAME.sha256 (the GGUF's, so the test knows the file is the one compared), NAME q8_0
# and q4_k_mix.
# Usage: tools/llama_cpp/make_llama_fixture.sh LLAMA_PYTHON GGUF_MODELS_DIR
#   LLAMA_PYTHON: a python with llama-cpp-python 0.3.36 (tools/llama_cpp/compare_q4_k_m.sh
#   builds one in build/llama-compare/llama-venv); GGUF_MODELS_DIR: build/gguf-models.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$1"; models="$2"; out="$root/tests/fixtures/gguf"
"$python" -c 'import llama_cpp, sys; assert llama_cpp.__version__ == "0.3.36", llama_cpp.__version__'
for name in q8_0 q4_k_mix; do
  "$python" "$root/tools/llama_cpp/llama_logits.py" logits "$models/default-$name.gguf" \
    "$(cat "$root/tests/fixtures/default-model/tokens.txt")" "$out/llama-cpp-$name-logits.bin" 2
  sha256sum "$models/default-$name.gguf" | cut -d' ' -f1 > "$out/llama-cpp-$name.sha256"
  echo "wrote $out/llama-cpp-$name-logits.bin and llama-cpp-$name.sha256"
done
