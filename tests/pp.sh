# Integration tests of pipeline parallelism through the real command (--pp, --microbatches,
# --pp-schedule, --pp-split) on a small corpus: flag errors, a pp2 run whose timeline shows every
# stage's forward/backward micro-batches and its sends and receives, whose metrics carry the
# bubble and bytes, and whose --save is one ordinary checkpoint with the tensors (names, shapes,
# values) of the same run on 1 worker, which 1 worker then resumes; --tp 2 --pp 2 (pipeline stages
# of tensor-parallel shards): its dry-run plan, a run equal to 1 worker (checkpoint, loss,
# metrics per axis, timeline), its checkpoint resumed under dp4 and a 1-worker one under it;
# ZeRO over the DP axis: --pp 2 --zero 2|3 and --tp 2 --pp 2 --zero 1|2|3 give 1 worker's
# checkpoint and resume to and from 1 worker.
. "$(dirname "$0")/testlib.bash"

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 20000
M="gpt:L=2,H=2,C=16,T=16"
D="text:$TMP/corpus.txt"
run() { $DT train --data "$D" --model "$M" --batch 8 --optimizer adamw --lr 3e-3 --quiet --seed 3 "$@"; }

# ---- errors ----
expect_fail "--pp must divide --workers" "do not divide into pipelines of 2" run --pp 2 --workers 3
expect_fail "--microbatches needs --pp" "need --pp K" run --microbatches 4
expect_fail "more micro-batches than samples" "micro-batches of at least one sample" run --pp 2 --workers 2 --batch 4 --microbatches 8
expect_fail "an empty --pp-split cut" "an empty cut" run --pp 2 --workers 2 --pp-split "3:"
expect_fail "--pp with another strategy" "--strategy ddp is another strategy" run --pp 2 --workers 2 --strategy ddp
expect_fail "--pp against the spec" "sets stages=4" run --pp 2 --workers 2 --strategy "pp(stages=4)"
expect_fail "a bad schedule" "choose gpipe or 1f1b" run --pp 2 --workers 2 --pp-schedule zigzag
expect_fail "a cut inside a block lists the valid ones" "valid first nodes of a stage: 3 (transformer.wpe)" \
  run --pp 2 --workers 2 --pp-split 6 --max-steps 1
grep -qF "pp(stages=K,microbatches=M,schedule=gpipe|1f1b" <<<"$($DT train --help)" && grep -q -- "--pp-split N1:N2" \
  <<<"$($DT train --help)" && ok "--help shows the pp spec and --pp-split" || bad "--help lacks the pp lines"

# ---- a pp2 run: timeline, metrics, checkpoint ----
out=$(run --pp 2 --workers 2 --microbatches 4 --pp-schedule gpipe --max-steps 12 --timeline "$TMP/tl.json" \
  --metrics "$TMP/pp.jsonl" --save "$TMP/pp.st" 2>&1) || bad "pp2 run: $out"
out1=$(run --max-steps 12 --save "$TMP/one.st" --metrics "$TMP/one.jsonl" 2>&1) || bad "1 worker run: $out1"
python3 - "$TMP/tl.json" <<'PY' && ok "timeline: both stages' F0..F3/B0..B3 and their sends and receives" || bad "timeline"
import json, sys
d = json.load(open(sys.argv[1])); ev = d["traceEvents"] if isinstance(d, dict) else d
names = {(e.get("pid"), e.get("name")) for e in ev if e.get("ph") == "X"}
for r in (0, 1):
    for j in range(4):
        assert (r, "F%d" % j) in names and (r, "B%d" % j) in names, (r, j)
for j in range(4):
    assert (0, "send act %d" % j) in names and (1, "recv act %d" % j) in names, j
    assert (1, "send grad %d" % j) in names and (0, "recv grad %d" % j) in names, j
    assert (1, "recv feed %d" % j) in names, j   # the targets travel to the last stage
PY
python3 - "$TMP/pp.jsonl" "$TMP/one.jsonl" <<'PY' && ok "metrics: pp bubble, bytes, in-flight 4 (GPipe M=4), same loss as 1 worker" || bad "metrics: $(tail -1 $TMP/pp.jsonl)"
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])][-1]; o = [json.loads(l) for l in open(sys.argv[2])][-1]
pp = p["pp"]
assert 0 <= pp["bubble"] < 1 and abs(pp["bubble_ideal"] - 1 / 5) < 1e-9 and pp["bytes_sent"] > 0, pp
assert pp["peak_inflight"] == 4 and len(pp["rss_mb"]) == 2, pp
assert abs(p["train_loss"] - o["train_loss"]) < 2e-5 and abs(p["test_loss"] - o["test_loss"]) < 2e-5, (p, o)
PY
python3 - "$TMP/pp.st" "$TMP/one.st" <<'PY' && ok "pp2 --save: one file, the 1-worker tensors (names, shapes, values within 2e-5)" || bad "pp2 checkpoint"
import json, struct, sys, array
def tensors(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); h.pop("__metadata__")
    return {k: (v["shape"], array.array("f", raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])) for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), a.keys() ^ b.keys()
assert "transformer.h.1.mlp.c_proj.weight" in a and "optim.m.transformer.h.1.mlp.c_proj.weight" in a
for k in a:
    assert a[k][0] == b[k][0], k
    assert max(abs(x - y) for x, y in zip(a[k][1], b[k][1])) < 2e-5, k
PY
out=$(run --resume "$TMP/pp.st" --max-steps 16 2>&1) && ok "1 worker resumes the pp2 checkpoint" || bad "resume pp2 on 1: $out"
out=$(run --resume "$TMP/one.st" --max-steps 16 --pp 2 --workers 2 --pp-split transformer.h.1.ln_1 2>&1) \
  && ok "pp2 (--pp-split by name) resumes the 1-worker checkpoint" || bad "resume 1 on pp2: $out"
# ---- tp x pp: --tp 2 --pp 2 on 4 ranks (stages of tensor-parallel shards) ----
ROOT=$(cd "$(dirname "$0")/.." && pwd)
diff_ok() { python3 "$ROOT/tests/tools/ckpt_diff.py" "$@" --abs; }
expect_fail "--tp x --pp must divide the ranks" "must divide the world size 2" run --tp 2 --pp 2 --workers 2 --max-steps 1
expect_fail "--tp x --pp: the loss stays with the head" "the last stage would hold only the loss" \
  run --tp 2 --pp 2 --workers 4 --pp-split loss --max-steps 1
expect_fail "--tp x --pp: tp must divide the heads" "choose --tp 1, 2" run --tp 3 --pp 2 --workers 6 --max-steps 1
plan=$(run --tp 2 --pp 2 --workers 8 --microbatches 4 --dry-run 2>&1)
grep -q "dp 2 x pp 2 x tp 2" <<<"$plan" && grep -q "^rank 7 (dp 1, stage 1, tp 1):" <<<"$plan" \
  && grep -q "batch 2 x 4 micro-batches, schedule 1f1b" <<<"$plan" \
  && ok "--dry-run --tp 2 --pp 2 --workers 8: the dp2 x pp2 x tp2 plan, every rank at its mesh place" \
  || bad "dry run of the mesh: $plan"
out=$(run --tp 2 --pp 2 --workers 4 --microbatches 2 --max-steps 12 --metrics "$TMP/tpp.jsonl" --save "$TMP/tpp.st" \
  --timeline "$TMP/tpp_tl.json" 2>&1) || bad "tp2 x pp2 run: $out"
d=$(diff_ok "$TMP/tpp.st" "$TMP/one.st" 2e-5) && ok "--tp 2 --pp 2: one checkpoint, the 1-worker tensors ($d)" \
  || bad "tp2 x pp2 checkpoint vs 1 worker: $d"
python3 - "$TMP/tpp.jsonl" "$TMP/one.jsonl" "$TMP/tpp_tl.json" <<'PY' && ok "tp2 x pp2 metrics: loss as 1 worker, bubble, bytes per axis; timeline: stages and tp allreduces" || bad "tp2 x pp2 metrics: $(tail -1 $TMP/tpp.jsonl)"
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])][-1]; o = [json.loads(l) for l in open(sys.argv[2])][-1]
pp, cb = p["pp"], p["comm_bytes"]
assert pp["tp"] == 2 and pp["stages"] == 2 and 0 <= pp["bubble"] < 1 and pp["tp_block_bytes"] > 0, pp
assert cb["tp"] > 0 and cb["pp"] > 0 and cb["dp"] == 0, cb
assert abs(p["train_loss"] - o["train_loss"]) < 2e-5 and abs(p["test_loss"] - o["test_loss"]) < 2e-5, (p, o)
d = json.load(open(sys.argv[3])); ev = d["traceEvents"] if isinstance(d, dict) else d
names = {(e.get("pid"), e.get("name")) for e in ev if e.get("ph") == "X"}
for r in range(4):
    assert (r, "F0") in names and (r, "B1") in names and (r, "tp allreduce") in names, r
assert (0, "send act 0") in names and (2, "recv act 0") in names and (1, "send act 0") in names and (3, "recv act 0") in names
PY
run --max-steps 16 --save "$TMP/one16.st" >/dev/null 2>&1 || bad "1 worker, 16 steps"
out=$(run --resume "$TMP/tpp.st" --max-steps 16 --workers 4 --save "$TMP/r_dp4.st" --batch 2 2>&1) || bad "tp2xpp2 -> dp4: $out"
d=$(diff_ok "$TMP/r_dp4.st" "$TMP/one16.st" 2e-5) && ok "saved under tp2 x pp2, resumed under dp4: as 1 worker ($d)" \
  || bad "tp2 x pp2 -> dp4: $d"
out=$(run --resume "$TMP/one.st" --max-steps 16 --tp 2 --pp 2 --workers 4 --pp-schedule gpipe --save "$TMP/r_tpp.st" 2>&1) \
  || bad "1 -> tp2 x pp2: $out"
d=$(diff_ok "$TMP/r_tpp.st" "$TMP/one16.st" 2e-5) && ok "saved on 1 worker, resumed under tp2 x pp2 (gpipe): as 1 worker ($d)" \
  || bad "1 -> tp2 x pp2: $d"

# ---- ZeRO over the pipeline's DP axis: --pp 2 --zero 2|3 (dp2 x pp2), --tp 2 --pp 2 --zero 1|2|3 (dp2 x tp2 x pp2) ----
expect_fail "--zero 4 with --tp --pp" "3 (and the parameters)" run --tp 2 --pp 2 --zero 4 --workers 8 --max-steps 1
out=$(run --pp 2 --zero 2 --workers 2 --max-steps 1 2>&1) && grep -q "zero 2 on one model copy (2 ranks) shards nothing" \
  <<<"$out" && ok "--pp 2 --zero 2 on 2 ranks (one pipeline) says it shards nothing" || bad "pp zero on dp 1: $out"
plan=$(run --pp 2 --zero 2 --workers 4 --batch 4 --dry-run 2>&1)
grep -q "ZeRO stage 2" <<<"$plan" && grep -q "^rank 3 (dp 1, stage 1, tp 0):" <<<"$plan" \
  && ok "--dry-run --pp 2 --zero 2 --workers 4: the dp2 x pp2 ZeRO-2 plan" || bad "dry run of pp zero 2: $plan"
out=$(run --pp 2 --zero 2 --workers 4 --batch 4 --microbatches 2 --max-steps 12 --save "$TMP/ppz2.st" 2>&1) \
  || bad "pp2 zero 2: $out"
d=$(diff_ok "$TMP/ppz2.st" "$TMP/one.st" 2e-5) && ok "--pp 2 --zero 2 (dp2 x pp2): its checkpoint is 1 worker's ($d)" \
  || bad "pp2 zero 2 vs 1 worker: $d"
out=$(run --pp 2 --zero 3 --workers 4 --batch 4 --microbatches 2 --max-steps 12 --save "$TMP/ppz3.st" \
  --metrics "$TMP/ppz3.jsonl" 2>&1) || bad "pp2 zero 3: $out"
d=$(diff_ok "$TMP/ppz3.st" "$TMP/one.st" 2e-5) && python3 - "$TMP/ppz3.jsonl" "$TMP/one.jsonl" <<'PY' \
  && ok "--pp 2 --zero 3 (dp2 x pp2): its checkpoint is 1 worker's ($d), and its train and test loss" || bad "pp2 zero 3: $d"
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])][-1]; o = [json.loads(l) for l in open(sys.argv[2])][-1]
assert abs(p["train_loss"] - o["train_loss"]) < 2e-5 and abs(p["test_loss"] - o["test_loss"]) < 2e-5, (p, o)
PY
zs="1 2 3"; [ -n "${DTRAIN_SANITIZED:-}" ] && zs="3"  # 8 ranks each: one stage under the sanitizers
for z in $zs; do
  out=$(run --tp 2 --pp 2 --zero $z --workers 8 --batch 4 --microbatches 2 --max-steps 12 --save "$TMP/tppz$z.st" 2>&1) \
    || bad "tp2 x pp2 zero $z: $out"
  d=$(diff_ok "$TMP/tppz$z.st" "$TMP/one.st" 2e-5) \
    && ok "--tp 2 --pp 2 --zero $z (dp2 x tp2 x pp2): its checkpoint is 1 worker's ($d)" || bad "tp2 x pp2 zero $z: $d"
done
z=${zs%% *} zin=2; [ -n "${DTRAIN_SANITIZED:-}" ] && zin=3
out=$(run --resume "$TMP/tppz$z.st" --max-steps 16 --save "$TMP/r_z$z.st" 2>&1) || bad "tp2 x pp2 zero $z -> 1: $out"
d=$(diff_ok "$TMP/r_z$z.st" "$TMP/one16.st" 2e-5) && ok "saved under --tp 2 --pp 2 --zero $z, resumed on 1 worker ($d)" \
  || bad "tp2 x pp2 zero $z -> 1 worker: $d"
out=$(run --resume "$TMP/one.st" --max-steps 16 --tp 2 --pp 2 --zero $zin --workers 8 --batch 4 --save "$TMP/r_zin.st" \
  2>&1) || bad "1 -> tp2 x pp2 zero $zin: $out"
d=$(diff_ok "$TMP/r_zin.st" "$TMP/one16.st" 2e-5) && ok "saved on 1 worker, resumed under --tp 2 --pp 2 --zero $zin ($d)" \
  || bad "1 -> tp2 x pp2 zero $zin: $d"

# ---- dp2 x pp2 over MPI: the same epoch loss as 1 worker at the same global batch ----
if command -v mpirun >/dev/null && [ -n "$(ldd "$DT" 2>/dev/null | grep -i libmpi)" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
  # OpenMPI itself leaks at exit: no leak report in sanitizer builds (ASan still checks accesses)
  [ -n "${DTRAIN_SANITIZED:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  out=$(timeout 240 mpirun -n 4 --oversubscribe --bind-to none "$DT" train --data "$D" --model "$M" --batch 4 \
    --optimizer adamw --lr 3e-3 --quiet --seed 3 --max-steps 12 --pp 2 --metrics "$TMP/mpi.jsonl" 2>&1) \
    || bad "mpirun dp2 x pp2: $out"
  python3 - "$TMP/mpi.jsonl" "$TMP/one.jsonl" <<'PY' && ok "mpirun -n 4 --pp 2 (dp2 x pp2 over MPI) trains as 1 worker" || bad "mpi pp: $out"
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])][-1]; o = [json.loads(l) for l in open(sys.argv[2])][-1]
assert p["backend"] == "mpi" and abs(p["train_loss"] - o["train_loss"]) < 2e-5, (p, o)
PY
  out=$(timeout 240 mpirun -n 4 --oversubscribe --bind-to none "$DT" train --data "$D" --model "$M" --batch 8 \
    --optimizer adamw --lr 3e-3 --quiet --seed 3 --max-steps 12 --tp 2 --pp 2 --save "$TMP/mpi_tpp.st" 2>&1) \
    || bad "mpirun tp2 x pp2: $out"
  d=$(diff_ok "$TMP/mpi_tpp.st" "$TMP/one.st" 2e-5) && ok "mpirun -n 4 --tp 2 --pp 2 (tp2 x pp2 over MPI): as 1 worker ($d)" \
    || bad "mpi tp2 x pp2: $d"
else
  echo "note: mpirun or an MPI build not found; the MPI case is left out"
fi
finish
