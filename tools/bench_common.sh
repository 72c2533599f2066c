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
