#!/usr/bin/env bash
# OpenMPI's "remote shell" into an emulated host: `netns-rsh.sh HOST COMMAND...` runs the command
# inside the HOST network namespace made by netns-cluster.sh — as a machine of its own: its own
# hostname (a UTS namespace) and its own temporary directory. Without them every emulated host
# was "vm" with one /tmp, their daemons shared OpenMPI's session directory and the shared-memory
# files in it, and about one launch in ten crashed (a segfault in hwloc reading a topology another
# daemon was writing) or hung.
# OpenMPI asks its daemon to --daemonize; it stays in the foreground here instead, as it does
# under ssh with --debug-daemons, so a daemon that dies ends the job instead of leaving mpirun
# waiting for it.
set -euo pipefail
host="$1"
shift
command="$*"
command="${command//--daemonize/}"
mkdir -p "/tmp/$host"
exec ip netns exec "$host" unshare --uts /bin/sh -c \
  "hostname $host && export TMPDIR=/tmp/$host && exec $command"
