#!/usr/bin/env bash
# Regenerates tests/fixtures/hf-int4 with the pinned versions, in a private virtualenv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SWITCHYARD_INT4_VENV:-$here/../../.venv-int4}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$here/requirements.txt"
"$venv/bin/python" "$here/make_fixtures.py" "$@"
