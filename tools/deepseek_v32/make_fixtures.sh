#!/usr/bin/env bash
# Regenerates tests/fixtures/tiny-v32-* (DeepSeek-V3.2, sparse attention) and
# tests/fixtures/deepseek-v32-encoding (its chat encoding) with the pinned versions, in a private
# virtualenv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SWITCHYARD_V32_VENV:-$here/../../.venv-v32}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# mlx-lm without its dependencies (mlx): only its copy of DeepSeek's encoding is used.
grep -v '^mlx-lm' "$here/requirements.txt" > "$venv/requirements-main.txt"
"$venv/bin/pip" install -q -r "$venv/requirements-main.txt"
"$venv/bin/pip" install -q --no-deps "$(grep '^mlx-lm' "$here/requirements.txt")"
"$venv/bin/python" "$here/make_fixtures.py" "$@"
"$venv/bin/python" "$here/make_encoding_fixtures.py"
