#!/usr/bin/env bash
# Regenerates tests/fixtures/jinja/{conversations,expected}.json: Jinja2's own renderings of the
# committed chat templates and language snippets, with the pinned versions of requirements.txt
# in the same private venv as make_tokenizer_fixtures.sh. Deterministic (the template clock is
# fixed).
#
#   bash tools/tokenizer/make_jinja_fixtures.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SWITCHYARD_TOKENIZER_VENV:-$repo/.venv-tokenizer}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements.txt"
export PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error LC_ALL=C.UTF-8 TZ=UTC
"$venv/bin/python" "$here/gen_jinja_fixtures.py"
