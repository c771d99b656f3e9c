#!/usr/bin/env bash
# Hierarchical allreduce across emulated hosts (network namespaces joined by mpirun through the
# rsh agent of scripts/netns-hosts, real hostnames): 2 hosts x 2 ranks (one leader per host, and
# two), 3 hosts x 1-2 ranks (2, 1, 2), both also pipelined in chunks with a remainder. On every rank the layout turns the hierarchical path on by
# itself, and every dtype, op and count reduces exactly (comm_hier_test mpi: the expected result computed on each rank).
# Skips (77) without root / ip netns, mpirun or an MPI build. Cleans up even on failure or
# interrupt. Usage: bash tests/hier_netns.sh BUILDDIR
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOSTS="$ROOT/scripts/netns-hosts"
PROG="$(cd "$BUILD" && pwd)/tests/comm_hier_test"
PROBE="$(cd "$BUILD" && pwd)/tests/transport_mpi_test"

[ -x "$PROG" ] || { echo "FAIL: $PROG not built"; exit 1; }
"$PROBE" --probe-only >/dev/null 2>&1
if [ $? -eq 77 ]; then echo "skip: built without MPI (install libopenmpi-dev and rebuild)"; exit 77; fi
# 3 emulated hosts for the rest of the script (skips without root, ip or mpirun; torn down at the
# end, on failure or interrupt)
[ -n "${NETNS_NAME:-}" ] || exec "$HOSTS" session dth 3 bash "$0" "$@"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # OpenMPI's own leaks at exit
mpi() {  # SLOTS,... NP ENV...
  local slots=$1 np=$2; shift 2
  timeout -k 5 180 "$HOSTS" mpirun "$slots" -np "$np" ${DTRAIN_SANITIZED:+-x DTRAIN_SANITIZED} "$@" "$PROG" mpi
}
fails=0
layout() {  # NAME NP SLOTS,... [mpirun -x ...]
  local what=$1 np=$2 slots=$3; shift 3
  local hosts=$(($(tr -cd , <<<"$slots" | wc -c) + 1))
  mpi "$slots" "$np" "$@" >"$T/log" 2>&1
  local rc=$?
  cat "$T/log"
  if [ $rc -eq 0 ] && [ "$(grep -c 'checks, 0 failures' "$T/log")" -eq "$np" ] &&
     [ "$(grep -c "$hosts hosts, hierarchical on" "$T/log")" -eq "$np" ]; then
    echo "ok: $what: hierarchical on, exact on all $np ranks"
  else fails=$((fails + 1)); echo "FAIL: $what (exit $rc)"; fi
}
layout "2 hosts x 2 ranks" 4 2,2
layout "2 hosts x 2 ranks, 2 leaders per host" 4 2,2 -x DTRAIN_HIER_LEADERS=2
layout "3 hosts x 1-2 ranks" 5 2,1,2
# pipelined in 40000 B chunks: several whole chunks and a remainder chunk (f32 x 100003: 10 + 3
# elements), chunk k's inter-host allreduce over MPI overlapping the host's reduce and broadcast
layout "2 hosts x 2 ranks, pipelined in 40000 B chunks" 4 2,2 -x DTRAIN_HIER_CHUNK=40000
layout "3 hosts x 1-2 ranks, pipelined in 40000 B chunks" 5 2,1,2 -x DTRAIN_HIER_CHUNK=40000
[ $fails -eq 0 ] && echo "hier_netns: passed" || echo "hier_netns: $fails failures"
[ $fails -eq 0 ]
