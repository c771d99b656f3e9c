# Valgrind smoke test: a short training run (train + test CSV, checkpoint, resume, eval), a GPT
# on text with gradient accumulation and sampling must show no memory errors and no definite leaks.
. "$(dirname "$0")/testlib.bash"
if ! command -v valgrind >/dev/null; then echo "skip: valgrind not installed"; exit 77; fi
if [ -n "${DTRAIN_SANITIZED:-}" ]; then echo "skip: sanitizer build"; exit 77; fi
# valgrind 3.19 cannot execute AVX-512, which -march=native may emit: build a portable copy (without
# the cuda device: valgrind knows nothing of the CUDA runtime's mappings).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
make -s -C "$ROOT" valgrind-build >"$TMP/build.log" 2>&1 \
  || { cat "$TMP/build.log"; echo "FAIL: cannot build build-vg/dtrain"; exit 1; }
DT="$ROOT/build-vg/dtrain"
python3 - "$TMP" <<'PY'
import random, sys
random.seed(3)
for name, n in (("toy_train.csv", 256), ("toy_test.csv", 64)):
    with open(f"{sys.argv[1]}/{name}", "w") as f:
        f.write("label," + ",".join(f"f{i}" for i in range(16)) + "\n")
        for _ in range(n):
            y = random.randrange(4)
            x = [random.randrange(256) // (1 + (i % 4 == y)) for i in range(16)]
            f.write(f"{y}," + ",".join(map(str, x)) + "\n")
PY
export DTRAIN_BLAS_REEXEC=0  # no re-exec into other OpenBLAS kernels under valgrind
VG="valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99"
# The runs go in two rounds of independent jobs, as many at once as there are cores (a valgrind
# outcome does not depend on speed); the second round reads the first's checkpoints.
vg() {  # NAME CMD...: CMD under valgrind in the background; its output in $TMP/NAME.out
  local name=$1; shift
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
  ( $VG "$@" >"$TMP/$name.out" 2>&1; echo $? >"$TMP/$name.rc" ) &
}
vg_check() {  # NAME WANT_RC WHAT
  if [ "$(cat "$TMP/$1.rc" 2>/dev/null)" = "$2" ]; then ok "$3"; else bad "$3 (exit $(cat "$TMP/$1.rc" 2>/dev/null))"; cat "$TMP/$1.out"; fi
}
python3 -c "import sys; open(sys.argv[1], 'w').write('in the beginning was the word. ' * 40)" "$TMP/t.txt"
vg train $DT train --data "$TMP/toy_train.csv" --model "linear(16) relu dropout(0.2) linear(4)" --batch 16 \
  --epochs 2 --quiet --save "$TMP/v.st" --metrics "$TMP/v.jsonl"
vg gpt $DT train --data "text:$TMP/t.txt" --model "gpt:L=1,H=2,C=8,T=8" --batch 4 --max-steps 6 --optimizer adamw \
  --grad-accum 2 --quiet --save "$TMP/g.st"
vg usage $DT train --data "$TMP/toy_train.csv" --model "linear(16) relu maxpol"
wait
vg_check train 0 "train under valgrind"
vg_check gpt 0 "gpt train (text data, grad-accum) under valgrind"
vg_check usage 2 "error path under valgrind (exit 2: a wrong --model on the command line)"
vg resume $DT train --data "$TMP/toy_train.csv" --model "linear(16) relu dropout(0.2) linear(4)" --batch 16 \
  --epochs 3 --quiet --resume "$TMP/v.st"
vg eval $DT eval --checkpoint "$TMP/v.st" --data "$TMP/toy_train.csv"
vg sample $DT sample --checkpoint "$TMP/g.st" --prompt "in the" --tokens 12
wait
vg_check resume 0 "resume under valgrind"
vg_check eval 0 "eval under valgrind"
vg_check sample 0 "sample under valgrind"
finish
