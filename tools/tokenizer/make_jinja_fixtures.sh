#!/usr/bin/env bash
# Regenerates tests/fixtures/jinja/{conversations,expected}.json: Jinja2's own renderings of the
# committed chat templates and language snippets, with the pinned versions of requirements.txt
# in the same private venv as make_tokenizer_fixtures.sh. Deterministic (the template clock is
# fixed).
#
#   bash tools/tokenizer/make_jinja_fixtures.sh
source "$(dirname "$0")/venv.sh"
"$venv/bin/python" "$here/gen_jinja_fixtures.py"
