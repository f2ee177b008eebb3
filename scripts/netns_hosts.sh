#!/bin/sh
# Several "hosts" on this machine: Linux network namespaces, each with its own network stack,
# hostname (UTS namespace) and address 10.77.0.(i+1)/24 on a veth link to a bridge in a switch
# namespace — so MPI runs across them over real TCP, with no shared memory between hosts and
# nothing changed in the machine's own network namespace. Needs root and iproute2.
#
#   scripts/netns_hosts.sh up PREFIX N            make hosts PREFIX-h0 .. PREFIX-h(N-1)
#   scripts/netns_hosts.sh down PREFIX            remove them (also what `up` does first)
#   scripts/netns_hosts.sh hostfile PREFIX N SLOTS  print an mpirun hostfile (SLOTS ranks each)
#   scripts/netns_hosts.sh mpirun PREFIX ARGS...  mpirun from host 0, TCP over the veth links only
#   scripts/netns_hosts.sh shape PREFIX I QDISC ARGS...  `tc qdisc replace dev eth0 root QDISC ARGS`
#                                                on host I (`netem delay 5ms loss 1%`; kernels
#                                                without sch_netem: `tbf rate 100mbit …`)
#   scripts/netns_hosts.sh exec PREFIX I CMD...   run CMD on host I
#
# PREFIX is at most 6 characters (interface names are limited to 15). mpirun reaches the other
# hosts through scripts/netns_agent.sh, OpenMPI's launch agent (in place of ssh).
set -eu

SUBNET=10.77.0
here=$(cd "$(dirname "$0")" && pwd)

ns() { echo "$1-h$2"; }

down() {
    for n in $(ip netns list | awk '{print $1}' | grep "^$1-" || true); do
        ip netns del "$n" 2>/dev/null || true
    done
}

up() {
    prefix=$1
    count=$2
    down "$prefix"
    sw="$prefix-sw"
    ip netns add "$sw"
    ip netns exec "$sw" ip link add br0 type bridge
    ip netns exec "$sw" ip link set br0 up
    i=0
    while [ "$i" -lt "$count" ]; do
        h=$(ns "$prefix" "$i")
        ip netns add "$h"
        # Created inside the host namespace, so no interface ever appears in the machine's own.
        ip netns exec "$h" ip link add eth0 type veth peer name "p$i" netns "$sw"
        ip netns exec "$sw" ip link set "p$i" master br0
        ip netns exec "$sw" ip link set "p$i" up
        ip netns exec "$h" ip addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip netns exec "$h" ip link set eth0 up
        ip netns exec "$h" ip link set lo up
        i=$((i + 1))
    done
}

# Runs "$@" on host $2 of prefix $1, with the host's own hostname (its address).
on_host() {
    prefix=$1
    i=$2
    shift 2
    exec ip netns exec "$(ns "$prefix" "$i")" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$SUBNET.$((i + 1))" "$@"
}

cmd=${1:-}
[ $# -ge 2 ] || { sed -n '2,18p' "$0"; exit 2; }
shift
case "$cmd" in
up) up "$1" "$2" ;;
down) down "$1" ;;
hostfile)
    i=0
    while [ "$i" -lt "$2" ]; do
        echo "$SUBNET.$((i + 1)) slots=$3"
        i=$((i + 1))
    done
    ;;
mpirun)
    prefix=$1
    shift
    export TITAN_NETNS_PREFIX="$prefix"
    on_host "$prefix" 0 mpirun --allow-run-as-root \
        --mca plm_rsh_agent "$here/netns_agent.sh" \
        --mca btl tcp,self \
        --mca btl_tcp_if_include "$SUBNET.0/24" \
        --mca oob_tcp_if_include "$SUBNET.0/24" \
        "$@"
    ;;
shape)
    prefix=$1
    i=$2
    shift 2
    ip netns exec "$(ns "$prefix" "$i")" tc qdisc replace dev eth0 root "$@"
    ;;
exec)
    prefix=$1
    i=$2
    shift 2
    on_host "$prefix" "$i" "$@"
    ;;
*)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
