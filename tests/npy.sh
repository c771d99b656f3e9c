# NumPy .npy data through the real command (--data npy:...): arrays written by numpy
# (tests/tools/npy_files.py) train exactly as the same values read from CSV (the same test loss,
# bit for bit), in each spelling (npy:DIR, a directory holding x_train.npy, npy:X,Y,XT,YT);
# uint8 images in a version 2.0 file learn; `dtrain eval` of the checkpoint reads them again; and
# every file the reader cannot use is refused naming the file and the fix (exit 78).
. "$(dirname "$0")/testlib.bash"
DT=$(cd "$(dirname "$DT")" && pwd)/dtrain  # absolute: some checks run from another directory
PY=/usr/bin/python3; $PY -c "import numpy" 2>/dev/null || { echo "skip: $PY has no numpy (apt-get install python3-numpy)"; exit 77; }
D="$TMP/np"
$PY "$DTRAIN_TOOLS/npy_files.py" "$D" || bad "npy_files.py"
M="linear(16) relu linear(3)"
loss() {  # loss DATA: the test loss of one epoch on DATA
  rm -f "$TMP/m.jsonl"
  $DT train --data "$1" --model "$M" --epochs 1 --batch 16 --metrics "$TMP/m.jsonl" --quiet >"$TMP/out" 2>&1 \
    || { echo "failed: $(cat "$TMP/out")"; return; }
  python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])['test_loss'])" "$TMP/m.jsonl"
}
csv=$(loss "$D/blobs_train.csv")
for spec in "npy:$D" "$D" "npy:$D/x_train.npy,$D/y_train.npy,$D/x_test.npy,$D/y_test.npy"; do
  got=$(loss "$spec")
  [ -n "$csv" ] && [ "$got" = "$csv" ] && ok "--data $spec trains as the same data read from CSV (test loss $got)" \
    || bad "--data $spec: test loss '$got', CSV '$csv'"
done
out=$($DT train --data "npy:$D/x_train.npy,$D/y_train.npy" --model "$M" --epochs 1 2>&1) && grep -q "no test set" <<<"$out" \
  && ok "npy:X,Y trains without a test set" || bad "npy:X,Y: $out"

# uint8 images (n, 4, 4), format version 2.0: scaled by 1/255, 4x4 samples; the label is pixel (0,0) > 127
out=$($DT train --data "$D/img" --model "linear(2)" --epochs 20 --batch 16 --lr 0.5 --val-split 0.2 --save "$TMP/img.st" \
  --metrics "$TMP/img.jsonl" 2>&1) || bad "uint8 images: $out"
python3 - "$TMP/img.jsonl" <<'PY' && ok "uint8 images from a version 2.0 .npy learn (val accuracy > 0.9)" || bad "images: $out"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
assert r["val_acc"] > 0.9, r
PY
ev=$($DT eval --checkpoint "$TMP/img.st" --data "npy:$D/img/x_train.npy,$D/img/y_train.npy" 2>&1) \
  && grep -q "eval: 300 samples" <<<"$ev" && ok "dtrain eval reads the arrays again: $ev" || bad "eval: $ev"

# the Python binding reaches the same reader through data= (in-memory arrays are its own x=, y=)
if [ -z "${DTRAIN_SANITIZED:-}" ] && $PY -c "import cffi" 2>/dev/null; then
  py=$(DTRAIN_LIB="$(cd "$BUILD" && pwd)/libdtrain.so" PYTHONPATH="${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}/python" \
    $PY -c "import dtrain, sys; print(dtrain.train(data='npy:' + sys.argv[1], model=sys.argv[2], epochs=1, batch=16).test_loss)" \
    "$D" "$M" 2>&1)
  python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= 1e-6 * float(sys.argv[2]) else 1)" "$py" "$csv" \
    2>/dev/null && ok "dtrain.train(data='npy:DIR') in Python: test loss $py, as the command's" || bad "Python data='npy:...': '$py' vs '$csv'"
fi

# relative paths of npy:A,B,C,D are stored absolute: eval from elsewhere takes the checkpoint's data
(cd "$D" && $DT train --data npy:x_train.npy,y_train.npy,x_test.npy,y_test.npy --model "$M" --max-steps 5 --save "$TMP/rel.st" \
  >/dev/null 2>&1) || bad "train with relative npy paths"
ev=$(cd / && $DT eval --checkpoint "$TMP/rel.st" 2>&1) && grep -q "eval: 200 samples" <<<"$ev" \
  && ok "dtrain eval from / finds the npy files given relative to the run's directory" || bad "eval from /: $ev"

# ---- files the reader refuses: each named, with the fix, exit 78 ----
refuse() {  # NAME X Y NEEDLE
  local out rc
  out=$($DT train --data "npy:$2,$3" --model "$M" --max-steps 1 2>&1); rc=$?
  if [ $rc -eq 78 ] && grep -qF -- "$4" <<<"$out"; then ok "$1 (exit 78)"; else bad "$1: exit $rc, wanted '$4': $out"; fi
}
B="$D/bad"
refuse "Fortran order" "$B/fortran.npy" "$D/y_train.npy" "$B/fortran.npy: Fortran-ordered"
refuse "big-endian" "$B/bigendian.npy" "$D/y_train.npy" "$B/bigendian.npy: big-endian"
refuse "a structured array" "$B/struct.npy" "$D/y_train.npy" "$B/struct.npy: a structured array"
refuse "int64 features" "$B/int64_x.npy" "$D/y_train.npy" "features of dtype i8 are not supported"
refuse "a cut-short file" "$B/cut.npy" "$D/y_train.npy" "$B/cut.npy: cut short"
refuse "not a .npy file" "$B/notnpy.npy" "$D/y_train.npy" "not a .npy file"
refuse "float labels" "$D/x_train.npy" "$B/float_labels.npy" "labels must be integer class ids"
refuse "a label count that differs" "$D/x_train.npy" "$B/short_labels.npy" "one per sample of $D/x_train.npy"
refuse "a negative label" "$D/x_train.npy" "$B/neg_labels.npy" "label -1 of sample"
refuse "a missing file" "$D/x_train.npy" "$D/nope.npy" "$D/nope.npy: no such file"
expect_fail "three paths are refused with the forms to use" "pass npy:X.npy,Y.npy" \
  $DT train --data "npy:$D/x_train.npy,$D/y_train.npy,$D/x_test.npy" --max-steps 1
finish
