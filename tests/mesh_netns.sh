#!/usr/bin/env bash
# Tensor and pipeline parallelism across two emulated hosts (network namespaces with their own
# hostnames, joined by mpirun through scripts/netns-hosts; traffic over TCP on the veths): --tp 2
# and --pp 2 (one rank per host: every tensor-parallel allreduce and every activation crosses the
# link), dp2 x tp2 (2 ranks per host: tensor parallel within a host, data parallel across) and
# tp2 x pp2 (a pipeline stage per host, its tensor-parallel pair within it).
# Each run equals the same layout on one host (shm workers): the train and test losses of every
# epoch as printed, and the final parameters and optimizer state bit for bit (2-rank reductions
# are exact in any order). Skips (77) without root / ip netns, mpirun or an MPI build; the hosts
# are torn down at the end, on failure or on interrupt. Usage: bash tests/mesh_netns.sh BUILDDIR
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOSTS="$ROOT/scripts/netns-hosts"
DT="$(cd "$BUILD" && pwd)/dtrain"
PROBE="$(cd "$BUILD" && pwd)/tests/transport_mpi_test"

[ -x "$DT" ] || { echo "FAIL: $DT not built"; exit 1; }
"$PROBE" --probe-only >/dev/null 2>&1
if [ $? -eq 77 ]; then echo "skip: built without MPI (install libopenmpi-dev and rebuild)"; exit 77; fi
[ -n "${NETNS_NAME:-}" ] || exec "$HOSTS" session dtm 2 bash "$0" "$@"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # OpenMPI's own leaks at exit
python3 "$ROOT/tests/tools/word_corpus.py" "$T/corpus.txt" 11 3000
TRAIN=(train --data "text:$T/corpus.txt" --model "gpt:L=2,H=4,C=32,T=32" --optimizer adamw --lr 3e-3 --seed 5 --epochs 3)
epochs() { grep -o 'epoch [0-9]*/[0-9]*[^:]*: train_loss [0-9.]* test_loss [0-9.]*' "$1"; }
checks=0 fails=0
check() {  # NAME LOCAL-FLAGS -- SLOTS,... NP HOSTS-FLAGS
  local what=$1; shift
  local local_flags=() hosts_flags=()
  while [ "$1" != "--" ]; do local_flags+=("$1"); shift; done
  shift
  local slots=$1 np=$2; shift 2
  checks=$((checks + 1))
  "$DT" "${TRAIN[@]}" "${local_flags[@]}" --save "$T/one.st" >"$T/one.log" 2>&1
  local rc1=$?
  local sent0 sent
  sent0=$(cat "/sys/class/net/$NETNS_NAME-v1/statistics/rx_bytes")
  timeout -k 5 180 "$HOSTS" mpirun "$slots" -np "$np" "$DT" "${TRAIN[@]}" "$@" --save "$T/two.st" >"$T/two.log" 2>&1
  local rc2=$? a b d
  sent=$(($(cat "/sys/class/net/$NETNS_NAME-v1/statistics/rx_bytes") - sent0))
  a=$(epochs "$T/one.log") b=$(epochs "$T/two.log")
  d=$(python3 "$ROOT/tests/tools/ckpt_diff.py" "$T/two.st" "$T/one.st" 0 2>&1 | tail -1)
  if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(wc -l <<<"$a")" -eq 3 ] &&
     python3 "$ROOT/tests/tools/ckpt_diff.py" "$T/two.st" "$T/one.st" 0 >/dev/null 2>&1 &&
     grep -q "$np ranks over mpi" "$T/two.log" && [ "$sent" -gt 100000 ]; then
    echo "ok: $what across 2 hosts ($(grep -m1 -o '[0-9]* ranks over [a-z]*' "$T/two.log"), mpirun $slots):" \
      "3 epochs' losses as on one host, last $(tail -1 <<<"$a" | grep -o 'train_loss.*'); checkpoint equal ($d);" \
      "host 1 sent $sent B over its link"
  else
    fails=$((fails + 1))
    echo "FAIL: $what (one host exit $rc1, two hosts exit $rc2; checkpoints: $d; host 1 sent $sent B)"
    echo "  one host:  ${a:-$(tail -3 "$T/one.log")}"
    echo "  two hosts: ${b:-$(tail -3 "$T/two.log")}"
  fi
}
check "tp2" --tp 2 --workers 2 --batch 8 -- 1,1 2 --tp 2 --batch 8
check "pp2 (1F1B, 4 micro-batches)" --pp 2 --workers 2 --microbatches 4 --pp-schedule 1f1b --batch 8 -- \
  1,1 2 --pp 2 --microbatches 4 --pp-schedule 1f1b --batch 8
check "dp2 x tp2" --tp 2 --workers 4 --batch 4 -- 2,2 4 --tp 2 --batch 4
check "tp2 x pp2 (a stage per host)" --tp 2 --pp 2 --workers 4 --microbatches 2 --batch 8 -- \
  2,2 4 --tp 2 --pp 2 --microbatches 2 --batch 8
echo "mesh_netns: $checks checks, $fails failures"
[ $fails -eq 0 ]
