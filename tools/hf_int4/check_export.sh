#!/usr/bin/env bash
# Runs check_export.py in the pinned venv of requirements.txt (as make_fixtures.sh makes it).
# Usage: check_export.sh SWITCHYARD MODEL_DIR WORK_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SWITCHYARD_INT4_VENV:-$here/../../.venv-int4}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -r "$here/requirements.txt"
"$venv/bin/python" "$here/check_export.py" "$@"
