#!/usr/bin/env bash
# The seed's overlap experiment on this machine: `bench layer` in every overlap mode, the modes
# alternating batch by batch in one run, with the ranks on emulated hosts whose links are shaped
# to RATE (tc's tbf; scripts/netns-cluster.sh).
#
#   scripts/bench-overlap.sh HOSTS RATE OUTPUT [bench layer options...]
#   e.g. scripts/bench-overlap.sh 2 10gbit docs/bench/overlap-10gbit.txt --kv-len 5000
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
hosts="${1:?hosts}"
rate="${2:?link rate, e.g. 10gbit}"
output="${3:?output file}"
shift 3
"$here/netns-cluster.sh" down "$hosts"
"$here/netns-cluster.sh" up "$hosts" "$rate"
trap '"$here/netns-cluster.sh" down "$hosts"' EXIT
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ), $hosts emulated hosts, links shaped to $rate"
  echo "# scripts/bench-overlap.sh $hosts $rate $output $*"
  "$here/netns-cluster.sh" mpirun "$hosts" "$here/../build/switchyard" --threads 1 bench layer \
    --overlap none,dispatch,microbatch "$@" 2>&1
} | tee "$output"
