#!/usr/bin/env bash
# The collective correctness test over the MPI transport: 3 ranks under mpirun, every op,
# dtype and algorithm (MPI's native collectives and ours over MPI point-to-point).
set -u
BUILD=${1:-build}
T="$BUILD/tests/comm_coll_test"
command -v mpirun >/dev/null || { echo "skip: mpirun not found (install openmpi-bin)"; exit 77; }
[ -x "$T" ] || { echo "skip: $T not built"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
# OpenMPI itself leaks at exit: no leak report in sanitizer builds (ASan still checks accesses)
[ -n "${DTRAIN_SANITIZED:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
out=$(timeout 240 mpirun -n 3 --oversubscribe --bind-to none "$T" mpi 2>&1)
rc=$?
echo "$out" | tail -n 20
if echo "$out" | grep -q "built without MPI"; then echo "skip: dtrain built without MPI"; exit 77; fi
[ $rc -eq 0 ] || { echo "FAIL: comm_coll_test over mpi exited $rc"; exit 1; }
echo "comm over mpi: 3 ranks ok"
