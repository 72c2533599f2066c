#!/usr/bin/env bash
# llama.cpp's logits on the default model's Q8_0 GGUF (the file tests/gguf/make_models.sh writes,
# byte for byte the same on every build: pinned gguf-py), committed so that gguf_model_test
# compares switchyard with llama.cpp on every run without building llama.cpp (~35 minutes of
# two cores). Writes tests/fixtures/gguf/llama-cpp-q8_0-logits.bin (llama_logits.py's format)
# and llama-cpp-q8_0.sha256 (the GGUF's, so the test knows the file is the one compared).
# Usage: tools/llama_cpp/make_llama_fixture.sh LLAMA_PYTHON GGUF_MODELS_DIR
#   LLAMA_PYTHON: a python with llama-cpp-python 0.3.36 (tools/llama_cpp/compare_q4_k_m.sh
#   builds one in build/llama-compare/llama-venv); GGUF_MODELS_DIR: build/gguf-models.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$1"; models="$2"; out="$root/tests/fixtures/gguf"
"$python" -c 'import llama_cpp, sys; assert llama_cpp.__version__ == "0.3.36", llama_cpp.__version__'
"$python" "$root/tools/llama_cpp/llama_logits.py" logits "$models/default-q8_0.gguf" \
  "$(cat "$root/tests/fixtures/default-model/tokens.txt")" "$out/llama-cpp-q8_0-logits.bin" 2
sha256sum "$models/default-q8_0.gguf" | cut -d' ' -f1 > "$out/llama-cpp-q8_0.sha256"
echo "wrote $out/llama-cpp-q8_0-logits.bin and llama-cpp-q8_0.sha256"
