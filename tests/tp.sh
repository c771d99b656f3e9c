# Tensor parallelism through the real command (dtrain train --tp K --workers N) on a small corpus
# the test writes, against one process at the same global batch of 8:
#  - tp2, tp4 and dp2 x tp2 end where 1 worker ends, and print the same losses;
#  - checkpoints do not depend on the layout: --save under tp2 writes one file with the whole
#    tensors by nanoGPT's names and shapes (those of a 1-worker file, which torch_load_gpt.sh loads
#    into PyTorch), equal to 1 worker's at the same step; it resumes under 1 worker, dp2 and tp2;
#    a 1-worker checkpoint resumes under dp2 x tp2; tp2 -> tp2 resumes bit for bit;
#  - ZeRO over the mesh's dp axis (--tp 2 --workers 4 --zero 2 and 3): its checkpoint (the whole
#    parameters and Adam moments, collected from the ZeRO shards) equals 1 worker's, and it resumes
#    on 1 worker and under --zero 3 to where 1 worker ends (and a 1-worker checkpoint under --zero
#    1) (pp.sh runs ZeRO over a pipeline's dp axis)
#  - the epoch's evaluation runs on the shards (tp4, tp2 x pp2) with the loss and accuracy of the
#    whole model (dtrain eval of the run's checkpoint);
#  - dp2 x tp2 over MPI (mpirun -n 4; skipped without mpirun and under the sanitizers);
#  - the MLP (a sequential model the builder marks: its linear -> relu -> linear pair split
#    column- then row-parallel): tp2 and dp2 x tp2 against 1 worker, parameters within 1e-6
#    (not bitwise: the row-parallel output is the sum of 2 partial GEMMs, another order of the
#    same sum; seen <= 6e-8) and the same test loss and accuracy (evaluated on the shards);
#  - errors: a --tp that does not divide the heads / width / vocabulary, nor the ranks, nor an
#    MLP's column-parallel width, a model with no tensor-parallel marks, --tp with another --strategy.
# Tolerance 1e-4 on parameters after 30 AdamW steps (10 under the sanitizers) at lr 3e-3: 2-worker ddp differs from 1 worker
# by ~4e-5 here (float rounding of other GEMM shapes, which Adam's normalised steps amplify).
. "$(dirname "$0")/testlib.bash"

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 40000
M="gpt:L=2,H=4,C=32,T=32"
D="text:$TMP/corpus.txt"
run() { $DT train --data "$D" --model "$M" --optimizer adamw --lr 3e-3 --quiet "$@"; }
close() { python3 "$(dirname "$0")/st_maxdiff.py" "$@"; }
N=30 H=12  # steps, and where the resumed runs were saved (fewer under the sanitizers)
[ -n "${DTRAIN_SANITIZED:-}" ] && N=10 H=4
loss_of() { sed -n 's/.*train_loss \([0-9.]*\).*test_loss \([0-9.]*\).*/\1 \2/p' <<<"$1" | tail -1; }

# ---- errors ----
expect_fail "--tp must divide heads, width and vocabulary" "choose --tp 1, 2, 4" run --tp 3 --workers 3 --max-steps 1
expect_fail "--tp must divide the ranks" "must divide the world size 2" run --tp 4 --workers 2 --max-steps 1
expect_fail "--tp needs a marked model" "has no node marked for tensor parallelism" \
  bash -c "printf '0,1,2\n1,3,4\n' > '$TMP/t_train.csv'; $DT train --data '$TMP/t_train.csv' --model 'linear(2)' --batch 1 --tp 2 --workers 2 --max-steps 1"
expect_fail "--tp with another strategy" "tensor parallelism is its own strategy" run --tp 2 --strategy ddp --workers 2
expect_fail "--tp with --compress" "tensor parallelism runs its own collectives" run --tp 2 --compress fp16 --workers 2 --max-steps 1
out=$(run --tp 2 --workers 2 --bucket-mb 4 --max-steps 2 2>&1) && ok "--tp 2 --bucket-mb 4 sets the dp axis buckets of tp" || bad "--tp with --bucket-mb: $out"

# ---- layouts against 1 worker ----
one=$(run --batch 8 --max-steps $N --save "$TMP/one.st" 2>&1) || bad "1 worker: $one"
for lay in "2 2 8" "4 4 8" "2 4 4"; do
  set -- $lay
  out=$(run --tp "$1" --workers "$2" --batch "$3" --max-steps $N --save "$TMP/l$1$2.st" 2>&1) || bad "tp$1 on $2 ranks: $out"
  d=$(close "$TMP/one.st" "$TMP/l$1$2.st" 1e-4) && [ "$(loss_of "$out")" = "$(loss_of "$one")" ] \
    && ok "tp$1 x dp$(($2 / $1)) (--batch $3): losses $(loss_of "$out") as 1 worker, params within $d" \
    || bad "tp$1 on $2 ranks: params $d, losses '$(loss_of "$out")' vs '$(loss_of "$one")'"
done

# ---- the MLP: a linear -> relu -> linear pair, column- then row-parallel ----
python3 - "$TMP" <<'PY'
import random, sys
for name, n, seed in (("m_train", 512, 3), ("m_test", 128, 4)):
    r = random.Random(seed)
    with open(f"{sys.argv[1]}/{name}.csv", "w") as f:
        for _ in range(n):
            x = [r.uniform(-1, 1) for _ in range(12)]
            f.write(",".join([str(int((x[0] + x[1] * x[2] + 1) * 4.9) % 10)] + ["%.4f" % v for v in x]) + "\n")
PY
mlp() { $DT train --data "$TMP/m_train.csv" --model mlp --epochs 2 --optimizer adamw --lr 3e-3 --clip 0.5 "$@" 2>&1; }
fin() { grep -o 'test accuracy [0-9.]*, test loss [0-9.]*' <<<"$1"; }
one=$(mlp --batch 16 --save "$TMP/m1.st") || bad "mlp on 1 worker: $one"
for lay in "2 2 16" "2 4 8"; do
  set -- $lay
  out=$(mlp --strategy tp --tp "$1" --workers "$2" --batch "$3" --save "$TMP/m$1$2.st") || bad "mlp tp$1 on $2 ranks: $out"
  d=$(close "$TMP/m1.st" "$TMP/m$1$2.st" 1e-6) && [ -n "$(fin "$one")" ] && [ "$(fin "$out")" = "$(fin "$one")" ] \
    && ok "mlp tp$1 x dp$(($2 / $1)): params within $d of 1 worker, $(fin "$out") as 1 worker" \
    || bad "mlp tp$1 on $2 ranks: params $d, '$(fin "$out")' vs '$(fin "$one")'"
done
expect_fail "--tp must divide an MLP's column-parallel width" "layer 1, linear(128), is split column-parallel" \
  mlp --tp 3 --workers 3 --max-steps 1

# ---- checkpoints across layouts ----
run --batch 8 --max-steps $H --save "$TMP/h1.st" >/dev/null 2>&1 || bad "1 worker half"
run --tp 2 --workers 2 --batch 8 --max-steps $H --save "$TMP/htp.st" >/dev/null 2>&1 || bad "tp2 half"
d=$(close "$TMP/h1.st" "$TMP/htp.st" 2e-5) && ok "tp2 --save: one file, whole tensors by 1 worker's names and shapes, within $d" \
  || bad "tp2 checkpoint vs 1 worker's: $d"
run --batch 8 --max-steps $N --resume "$TMP/htp.st" --save "$TMP/r1.st" >/dev/null 2>&1 || bad "resume tp2 -> 1"
d=$(close "$TMP/one.st" "$TMP/r1.st" 1e-4) && ok "saved under tp2, resumed on 1 worker: within $d" || bad "tp2 -> 1: $d"
run --workers 2 --batch 4 --max-steps $N --resume "$TMP/htp.st" --save "$TMP/r2.st" >/dev/null 2>&1 || bad "resume tp2 -> dp2"
d=$(close "$TMP/one.st" "$TMP/r2.st" 1e-4) && ok "saved under tp2, resumed under dp2: within $d" || bad "tp2 -> dp2: $d"
run --tp 2 --workers 4 --batch 4 --max-steps $N --resume "$TMP/h1.st" --save "$TMP/r3.st" >/dev/null 2>&1 || bad "1 -> dp2 x tp2"
d=$(close "$TMP/one.st" "$TMP/r3.st" 1e-4) && ok "saved on 1 worker, resumed under dp2 x tp2: within $d" || bad "1 -> dp2xtp2: $d"
run --tp 2 --workers 2 --batch 8 --max-steps $N --resume "$TMP/htp.st" --save "$TMP/r4.st" >/dev/null 2>&1 || bad "tp2 -> tp2"
d=$(close "$TMP/l22.st" "$TMP/r4.st" 0) && ok "saved under tp2, resumed under tp2: bitwise equal to the uninterrupted tp2 run" \
  || bad "tp2 -> tp2 resume differs: $d"

# ---- ZeRO-2 over the dp axis of dp2 x tp2: checkpoint moments from the shards, resumed on 1 worker ----
run --tp 2 --workers 4 --zero 2 --batch 4 --max-steps $H --save "$TMP/hz.st" >/dev/null 2>&1 || bad "dp2 x tp2 --zero 2 half"
d=$(close "$TMP/h1.st" "$TMP/hz.st" 1e-4) && ok "dp2 x tp2 --zero 2 --save: parameters and Adam moments as 1 worker's, within $d" \
  || bad "dp2 x tp2 --zero 2 checkpoint vs 1 worker's: $d"
run --batch 8 --max-steps $N --resume "$TMP/hz.st" --save "$TMP/rz.st" >/dev/null 2>&1 || bad "resume zero2 dp2xtp2 -> 1"
d=$(close "$TMP/one.st" "$TMP/rz.st" 1e-4) && ok "saved under dp2 x tp2 --zero 2, resumed on 1 worker: within $d" \
  || bad "dp2 x tp2 --zero 2 -> 1: $d"
run --tp 2 --workers 4 --zero 1 --batch 4 --max-steps $N --resume "$TMP/h1.st" --save "$TMP/rz1.st" >/dev/null 2>&1 \
  || bad "resume 1 -> zero1 dp2xtp2"
d=$(close "$TMP/one.st" "$TMP/rz1.st" 1e-4) && ok "saved on 1 worker, resumed under dp2 x tp2 --zero 1 (moments into the shards): within $d" \
  || bad "1 -> dp2 x tp2 --zero 1: $d"
run --tp 2 --workers 4 --zero 3 --batch 4 --max-steps $H --save "$TMP/hz3.st" >/dev/null 2>&1 || bad "dp2 x tp2 --zero 3 half"
d=$(close "$TMP/h1.st" "$TMP/hz3.st" 1e-4) && ok "dp2 x tp2 --zero 3 --save: parameters and Adam moments as 1 worker's, within $d" \
  || bad "dp2 x tp2 --zero 3 checkpoint vs 1 worker's: $d"
run --tp 2 --workers 4 --zero 3 --batch 4 --max-steps $N --resume "$TMP/hz.st" --save "$TMP/rz3.st" >/dev/null 2>&1 \
  || bad "resume zero2 -> zero3 dp2xtp2"
d=$(close "$TMP/one.st" "$TMP/rz3.st" 1e-4) && ok "saved under dp2 x tp2 --zero 2, resumed under --zero 3: within $d" \
  || bad "dp2 x tp2 --zero 2 -> --zero 3: $d"

# ---- evaluation on the shards (the whole model is not gathered for it) ----
# the run's own test figures against `dtrain eval` of its checkpoint (the whole model, one
# process). Under tp4 the byte vocabulary's slices split space (slice 0) from letters (slice 1),
# so the argmax really crosses ranks; tp2 x pp2 also runs the pipeline's evaluation.
awk 'BEGIN { srand(5); split("the lord said unto moses and of in light was", w, " ");
       for (i = 0; i < 6000; i++) printf "%s%s", w[int(rand() * 10) + 1], (i % 13 == 12) ? ".\n" : " " }' >"$TMP/ev.txt"
figs() { grep -o 'test accuracy [0-9.]*, test loss [0-9.]*' <<<"$1" | awk '{ print $3, $6 }' | tr -d ,; }
for layout in "--tp 4 --workers 4" "--tp 2 --pp 2 --workers 4"; do
  out=$($DT train --data "text:$TMP/ev.txt" --model gpt:L=2,H=4,C=64,T=32 --batch 8 --max-steps 40 $layout \
        --save "$TMP/ev.st" 2>&1); rc=$?
  mine=$(figs "$out")
  whole=$($DT eval --checkpoint "$TMP/ev.st" --data "text:$TMP/ev.txt" 2>&1 | sed -n 's/.*loss \([0-9.]*\), accuracy \([0-9.]*\).*/\2 \1/p')
  if [ $rc -eq 0 ] && [ -n "$mine" ] && [ -n "$whole" ] && awk -v a="$mine" -v b="$whole" 'BEGIN { split(a, x, " ");
       split(b, y, " "); d1 = x[1] - y[1]; d2 = x[2] - y[2]; exit !(d1 * d1 < 1e-6 && d2 * d2 < 1e-6) }'; then
    ok "$layout: the epoch's evaluation on the shards (accuracy, loss $mine) equals the whole model's ($whole)"
  else bad "$layout: evaluation on the shards ($mine) against dtrain eval of its checkpoint ($whole), exit $rc: $out"; fi
done

# ---- the same mesh over MPI (dp2 x tp2 under mpirun) ----
if [ -n "${DTRAIN_SANITIZED:-}" ]; then
  echo "skip: the MPI layout under the sanitizers (mpirun's start alone takes ~10 s; comm_mpi.sh covers the transport)"
elif command -v mpirun >/dev/null; then
  ( export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
    [ -n "${DTRAIN_SANITIZED:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    timeout 240 mpirun -n 4 --oversubscribe --bind-to none $DT train --data "$D" --model "$M" --optimizer adamw \
      --lr 3e-3 --quiet --tp 2 --batch 4 --max-steps $N --save "$TMP/mpi.st" >"$TMP/mpi.out" 2>&1 )
  if grep -q "built without MPI" "$TMP/mpi.out"; then echo "skip: dtrain built without MPI"
  else d=$(close "$TMP/one.st" "$TMP/mpi.st" 1e-4) && grep -q "done:" "$TMP/mpi.out" \
    && ok "dp2 x tp2 over MPI (mpirun -n 4): within $d of 1 worker" || bad "mpi dp2 x tp2: $d $(tail -3 "$TMP/mpi.out")"; fi
else
  echo "skip: mpirun not found: the MPI layout is not checked"
fi
finish
