#!/usr/bin/env bash
# The server against real clients: the official OpenAI Python client and Prometheus, in a venv
# this script makes with pinned versions. Usage: run_client_tests.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src="$1"; build="$2"
venv="$build/venv-serve-tests"
if [ ! -x "$venv/bin/pytest" ] || ! cmp -s "$src/tests/serve/requirements.txt" "$venv/requirements.txt"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$src/tests/serve/requirements.txt"
  cp "$src/tests/serve/requirements.txt" "$venv/requirements.txt"
fi
export SWITCHYARD_BINARY="$build/switchyard"
export SWITCHYARD_TEST_TMP="$build/serve-tests"
rm -rf "$SWITCHYARD_TEST_TMP"; mkdir -p "$SWITCHYARD_TEST_TMP"
exec "$venv/bin/pytest" -q -p no:cacheprovider "$src/tests/serve" "${@:3}"
