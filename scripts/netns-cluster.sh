#!/usr/bin/env bash
# Emulated machines on this one: N network namespaces ("hosts") joined to a bridge by veth pairs,
# each host's link shaped with tc to an inter-node fabric, so mpirun runs across real TCP links.
#
#   scripts/netns-cluster.sh up N [RATE]           (default: 10gbit per link and direction)
#   scripts/netns-cluster.sh down N
#   scripts/netns-cluster.sh mpirun N ARGS...      (mpirun with one rank per host, TCP only)
#
# The fabric: 10 Gbit/s per direction on every host link (a token bucket, tc's tbf), so a
# host-to-host message crosses two shaped links: a small cluster on 10GbE — slow beside
# InfiniBand, which is the point: the exchanges must show. Latency is what veth, the bridge and
# TCP add (ping: 0.07 ms minimum, 0.09 ms mean round trip here): this kernel has no netem to add
# more. Addresses are the hosts' own
# (10.77.0.0/24), reachable only inside this machine. Needs root (CI and sessions run as root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command="${1:?up|down|mpirun}"
hosts="${2:?number of hosts}"
bridge=sy-br0

up() {
  local rate="${1:-10gbit}"
  ip link show "$bridge" >/dev/null 2>&1 || {
    ip link add "$bridge" type bridge
    ip addr add 10.77.0.254/24 dev "$bridge"
    ip link set "$bridge" up
  }
  for ((i = 0; i < hosts; i++)); do
    local ns="sy-host$i"
    ip netns list | grep -qw "$ns" && continue
    ip netns add "$ns"
    ip link add "sy-veth$i" type veth peer name eth0 netns "$ns"
    ip link set "sy-veth$i" master "$bridge" up
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # Shape what leaves the host and what leaves the bridge towards it: both directions.
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 5ms
    tc qdisc add dev "sy-veth$i" root tbf rate "$rate" burst 256kb latency 5ms
  done
}

down() {
  for ((i = 0; i < hosts; i++)); do
    ip netns del "sy-host$i" 2>/dev/null || true
    ip link del "sy-veth$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

run_mpirun() {
  local list=""
  for ((i = 0; i < hosts; i++)); do list+="${list:+,}sy-host$i:1"; done
  # OpenMPI starts a daemon on each "host" through the rsh agent, which enters the namespace.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 exec mpirun \
    --mca plm_rsh_agent "$here/netns-rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include 10.77.0.0/24 --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
    --host "$list" -np "$hosts" "$@"
}

case "$command" in
  up) up "${3:-}" ;;
  down) down ;;
  mpirun) shift 2; run_mpirun "$@" ;;
  *) echo "unknown command $command" >&2; exit 2 ;;
esac
