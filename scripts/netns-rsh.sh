#!/usr/bin/env bash
# OpenMPI's "remote shell" into an emulated host: `netns-rsh.sh HOST COMMAND...` runs the command
# inside the HOST network namespace made by netns-cluster.sh.
set -euo pipefail
host="$1"
shift
exec ip netns exec "$host" /bin/sh -c "$*"
