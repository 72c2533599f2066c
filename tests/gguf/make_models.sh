#!/usr/bin/env bash
# Writes GGUFs of the default model for gguf_model_test, the way llama.cpp's converter lays them
# out (tools/gguf/make_default_gguf.py), in a venv with the pinned gguf-py and numpy
# (tools/gguf/requirements.txt). Usage: make_models.sh SOURCE_DIR OUT_DIR
set -euo pipefail
src="$1"; out="$2"
venv="$out/venv"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$src/tools/gguf/requirements.txt" "$venv/requirements.txt"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$src/tools/gguf/requirements.txt"
  cp "$src/tools/gguf/requirements.txt" "$venv/requirements.txt"
fi
make() {  # NAME ARGS...: remade when the model or the script is newer
  local target="$out/$1"; shift
  if [ ! -f "$target" ] || [ "$src/tools/gguf/make_default_gguf.py" -nt "$target" ] ||
     [ "$src/models/default/model.safetensors" -nt "$target" ]; then
    "$venv/bin/python" "$src/tools/gguf/make_default_gguf.py" "$src/models/default" "$target.tmp" "$@"
    mv "$target.tmp" "$target"
  fi
}
make default-f32.gguf --type f32
make default-f32-fused-kv-b.gguf --type f32 --kv-b fused
make default-f32-both-kv-b.gguf --type f32 --kv-b both
make default-bf16.gguf --type bf16
make default-q8_0.gguf --type q8_0
make default-q4_k_mix.gguf --type q4_k_mix
make default-q4_k_m.gguf --type q4_k_m
make default-f16.gguf --type f16
# Three shards (split.no/split.count), as the large published files come.
if [ ! -f "$out/split/default-f32-00003-of-00003.gguf" ] ||
   [ "$src/tools/gguf/make_default_gguf.py" -nt "$out/split/default-f32-00003-of-00003.gguf" ]; then
  rm -rf "$out/split" && mkdir -p "$out/split"
  "$venv/bin/python" "$src/tools/gguf/make_default_gguf.py" "$src/models/default" \
    "$out/split/default-f32.gguf" --type f32 --split-max-tensors 30
fi
