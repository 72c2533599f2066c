#!/usr/bin/env bash
# Regenerates tests/fixtures/tiny-v32-* (DeepSeek-V3.2, sparse attention) with the pinned
# versions, in a private virtualenv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SWITCHYARD_V32_VENV:-$here/../../.venv-v32}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$here/requirements.txt"
"$venv/bin/python" "$here/make_fixtures.py" "$@"
