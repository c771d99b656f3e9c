#!/usr/bin/env bash
# Hierarchical allreduce across emulated hosts (network namespaces joined by mpirun through the
# rsh agent of scripts/netns-hosts, real hostnames): 2 hosts x 2 ranks and 3 hosts x 1-2 ranks
# (2, 1, 2). On every rank the layout turns the hierarchical path on by itself, and every dtype,
# op and count reduces exactly (comm_hier_test mpi: the expected result computed on each rank).
# Skips (77) without root / ip netns, mpirun or an MPI build. Cleans up even on failure or
# interrupt. Usage: bash tests/hier_netns.sh BUILDDIR
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOSTS="$ROOT/scripts/netns-hosts"
PROG="$(cd "$BUILD" && pwd)/tests/comm_hier_test"
PROBE="$(cd "$BUILD" && pwd)/tests/transport_mpi_test"
NET=10.77.0

if ! why=$("$HOSTS" check 2>&1); then echo "skip: needs root and ip netns ($why)"; exit 77; fi
command -v mpirun >/dev/null || { echo "skip: mpirun not found (install openmpi-bin)"; exit 77; }
[ -x "$PROG" ] || { echo "FAIL: $PROG not built"; exit 1; }
"$PROBE" --probe-only >/dev/null 2>&1
if [ $? -eq 77 ]; then echo "skip: built without MPI (install libopenmpi-dev and rebuild)"; exit 77; fi

exec 9>/tmp/dtrain-netns.lock  # one emulated cluster at a time (the subnet is fixed)
flock -w 120 9 || { echo "FAIL: another netns run holds /tmp/dtrain-netns.lock"; exit 1; }
for br in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^dth[0-9]+-br$'); do
  "$HOSTS" down "${br%-br}" 3
done
NAME="dth$$"
T=$(mktemp -d)
cleanup() { "$HOSTS" down "$NAME" 3; rm -rf "$T"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
"$HOSTS" up "$NAME" 3 "$NET" || { echo "FAIL: could not create the emulated hosts"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # OpenMPI's own leaks at exit
mpi() {  # HOSTFILE NP
  timeout -k 5 180 mpirun --hostfile "$1" -np "$2" --mca plm_rsh_agent "$HOSTS agent" \
    --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include "$NET.0/24" \
    --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --bind-to none --oversubscribe ${DTRAIN_SANITIZED:+-x DTRAIN_SANITIZED} "$PROG" mpi
}
fails=0
layout() {  # NAME NP SLOTS...
  local what=$1 np=$2 i=1; shift 2
  : >"$T/hf"
  for s in "$@"; do echo "$NAME-$i slots=$s" >>"$T/hf"; i=$((i + 1)); done
  mpi "$T/hf" "$np" >"$T/log" 2>&1
  local rc=$? hosts=$#
  cat "$T/log"
  if [ $rc -eq 0 ] && [ "$(grep -c 'checks, 0 failures' "$T/log")" -eq "$np" ] &&
     [ "$(grep -c "$hosts hosts, hierarchical on" "$T/log")" -eq "$np" ]; then
    echo "ok: $what: hierarchical on, exact on all $np ranks"
  else fails=$((fails + 1)); echo "FAIL: $what (exit $rc)"; fi
}
layout "2 hosts x 2 ranks" 4 2 2
layout "3 hosts x 1-2 ranks" 5 2 1 2
[ $fails -eq 0 ] && echo "hier_netns: passed" || echo "hier_netns: $fails failures"
[ $fails -eq 0 ]
