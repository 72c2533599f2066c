#!/usr/bin/env bash
# Quick start 1: install, build, and run the main job — greedy generation from text prompts,
# batched — on the default model (trained here, committed in models/default, with its tokenizer
# and chat template).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
if [ "$#" -eq 0 ]; then
  set -- --prompt "KING HENRY: Now, lords, " --prompt "ROMEO: But soft, what light" \
    --prompt "To be, or not to be" --max-tokens "${MAX_TOKENS:-32}"
fi
"$root/build/switchyard" generate "$@"
