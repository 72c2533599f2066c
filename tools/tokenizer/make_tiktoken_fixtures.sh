#!/usr/bin/env bash
# Regenerates tests/fixtures/tiktoken/: a tiktoken vocabulary with Kimi K2's tokenizer class, and
# tiktoken's own ids for the tokenizer corpus, with the pinned versions of requirements.txt in
# the same private venv as make_tokenizer_fixtures.sh. Deterministic.
#
#   bash tools/tokenizer/make_tiktoken_fixtures.sh
source "$(dirname "$0")/venv.sh"
"$venv/bin/python" "$here/gen_tiktoken_fixtures.py"
