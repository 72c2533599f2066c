#!/usr/bin/env bash
# switchyard's OpenAI server against llama.cpp's (llama-cpp-python's llama_cpp.server), one load
# generator (`switchyard bench serve`), same prompts, same checkpoint (the bench preset; Q8_0 GGUF
# for llama.cpp), 2 threads each, one server running at a time.
#
# usage: tools/llama_cpp/serve_compare.sh [WORK_DIR]          (WORK_DIR: build/llama-compare)
# env:   REPS (3)  THREADS (2)  PORT (18123)  QUIET_LOAD (1.0)
#        QUIET_WAIT_S (1200: most seconds to wait for 1-min load < QUIET_LOAD before each engine)
#        QUIET_WAIT_REP_S (300: the same before each repetition)
#
# Build steps are those of compare.sh (idempotent; the llama.cpp build takes ~15-20 min on
# 2 cores), except that build/switchyard is used as it is: scripts/setup.sh is not run.
#
# llama_cpp.server 0.3.36 cannot take bench serve's requests as they are (the "probe" step shows
# it on the unmodified server):
#   - `prompt` is `str | list[str]`: a token-id list fails validation (HTTP 500 from its error
#     handler), so every bench request fails;
#   - `ignore_eos` and `stream_options` are not fields: silently dropped, so a stream ends
#     without a usage chunk and bench serve would count 0 output tokens;
#   - a text mode in bench serve would not help with this GGUF: convert_to_gguf.py writes a
#     placeholder vocabulary (<t0>..<tN>), under which any text tokenizes to no tokens (the
#     server then fails `assert self.n_tokens > 0`);
#   - with the default --interrupt_requests true a request waiting for the model cancels the
#     stream in progress; the server is started with --interrupt_requests false.
# The timed llama.cpp runs therefore go through $WORK/llama_server_shim.py: the same server, with
# exactly those request features added (token-id prompts, ignore_eos as an EOS mask, a final
# usage chunk for stream_options.include_usage), nothing else changed. llama_cpp.server runs one
# request at a time (a lock around the model, no batching): at concurrency 32 requests queue.
# The switchyard binary is copied into WORK_DIR first, so a rebuild during the run changes nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mkdir -p "${1:-$root/build/llama-compare}" && cd "${1:-$root/build/llama-compare}" && pwd)"
reps="${REPS:-3}" threads="${THREADS:-2}" port="${PORT:-18123}"
quiet_load="${QUIET_LOAD:-1.0}" quiet_wait="${QUIET_WAIT_S:-1200}" quiet_wait_rep="${QUIET_WAIT_REP_S:-300}"
version=0.3.36
vocab=16384 input_len=128 output_len=64
if [ ! -x "$root/build/switchyard" ]; then
  echo "serve_compare: $root/build/switchyard is missing; build switchyard first (scripts/setup.sh)" >&2
  exit 1
fi
sy="$work/switchyard"
cp -p "$root/build/switchyard" "$sy"
mkdir -p "$work/serve-results"
{ echo "git $(git -C "$root" rev-parse HEAD 2>/dev/null || echo '?') (uncommitted changes: $(git -C "$root" status --short -- src | wc -l) files in src/)"
  echo "switchyard $(stat -c %y "$root/build/switchyard") $(sha256sum "$sy" | cut -c1-16)"
  echo "cpu $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"; } | tee "$work/serve-results/versions.txt"

# --- llama.cpp (through llama-cpp-python, with its server extras), as compare.sh ------------
[ -x "$work/llama-venv/bin/python" ] || python3 -m venv "$work/llama-venv"
if ! "$work/llama-venv/bin/python" -c "import llama_cpp.server.app, llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
  # The server extras and everything they pull in, pinned (as resolved from PyPI for Python 3.11).
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$work/llama-venv/bin/pip" install -q "llama-cpp-python[server]==$version" \
    numpy==2.4.6 diskcache==5.6.3 Jinja2==3.1.6 MarkupSafe==3.0.4 typing_extensions==4.16.0 \
    uvicorn==0.54.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 \
    pydantic-settings==2.16.3 python-dotenv==1.2.4 sse-starlette==3.7.0 starlette-context==0.3.6 \
    PyYAML==6.0.4 anyio==4.16.0 idna==3.20 h11==0.16.0 click==8.5.1 annotated-types==0.8.0 \
    annotated-doc==0.0.7 typing-inspection==0.4.5 opentelemetry-api==1.45.2
fi
[ -x "$work/convert-venv/bin/python" ] || python3 -m venv "$work/convert-venv"
"$work/convert-venv/bin/python" -c "import torch, transformers, safetensors, numpy, gguf" 2>/dev/null ||
  "$work/convert-venv/bin/pip" install -q -r "$root/tools/requirements-fixtures.txt" "gguf==0.19.0"
if [ ! -d "$work/llama-src/llama_cpp_python-$version" ]; then
  "$work/llama-venv/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work/sdist"
  mkdir -p "$work/llama-src" && tar xzf "$work/sdist/llama_cpp_python-$version.tar.gz" -C "$work/llama-src"
fi
llama_dir="$work/llama-src/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$work/bench-model/model.safetensors" ] || "$sy" init-model --preset bench --out "$work/bench-model"
[ -f "$work/bench-q8_0.gguf" ] || "$work/convert-venv/bin/python" "$root/tools/llama_cpp/convert_to_gguf.py" \
  "$work/bench-model" "$llama_dir" "$work/bench-q8_0.gguf"

cat > "$work/llama_server_shim.py" <<'EOF'
"""python -m llama_cpp.server, with the three request features `switchyard bench serve` needs and
llama-cpp-python 0.3.36's server lacks: a token-id list as `prompt`, `ignore_eos` (EOS masked,
as the server's own min_tokens does), and `stream_options.include_usage` (a last chunk with
`usage` before [DONE]). Same arguments as python -m llama_cpp.server."""
from typing import Any, Dict, List, Optional, Union

import llama_cpp
import llama_cpp.server.types as types
import pydantic


class CompletionRequest(types.CreateCompletionRequest):
    # List[int] last: what the server's prompt[0] leaves, so model_dump serializes it quietly.
    prompt: Union[str, List[str], List[List[int]], List[int]] = ""
    ignore_eos: bool = False
    stream_options: Optional[Dict[str, Any]] = None

    @pydantic.field_validator("prompt", mode="before")
    @classmethod
    def token_ids(cls, value):
        # The server takes prompt[0] of a list prompt: wrap an id list so prompt[0] is the ids.
        if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
            return [value]
        return value


types.CreateCompletionRequest = CompletionRequest  # before llama_cpp.server.app imports it
_call = llama_cpp.Llama.__call__


def call(self, prompt, *args, ignore_eos=False, stream_options=None, **kwargs):
    sampled = [0]
    eos = self.token_eos()

    def count(input_ids, scores):  # runs once per sampled token
        sampled[0] += 1
        if ignore_eos:
            scores[eos] = -float("inf")
        return scores

    processors = llama_cpp.LogitsProcessorList([count])
    processors.extend(kwargs.get("logits_processor") or [])
    kwargs["logits_processor"] = processors
    result = _call(self, prompt, *args, **kwargs)
    if not kwargs.get("stream") or not (stream_options or {}).get("include_usage"):
        return result

    def with_usage():
        last = None
        for chunk in result:
            last = chunk
            yield chunk
        stopped = bool(last and last["choices"] and last["choices"][0].get("finish_reason") == "stop")
        completion = sampled[0] - (1 if stopped else 0)  # an EOS is sampled but not output
        n_prompt = len(prompt) if isinstance(prompt, list) else len(self.tokenize(prompt.encode()))
        yield {"id": last["id"] if last else "", "object": "text_completion",
               "created": last["created"] if last else 0, "model": last["model"] if last else "",
               "choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": completion,
                                        "total_tokens": n_prompt + completion}}

    return with_usage()


llama_cpp.Llama.__call__ = call

if __name__ == "__main__":
    from llama_cpp.server.__main__ import main
    main()
EOF

# --- servers -------------------------------------------------------------------------------
logs="$work/serve-logs" results="$work/serve-results"
mkdir -p "$logs"
url="http://127.0.0.1:$port"
server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT
start_server() {  # NAME COMMAND...
  local name="$1"; shift
  "$@" >"$logs/$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    if curl -sf "$url/v1/models" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "serve_compare: $name exited; log $logs/$name.log:" >&2; tail -20 "$logs/$name.log" >&2; exit 1
    fi
    sleep 0.5
  done
  echo "serve_compare: $name not ready after 300 s" >&2; exit 1
}
switchyard_server=("$sy" --threads "$threads" serve --model "$work/bench-model" --port "$port"
  --served-model-name bench --kv-cache-tokens 8192)
llama_args=(--model "$work/bench-q8_0.gguf" --model_alias bench --host 127.0.0.1 --port "$port"
  --n_threads "$threads" --n_threads_batch "$threads" --n_ctx 1024 --n_batch 512
  --logits_all false --interrupt_requests false --verbose false)
llama_server=("$work/llama-venv/bin/python" "$work/llama_server_shim.py" "${llama_args[@]}")
bench() {  # OUT NUM_PROMPTS CONCURRENCY SEED (tools/bench_common.sh: run_seed)
  "$sy" bench serve --url "$url" --model bench --num-prompts "$2" --concurrency "$3" --seed "$4" \
    --input-len "$input_len" --output-len "$output_len" --vocab-size "$vocab" --json >"$1"
}

# --- probe: the unmodified llama_cpp.server against bench serve's request ---------------------
echo "== probe: python -m llama_cpp.server (unmodified) =="
start_server llama-unmodified "$work/llama-venv/bin/python" -m llama_cpp.server "${llama_args[@]}"
bench "$results/probe-unmodified.json" 1 1 1 || true
python3 - "$results/probe-unmodified.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  bench serve: completed {r['completed']}/1, output tokens {r['total_output_tokens']}, error: {r['errors'][0][:300]!r}")
EOF
echo -n "  token-id prompt: HTTP "
curl -s -o "$results/probe-ids.txt" -w '%{http_code}' "$url/v1/completions" -H 'content-type: application/json' \
  -d '{"model":"bench","prompt":[20,21,22],"max_tokens":4,"temperature":0}'
echo ", $(head -c 150 "$results/probe-ids.txt")..."
echo -n "  text prompt, stream, include_usage: "
curl -s "$url/v1/completions" -H 'content-type: application/json' -d '{"model":"bench","prompt":"<t20><t21><t22>",
  "max_tokens":4,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' |
  python3 -c 'import sys, json
events = [json.loads(l[6:]) for l in sys.stdin if l.startswith("data: {")]
print(len(events), "events; usage in any:", any("usage" in e for e in events))'
grep -m1 -o "AssertionError.*" "$logs/llama-unmodified.log" | sed 's/^/  server log: /' || true
stop_server

# --- wait for a quiet machine, before each engine and each repetition ------------------------------
source "$root/tools/bench_common.sh"  # wait_quiet, run_seed, prefix_hits, report_run
: >"$results/quiet.txt"

# --- timed runs: one engine at a time ------------------------------------------------------------
for engine in switchyard llama.cpp; do
  wait_quiet "$engine" "$quiet_wait"
  if [ "$engine" = switchyard ]; then start_server "$engine" "${switchyard_server[@]}"
  else start_server "$engine" "${llama_server[@]}"; fi
  bench "$results/$engine-warmup.json" 4 4 2  # first-request costs out of the timed runs
  for spec in "1 16" "32 96"; do
    read -r concurrency prompts <<<"$spec"
    for rep in $(seq "$reps"); do
      wait_quiet "$engine c$concurrency r$rep" "$quiet_wait_rep"
      cut -d' ' -f1 /proc/loadavg >"$results/$engine-c$concurrency-r$rep.load"
      hits_before="$(prefix_hits "$url")"
      bench "$results/$engine-c$concurrency-r$rep.json" "$prompts" "$concurrency" "$(run_seed "$concurrency" "$rep")"
      report_run "$results/$engine-c$concurrency-r$rep.json" "$hits_before" "$(prefix_hits "$url")"
    done
  done
  stop_server
done

python3 - "$results" "$reps" <<'EOF'
import json, statistics, sys
results, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for engine in ("switchyard", "llama.cpp"):
    for c, n in ((1, 16), (32, 96)):
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
print("\nswitchyard / llama.cpp (tok/s: higher is better for switchyard; TTFT, TPOT: lower is)")
for c in (1, 32):
    a, b = rows["switchyard", c], rows["llama.cpp", c]
    print(f"  concurrency {c:>2}: tok/s x{a[0] / b[0]:.2f}   TTFT x{a[1] / b[1]:.2f}   TPOT x{a[2] / b[2]:.2f}")
EOF
