# Shared by the side-by-side scripts (tools/llama_cpp/serve_compare.sh, tools/vllm/serve_compare.sh):
# source it after setting `quiet_load` (1-min load below which the machine counts as quiet) and
# `results` (the folder whose quiet.txt records the load at each measured run's start).

# Waits until the 1-min load is below $quiet_load, at most MAX_SECONDS, then records it.
wait_quiet() {  # NAME MAX_SECONDS
  local waited=0 load
  while :; do
    load="$(cut -d' ' -f1 /proc/loadavg)"
    if python3 -c "import sys; sys.exit(float('$load') >= float('$quiet_load'))"; then
      echo "== $1: machine quiet, 1-min load $load (waited ${waited}s) =="; break
    fi
    if [ "$waited" -ge "$2" ]; then
      echo "== $1: machine NOT quiet after ${waited}s (1-min load $load): measuring anyway =="; break
    fi
    sleep 15; waited=$((waited + 15))
  done
  echo "$1: waited ${waited}s, loadavg at start $(cat /proc/loadavg)" >>"$results/quiet.txt"
}

# Prompts: `switchyard bench serve` draws its prompts from --seed (0 unless told), so two runs with
# the same seed send the same prompts, and a server with a prefix cache (switchyard; not vLLM's CPU
# MLA path, which turns it off) would answer the repeats from its cache. Each measured run therefore
# gets its own seed, the same one for every engine: same prompts side by side, none repeated.
run_seed() {  # CONCURRENCY REP
  echo $((1000 * $1 + $2))
}

# switchyard's prefix-cache hits so far (tokens), from its /metrics; "-" where the server has none.
prefix_hits() {  # URL
  curl -s "$1/metrics" | awk '/^switchyard:prefix_cache_hits_total/ {print $2; found = 1} END {if (!found) print "-"}'
}

# One line for a measured `bench serve` run: its throughput, latencies, prefix-cache hits (the
# difference of two prefix_hits readings, "-" where the server has none) and the load after it.
report_run() {  # BENCH_JSON HITS_BEFORE HITS_AFTER
  python3 -c 'import json, sys
r, load = json.load(open(sys.argv[1])), open("/proc/loadavg").read().split()[0]
hits = "-" if "-" in sys.argv[2:] else "%d" % (float(sys.argv[3]) - float(sys.argv[2]))
print("   done %d/%d in %.1f s: %.1f tok/s, median TTFT %.0f ms, TPOT %.1f ms; prefix-cache hits %s tokens; "
      "load now %s" % (r["completed"], r["num_prompts"], r["duration"], r["output_throughput"], r["median_ttft_ms"],
                       r["median_tpot_ms"], hits, load))' "$1" "$2" "$3"
}
