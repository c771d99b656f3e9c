#!/usr/bin/env bash
# MPI across two emulated hosts: two network namespaces on a private bridge (10.77.0.0/24), each
# with its own UTS hostname, joined by mpirun through an rsh agent (scripts/netns-hosts). Runs the
# MPI transport test (p2p, every native collective, split) and the communicator test (every
# collective with native and own algorithms) with 4 ranks, 2 per host, over `--mca btl tcp,self`, checks that the ranks saw different hostnames and that the traffic
# crossed the veths (interface byte counters), prints an allreduce bandwidth figure, and trains
# a small model across the hosts (same loss as two local workers).
# Skips (77) without root / ip netns, mpirun or an MPI build. Cleans up even on failure.
# Usage: bash tests/mpi_netns.sh BUILDDIR     (RATE=1gbit caps each host's link with tc tbf)
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOSTS="$ROOT/scripts/netns-hosts"
PROG="$(cd "$BUILD" && pwd)/tests/transport_mpi_test"
COMM="$(cd "$BUILD" && pwd)/tests/comm_mpi_test"

[ -x "$PROG" ] || { echo "FAIL: $PROG not built"; exit 1; }
"$PROG" --probe-only >/dev/null 2>&1
if [ $? -eq 77 ]; then echo "skip: built without MPI (install libopenmpi-dev and rebuild)"; exit 77; fi
# 2 emulated hosts for the rest of the script (skips without root, ip or mpirun; torn down at the
# end, on failure or interrupt)
[ -n "${NETNS_NAME:-}" ] || exec "$HOSTS" session dtn 2 bash "$0" "$@"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# sanitizer builds: OpenMPI's components leak at exit (frames in unloaded modules that no
# suppression can name); keep ASan's memory-error checks, drop its leak report
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi() {  # SLOTS,... mpirun-args...
  local slots=$1; shift
  timeout -k 5 120 "$HOSTS" mpirun "$slots" "$@"
}
bytes() { cat "/sys/class/net/$NETNS_NAME-v$1/statistics/rx_bytes"; }

fails=0
ok() { if eval "$1"; then :; else fails=$((fails + 1)); echo "FAIL: $2"; fi; }

rx1=$(bytes 1) rx2=$(bytes 2)
mpi 2,2 -np 4 "$PROG" ok >"$T/ok.log" 2>&1
rc=$?
cat "$T/ok.log"
ok "[ $rc -eq 0 ]" "mpirun across the hosts exited $rc"
ok "[ \$(grep -c 'checks, 0 failures' '$T/ok.log') -eq 4 ]" "all 4 ranks pass the transport test"
ok "[ \$(grep -o 'on host $NETNS_NAME-[12]' '$T/ok.log' | sort -u | wc -l) -eq 2 ]" "ranks see two different hostnames"
if [ -x "$COMM" ]; then  # the public communicator (native and its own algorithms) across hosts
  mpi 2,2 -np 4 "$COMM" >"$T/comm.log" 2>&1
  rc=$?
  cat "$T/comm.log"
  ok "[ $rc -eq 0 ] && [ \$(grep -c 'checks, 0 failures' '$T/comm.log') -eq 4 ]" "communicator test across the hosts (exit $rc)"
fi
d1=$(($(bytes 1) - rx1)) d2=$(($(bytes 2) - rx2))
echo "veth bytes sent by host 1: $d1, by host 2: $d2"
ok "[ $d1 -gt 100000 ] && [ $d2 -gt 100000 ]" "traffic crossed the veths (host1 $d1 B, host2 $d2 B)"

# allreduce 64 KiB .. 16 MiB, one rank per host: figures for the report, not an assertion
rx1=$(bytes 1)
mpi 1,1 -np 2 "$PROG" bench 64k 1m 16m >"$T/bench.log" 2>&1
rc=$?
cat "$T/bench.log"
ok "[ $rc -eq 0 ] && grep -q busbw '$T/bench.log'" "bandwidth run across the hosts (exit $rc)"
echo "veth bytes sent by host 1 during the bandwidth run: $(($(bytes 1) - rx1))"

# a real training job across the two hosts (one rank each) gives exactly the loss of the same
# job on two local shared-memory workers
DATA=/usr/share/datasets/fashion-mnist
if [ -x "$BUILD/dtrain" ] && [ -e "$DATA/train-images-idx3-ubyte.gz" ]; then
  DT="$(cd "$BUILD" && pwd)/dtrain"
  TRAIN=(train --data fashion-mnist --model mlp --epochs 1 --batch 32 --max-steps 100)
  mpi 1,1 -np 2 "$DT" "${TRAIN[@]}" >"$T/train_mpi.log" 2>&1
  rc=$?
  "$DT" "${TRAIN[@]}" --workers 2 >"$T/train_shm.log" 2>&1
  a=$(grep -o 'test_loss [0-9.]*' "$T/train_mpi.log") b=$(grep -o 'test_loss [0-9.]*' "$T/train_shm.log")
  echo "train across hosts: $(grep -m1 'ranks over' "$T/train_mpi.log"); $a (local shm workers: $b)"
  ok "[ $rc -eq 0 ] && [ -n \"$a\" ] && [ \"$a\" = \"$b\" ]" "training across hosts matches local workers ($a vs $b): $(tail -3 "$T/train_mpi.log")"
else
  echo "no dtrain binary or Fashion-MNIST: training run across hosts left out"
fi

echo "mpi_netns: $fails failures"
[ $fails -eq 0 ]
