#!/usr/bin/env bash
# The llama.cpp comparison of docs/benchmarks.md, from scratch: builds llama.cpp through the
# llama-cpp-python package on PyPI (pinned), makes the bench checkpoint, converts it to Q8_0 with
# llama.cpp's converter and the gguf package, and times both engines side by side.
# usage: tools/llama_cpp/compare.sh [WORK_DIR]   (about 20 minutes on 2 cores, most of it building)
# env:   LLAMA_EXTRA_BUFTS=0 runs llama.cpp without its repacked AMX/AVX-512 buffers, which abort
#        on this model on a Xeon with AMX (tools/llama_cpp/run_llama.py)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="${1:-$root/build/llama-compare}"
mkdir -p "$work"
version=0.3.36
[ -x "$work/llama-venv/bin/python" ] || python3 -m venv "$work/llama-venv"
CMAKE_ARGS="-DGGML_NATIVE=ON" "$work/llama-venv/bin/pip" install -q "llama-cpp-python==$version" numpy
[ -x "$work/convert-venv/bin/python" ] || python3 -m venv "$work/convert-venv"
"$work/convert-venv/bin/pip" install -q -r "$root/tools/requirements-fixtures.txt" "gguf==0.19.0"
if [ ! -d "$work/llama-src" ]; then
  "$work/llama-venv/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work/sdist"
  mkdir -p "$work/llama-src" && tar xzf "$work/sdist/llama_cpp_python-$version.tar.gz" -C "$work/llama-src"
fi
llama_dir="$work/llama-src/llama_cpp_python-$version/vendor/llama.cpp"
"$root/scripts/setup.sh"
[ -f "$work/bench-model/model.safetensors" ] || "$root/build/switchyard" init-model --preset bench --out "$work/bench-model"
[ -f "$work/bench-q8_0.gguf" ] || "$work/convert-venv/bin/python" "$root/tools/llama_cpp/convert_to_gguf.py" \
  "$work/bench-model" "$llama_dir" "$work/bench-q8_0.gguf"
"$work/convert-venv/bin/python" "$root/tools/llama_cpp/compare.py" --switchyard "$root/build/switchyard" \
  --model "$work/bench-model" --gguf "$work/bench-q8_0.gguf" --llama-python "$work/llama-venv/bin/python"
