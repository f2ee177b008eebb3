#!/bin/sh
# OpenMPI's launch agent for the namespace hosts of scripts/netns_hosts.sh, in place of ssh:
# mpirun calls `agent HOST COMMAND...` and, as with ssh, the words of COMMAND form one shell
# command line, run here on HOST (10.77.0.N → namespace $TITAN_NETNS_PREFIX-h(N-1), with that
# hostname).
set -eu
host=$1
shift
: "${TITAN_NETNS_PREFIX:?set by scripts/netns_hosts.sh mpirun}"
n=${host##*.}
exec ip netns exec "$TITAN_NETNS_PREFIX-h$((n - 1))" unshare --uts sh -c "hostname $host; $*"
