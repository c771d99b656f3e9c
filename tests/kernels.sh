# The kernel libraries and GEMM precisions end to end with the real command: oneDNN runs are
# bitwise repeatable; --kernels blas and onednn train to the same model (to float rounding); a
# bf16 run stopped and resumed is bitwise identical to the uninterrupted one (checkpoints keep
# f32 master weights, and their --precision for a resume that leaves it out; another one given
# is named), and so is a CNN's (blocked bf16 conv chains); DDP with 2 workers equals 1
# worker at the same global batch to float rounding, at fp32 and bf16; fp16 reports its loss
# scale in the metrics and its checkpoints keep it (a resumed fp16 run is bitwise exact too); bad
# --kernels and --precision values, and fp16 with a strategy that cannot unscale, are refused by
# name. In a build without oneDNN, --kernels onednn says what to install and the rest runs on blas.
# The blocked conv/pool kernels also run at 4 lanes (an x86-64-v2 build) against a block of 8.
. "$(dirname "$0")/testlib.bash"
# The blocked kernels at another vector width: an x86-64-v2 build (SSE, 4 lanes) against oneDNN's
# block of 8, where a channel group is half a block (the tree is valgrind.sh's, same flags)
if [ -z "${DTRAIN_SANITIZED:-}" ] && grep -q sse4_2 /proc/cpuinfo; then
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  BLK_TESTS=(conv_pool_test blocked_test blocked_bf16_test)
  if make -s -j"$(nproc)" -C "$ROOT" BUILD=build-vg CUDA=0 OPT="-O1 -march=x86-64-v2" "${BLK_TESTS[@]/#/build-vg/tests/}" \
       >"$TMP/vg-build.log" 2>&1; then
    for t in "${BLK_TESTS[@]}"; do
      "$ROOT/build-vg/tests/$t" >"$TMP/$t.log" 2>&1 && ok "x86-64-v2 build (4 lanes, block 8): $(tail -1 "$TMP/$t.log")" \
        || bad "x86-64-v2 build, $t: $(grep -m3 FAIL "$TMP/$t.log" || tail -3 "$TMP/$t.log")"
    done
  else bad "cannot build the x86-64-v2 blocked kernel tests: $(tail -3 "$TMP/vg-build.log")"; fi
fi

if ! have_fmnist; then  # the training checks need it; the kernel tests above ran without
  [ $checks -gt 0 ] && { echo "note: Fashion-MNIST not installed: the training checks are skipped"; finish; exit; }
  echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=40
[ -n "${DTRAIN_SANITIZED:-}" ] && S=8  # lighter under ASan
run() { $DT train --data fashion-mnist --model mlp --epochs 1 --quiet "$@"; }
diff_ok() { python3 "$ROOT/tests/tools/ckpt_diff.py" "$@"; }

LIB=onednn
out=$(run --kernels onednn --max-steps 1 2>&1)
if grep -q "built without oneDNN: install libdnnl-dev" <<<"$out"; then
  ok "--kernels onednn in a build without oneDNN: '$(grep -o 'built without oneDNN[^;]*' <<<"$out" | head -1)'"
  LIB=blas
else
  run --max-steps 1 --metrics "$TMP/d.jsonl" >/dev/null
  grep -q '"kernels": "onednn fp32"' "$TMP/d.jsonl" && ok "onednn fp32 is the default" || bad "default kernels: $(cat "$TMP/d.jsonl")"
fi

run --kernels $LIB --max-steps $S --batch 32 --save "$TMP/a.st" --metrics "$TMP/a.jsonl" >/dev/null || bad "$LIB run"
run --kernels $LIB --max-steps $S --batch 32 --save "$TMP/b.st" >/dev/null
cmp -s "$TMP/a.st" "$TMP/b.st" && ok "$LIB: same config twice gives bitwise identical checkpoints" || bad "$LIB runs differ"
if [ $LIB = onednn ]; then
  run --kernels blas --max-steps $S --batch 32 --save "$TMP/c.st" >/dev/null
  r=$(diff_ok "$TMP/a.st" "$TMP/c.st" 1e-3 --params) && ok "blas and onednn train the same model: $r" \
    || bad "blas vs onednn: $r"
fi

# bf16: stop at S/2, resume to S == straight to S, bit for bit
run --kernels $LIB --precision bf16 --max-steps $S --batch 32 --save "$TMP/full.st" --metrics "$TMP/full.jsonl" >/dev/null \
  || bad "bf16 run"
run --kernels $LIB --precision bf16 --max-steps $((S / 2)) --batch 32 --save "$TMP/half.st" >/dev/null
run --kernels $LIB --precision bf16 --max-steps $S --batch 32 --resume "$TMP/half.st" --save "$TMP/res.st" >/dev/null
cmp -s "$TMP/full.st" "$TMP/res.st" && ok "bf16 resumed at step $((S / 2)) is bitwise identical to the straight run" \
  || bad "bf16 resume differs: $(diff_ok "$TMP/full.st" "$TMP/res.st" 0)"
# the checkpoint keeps its --precision: a resume that leaves it out continues at bf16, one that
# gives another says so
out=$(run --kernels $LIB --max-steps $S --batch 32 --resume "$TMP/half.st" --save "$TMP/res_noprec.st" 2>&1)
cmp -s "$TMP/full.st" "$TMP/res_noprec.st" && ! grep -q "other settings" <<<"$out" \
  && ok "bf16 resumed without --precision continues at bf16, bitwise identical to the straight run" \
  || bad "bf16 resume without --precision: $out $(diff_ok "$TMP/full.st" "$TMP/res_noprec.st" 0)"
out=$(run --kernels $LIB --precision fp32 --max-steps $S --batch 32 --resume "$TMP/half.st" 2>&1)
grep -q -- "other settings: --precision fp32 (the checkpoint's run: bf16)" <<<"$out" \
  && ok "a bf16 checkpoint resumed at --precision fp32 names the change" || bad "bf16 resumed at fp32: $out"
# the CNN at bf16 (blocked conv chains, casts and packing of our own where the CPU has
# AVX512-BF16): twice the same, and resumed == straight, bit for bit
runc() { $DT train --data fashion-mnist --model cnn --epochs 1 --quiet --kernels $LIB --precision bf16 --batch 32 "$@"; }
runc --max-steps 12 --save "$TMP/c_full.st" >/dev/null || bad "cnn bf16 run"
runc --max-steps 12 --save "$TMP/c_again.st" >/dev/null
runc --max-steps 6 --save "$TMP/c_half.st" >/dev/null
runc --max-steps 12 --resume "$TMP/c_half.st" --save "$TMP/c_res.st" >/dev/null
cmp -s "$TMP/c_full.st" "$TMP/c_again.st" && cmp -s "$TMP/c_full.st" "$TMP/c_res.st" \
  && ok "cnn bf16: two runs and a run resumed at step 6 are bitwise identical" \
  || bad "cnn bf16 differs: again $(diff_ok "$TMP/c_full.st" "$TMP/c_again.st" 0), resumed $(diff_ok "$TMP/c_full.st" "$TMP/c_res.st" 0)"
r=$(python3 - "$TMP/a.jsonl" "$TMP/full.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)][-1] for f in sys.argv[1:3])
print("test loss fp32 %.4f, bf16 %.4f" % (a["test_loss"], b["test_loss"]))
sys.exit(0 if abs(a["test_loss"] - b["test_loss"]) < 0.05 else 1)
PY
) && ok "bf16 trains like fp32: $r" || bad "bf16 vs fp32: $r"

# DDP: 2 workers x 16 equal 1 worker x 32 (fp32 and bf16)
for p in fp32 bf16; do
  run --kernels $LIB --precision $p --max-steps $S --batch 32 --save "$TMP/one_$p.st" >/dev/null
  run --kernels $LIB --precision $p --workers 2 --max-steps $S --batch 16 --save "$TMP/two_$p.st" >"$TMP/two.log" 2>&1 \
    || bad "2 workers $p: $(tail -3 "$TMP/two.log")"
  r=$(diff_ok "$TMP/two_$p.st" "$TMP/one_$p.st" 1e-3 --params) && ok "$p: 2 workers x 16 equal 1 worker x 32: $r" \
    || bad "$p: 2 workers vs 1: $r"
done

# fp16: dynamic loss scaling, reported per epoch
run --kernels $LIB --precision fp16 --max-steps $S --batch 32 --metrics "$TMP/m.jsonl" >"$TMP/f16.log" 2>&1 \
  || bad "fp16 run: $(tail -3 "$TMP/f16.log")"
python3 - "$TMP/m.jsonl" "$LIB" <<'PY' && ok "fp16 metrics report the loss scale" || bad "fp16 metrics: $(cat "$TMP/m.jsonl")"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
assert r["kernels"] == sys.argv[2] + " fp16" and r["loss_scale"] > 0 and r["skipped_steps"] >= 0, r
assert r["train_loss"] == r["train_loss"] and r["train_loss"] < 2.3, r
PY

# fp16: the loss scaler's state is checkpointed, so a resumed run is bitwise exact too
run --kernels $LIB --precision fp16 --max-steps $S --batch 32 --save "$TMP/f_full.st" >/dev/null
run --kernels $LIB --precision fp16 --max-steps $((S / 2)) --batch 32 --save "$TMP/f_half.st" >/dev/null
run --kernels $LIB --precision fp16 --max-steps $S --batch 32 --resume "$TMP/f_half.st" --save "$TMP/f_res.st" >/dev/null
cmp -s "$TMP/f_full.st" "$TMP/f_res.st" && ok "fp16 resumed at step $((S / 2)) is bitwise identical (loss scale kept)" \
  || bad "fp16 resume differs: $(diff_ok "$TMP/f_full.st" "$TMP/f_res.st" 0)"
python3 - "$TMP/f_half.st" <<'PY' && ok "the fp16 checkpoint holds the loss scaler" || bad "no dtrain.loss_scale in the fp16 checkpoint"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
scale, good, skipped = meta["dtrain.loss_scale"].split(",")
assert float(scale) > 0 and int(good) >= 0 and int(skipped) >= 0, meta
PY
python3 "$ROOT/tests/tools/ckpt_meta.py" "$TMP/f_half.st" "$TMP/f_edit.st" dtrain.loss_scale=1024,0,7
run --kernels $LIB --precision fp16 --max-steps $S --batch 32 --resume "$TMP/f_edit.st" --metrics "$TMP/fe.jsonl" >/dev/null
python3 - "$TMP/fe.jsonl" <<'PY' && ok "a resumed fp16 run continues from the checkpoint's loss scaler" || bad "scaler not restored: $(cat "$TMP/fe.jsonl")"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
assert r["loss_scale"] == 1024 and r["skipped_steps"] == 7, r
PY

# bench train says what a row's precision runs as, as train does (this CPU: bf16 without
# AVX512-BF16 runs f32 kernels on rounded inputs), in the table's notes and the JSON line
note=$($DT train --data fashion-mnist --model mlp --kernels $LIB --precision bf16 --max-steps 1 2>&1 | sed -n 's/^dtrain: note: //p')
b=$($DT bench train --seconds 0 --model mlp --batch 128 --kernels $LIB --precision fp32,bf16 2>&1)
if [ -n "$note" ]; then
  grep -qF "# note ($LIB bf16 rows): $note" <<<"$b" && grep -qF "\"notes\": [{\"rows\": \"$LIB bf16\", \"note\": \"$note\"}]" <<<"$b" \
    && ok "bench train notes what $LIB bf16 runs as: $note" || bad "bench train lacks the note '$note': $b"
else
  grep -q '"notes": \[\]' <<<"$b" && ok "$LIB bf16 runs its own kernels here: bench train notes nothing" \
    || bad "bench train notes: $b"
fi
expect_fail "--kernels foo is refused" "--kernels foo: unknown kernel library (use onednn or blas)" run --kernels foo --max-steps 1
expect_fail "--precision fp8 is refused" "--precision fp8: unknown precision (use fp32, bf16 or fp16)" run --precision fp8 --max-steps 1
expect_fail "fp16 with localsgd is refused" "loss scaling works with --strategy single or ddp, not localsgd" \
  run --precision fp16 --workers 2 --strategy localsgd --max-steps 1
# refused before the data is read (a rank stopped while loading printed a second, wrong error)
expect_fail "fp16 with localsgd is refused before the data is read" "loss scaling works with --strategy single or ddp" \
  $DT train --data "$TMP/no-such-data" --precision fp16 --workers 2 --strategy localsgd --max-steps 1 --quiet
# an fp16 checkpoint resumed under localsgd without --precision: the message says where fp16 came from
expect_fail "an fp16 checkpoint resumed with localsgd is refused by name" "kept from $TMP/f_half.st, which was trained at fp16" \
  run --workers 2 --strategy localsgd --batch 32 --max-steps $S --resume "$TMP/f_half.st"
# the alias f16 is fp16 with its loss scaling (it ran fp16 GEMMs unscaled)
run --kernels $LIB --precision f16 --max-steps 2 --metrics "$TMP/f16.jsonl" >/dev/null 2>&1
grep -q '"loss_scale": 65536' "$TMP/f16.jsonl" && ok "--precision f16 scales the loss as fp16 does" \
  || bad "--precision f16: $(cat "$TMP/f16.jsonl")"
# fp16 with a compressor: the error feedback holds scaled gradients, so a skipped step (an
# overflow) clears it and a grown scale rescales it. Without that the residual kept the first
# overflow's inf and 198 of 300 steps were skipped (the loss scale fell to 1e-30).
for c in fp16 topk:0.1:warmup=0; do
  run --precision fp16 --workers 2 --compress $c --max-steps 300 --metrics "$TMP/fc.jsonl" >"$TMP/fc.log" 2>&1
  run --workers 2 --compress $c --max-steps 300 >"$TMP/fc32.log" 2>&1
  python3 - "$TMP/fc.jsonl" "$TMP/fc.log" "$TMP/fc32.log" <<'PY' && ok "fp16 with --compress $c trains as fp32 does" || bad "fp16 --compress $c: $(tail -2 "$TMP/fc.log")"
import json, re, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
acc = [float(re.findall(r"test accuracy ([0-9.]+)", open(f).read())[-1]) for f in sys.argv[2:]]
assert r["skipped_steps"] <= 3 and r["loss_scale"] >= 1024, r
assert abs(acc[0] - acc[1]) < 0.02, acc
PY
done

finish
