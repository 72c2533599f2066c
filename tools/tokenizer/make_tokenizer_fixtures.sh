#!/usr/bin/env bash
# Regenerates the tokenizer / chat-template reference fixtures under
# tests/fixtures/tokenizer and the small trained tokenizers under
# configs/tokenizer/{default,bench}, with pinned versions in a private venv.
# Deterministic: a second run gives byte-identical files.
#
#   bash tools/tokenizer/make_tokenizer_fixtures.sh
#
# SWITCHYARD_TOKENIZER_VENV overrides the venv path (default: <repo>/.venv-tokenizer).
source "$(dirname "$0")/venv.sh"

"$venv/bin/python" "$here/train_default_tokenizer.py"
"$venv/bin/python" "$here/gen_tokenizer_fixtures.py"
