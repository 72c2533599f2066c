#!/usr/bin/env bash
# Quick start 1: install, build, and run the main job — greedy generation, several prompts
# batched — on the embedded default model (generated deterministically on first use).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
model="$root/models/default"
[ -f "$model/model.safetensors" ] || "$root/build/switchyard" init-model --out "$model"
"$root/build/switchyard" generate --model "$model" \
  --prompt-tokens "${PROMPTS:-1,15,27,300,42;7,8,9;100,200,300,400,500,600}" \
  --max-tokens "${MAX_TOKENS:-32}" "$@"
