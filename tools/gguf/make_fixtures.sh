#!/usr/bin/env bash
# Remakes tests/fixtures/gguf from scratch in a venv with the pinned gguf-py (tools/gguf/requirements.txt).
# usage: tools/gguf/make_fixtures.sh [VENV_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$root/build/gguf-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$root/tools/gguf/requirements.txt"
"$venv/bin/python" "$root/tools/gguf/make_quant_fixture.py" "$root/tests/fixtures/gguf/quants.gguf"
"$venv/bin/python" "$root/tools/gguf/make_default_gguf.py" "$root/models/default" \
  "$root/tests/fixtures/gguf/default-tokenizer.gguf" --tokenizer-only
