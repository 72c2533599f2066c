#!/usr/bin/env bash
# switchyard against llama.cpp on ONE Q4_K_M file (issue 30): the bench checkpoint written as a
# deepseek2 BF16 GGUF the way llama.cpp's converter lays it out (tools/gguf/make_default_gguf.py,
# pinned gguf-py), quantized to Q4_K_M by llama.cpp's own llama_model_quantize (no importance
# matrix), then both engines on that file: same token ids, greedy, 2 threads each, engines
# alternated, median of REPS; prefill (64-token prompts) and decode at 1 and 32 sequences, each
# engine's peak resident memory against the file's size, and the ratios (compare.py).
#
# usage: tools/llama_cpp/compare_q4_k_m.sh [REPS] [WORK_DIR]     (REPS 3, WORK_DIR build/llama-compare)
# env:   THREADS (2)   LLAMA_OMP_WAIT_POLICY (unset: OpenMP's default, threads spin while they
#        wait; PASSIVE for llama.cpp alone on a shared, oversubscribed machine, where a spinning
#        thread whose partner is descheduled stalls every graph node — docs/benchmarks.md)
#        LLAMA_EXTRA_BUFTS (1: llama.cpp's default buffer types, weights repacked for its AMX and
#        AVX-512 kernels; 0: plain CPU buffers, for the Xeon with AMX, where 0.3.36's AMX buffer
#        aborts on this file — tools/llama_cpp/run_llama.py)
#
# llama.cpp comes from llama-cpp-python 0.3.36 built with GGML_NATIVE (as compare.sh; about 20
# minutes of two cores when its venv is not there yet). build/switchyard is used as it is: copied
# into WORK_DIR first, so a rebuild during the run changes nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
reps="${1:-3}"
work="$(mkdir -p "${2:-$root/build/llama-compare}" && cd "${2:-$root/build/llama-compare}" && pwd)"
threads="${THREADS:-2}"
version=0.3.36
if [ ! -x "$root/build/switchyard" ]; then
  echo "compare_q4_k_m: $root/build/switchyard is missing; build switchyard first" >&2
  exit 1
fi
sy="$work/switchyard"
cp -p "$root/build/switchyard" "$sy"
[ -x "$work/llama-venv/bin/python" ] || python3 -m venv "$work/llama-venv"
"$work/llama-venv/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null ||
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" "$work/llama-venv/bin/pip" install -q \
    "llama-cpp-python==$version" numpy==2.4.6
gguf_venv="$work/gguf-venv"
if [ ! -x "$gguf_venv/bin/python" ]; then
  python3 -m venv "$gguf_venv" && "$gguf_venv/bin/pip" install -q -r "$root/tools/gguf/requirements.txt"
fi
[ -f "$work/bench-model/model.safetensors" ] || "$sy" init-model --preset bench --out "$work/bench-model"
[ -f "$work/bench-bf16.gguf" ] || "$gguf_venv/bin/python" "$root/tools/gguf/make_default_gguf.py" \
  "$work/bench-model" "$work/bench-bf16.gguf" --type bf16
gguf="$work/bench-q4_k_m-llama.gguf"
[ -f "$gguf" ] || "$work/llama-venv/bin/python" "$root/tools/llama_cpp/llama_logits.py" quantize \
  "$work/bench-bf16.gguf" "$gguf" Q4_K_M "$threads"
{
  echo "date $(date -u +%FT%TZ)"
  echo "git $(git -C "$root" rev-parse HEAD 2>/dev/null || echo '?') (uncommitted files in src/: $(git -C "$root" status --short -- src | wc -l))"
  echo "cpu $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; flags: $(grep -o -w -E 'avx2|avx512f|avx512bw|avx512_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "llama-cpp-python $("$work/llama-venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)') (GGML_NATIVE), OMP_WAIT_POLICY for it: ${LLAMA_OMP_WAIT_POLICY:-default}, extra buffer types (repacking): ${LLAMA_EXTRA_BUFTS:-1}"
  echo "file $gguf: $(stat -c %s "$gguf") bytes, sha256 $(sha256sum "$gguf" | cut -c1-16)"
}
"$work/llama-venv/bin/python" "$root/tools/llama_cpp/compare.py" --switchyard "$sy" \
  --model "$work/bench-model" --switchyard-model "$gguf" --gguf "$gguf" \
  --llama-python "$work/llama-venv/bin/python" --threads "$threads" --repetitions "$reps"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
