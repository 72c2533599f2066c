#!/usr/bin/env bash
# Regenerates tests/fixtures with the pinned reference versions, in a private virtualenv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SWITCHYARD_FIXTURE_VENV:-$here/../.venv-fixtures}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$here/requirements-fixtures.txt"
"$venv/bin/python" "$here/gen_fixtures.py" "$@"
