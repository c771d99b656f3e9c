# dtrain plot: two real runs' --metrics files drawn into PNG and SVG through gnuplot (loss,
# accuracy, throughput, learning rate); the table it
# prints holds exactly the records of the files; a --val-split run with --log-every and
# --eval-every records gets validation curves and a step axis; the learning-rate axis of a
# constant rate has distinct tick labels; bad input (missing file, a line that is not a
# record, a wrong extension) is refused with the file, line or flag; without gnuplot it says how
# to get it; a gnuplot that fails leaves no output file behind.
. "$(dirname "$0")/testlib.bash"
command -v gnuplot >/dev/null || { echo "skip: gnuplot is missing (apt-get install gnuplot-nox)"; exit 77; }
have_fmnist || { echo "skip: Fashion-MNIST is missing (apt-get install dataset-fashion-mnist)"; exit 77; }
DT=$(cd "$(dirname "$DT")" && pwd)/dtrain
cd "$TMP" || exit 1
$DT train --model mlp --epochs 3 --epoch-windows 640 --batch 32 --metrics adam.jsonl --quiet >/dev/null 2>&1 \
  && $DT train --model mlp --epochs 2 --epoch-windows 640 --batch 64 --optimizer sgd --lr 0.05 --metrics sgd.jsonl \
     --quiet >/dev/null 2>&1 || bad "training the runs to plot failed"

out=$($DT plot adam.jsonl sgd.jsonl -o curves.png --title "two runs" 2>&1); rc=$?
[ $rc -eq 0 ] && ok "plot two runs to PNG" || bad "plot png (exit $rc): $out"
[ "$(head -c 8 curves.png | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ] && [ "$(stat -c %s curves.png)" -gt 10000 ] \
  && ok "curves.png is a PNG image" || bad "curves.png is not a PNG: $(ls -l curves.png 2>&1)"
printf '%s\n' "$out" >table.txt
python3 - table.txt adam.jsonl sgd.jsonl >check.txt 2>&1 <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.split() and l.split()[0] in ("adam", "sgd")]
want = []
for path in sys.argv[2:]:
    for rec in map(json.loads, open(path)):
        want.append((path.split(".")[0], rec["epoch"], rec["step"], rec["train_loss"], rec["test_loss"], rec["test_acc"], rec["lr"]))
ok = len(rows) == len(want) == 5 and all(r[0] == w[0] and int(r[1]) == w[1] and int(r[2]) == w[2]
         and abs(float(r[3]) - w[3]) <= 1e-5 * abs(w[3]) and abs(float(r[4]) - w[4]) <= 1e-5 * abs(w[4])
         and abs(float(r[5]) - w[5]) <= 1e-4 and abs(float(r[7]) - w[6]) <= 1e-3 * w[6] for r, w in zip(rows, want))
print("table ok" if ok else "table BAD %r vs %r" % (rows, want))
PY
grep -q "table ok" check.txt && ok "the printed table is the files' 5 records" || bad "$(cat check.txt)"
if $DT plot adam.jsonl sgd.jsonl -o curves.svg --x step >/dev/null 2>&1 && grep -q "<svg" curves.svg; then
  ok "plot to SVG"
  for label in "adam train" "adam test" "sgd train" "sgd test" "test accuracy" "throughput" "learning rate" "step"; do
    grep -q ">$label<\|$label" curves.svg && ok "the SVG shows '$label'" || bad "the SVG lacks '$label'"
  done
else bad "plot svg: $(ls -l curves.svg 2>&1)"; fi

# validation curves and step records: a --val-split run logged every 5 steps, evaluated every 10
$DT train --model mlp --epochs 2 --epoch-windows 640 --batch 32 --val-split 0.1 --log-every 5 --eval-every 10 \
  --eval-batches 2 --metrics val.jsonl --quiet >/dev/null 2>&1 || bad "training the --val-split run failed"
if $DT plot val.jsonl adam.jsonl -o val.svg >val.txt 2>&1; then
  for label in ">val train<" ">adam test<" "dotted: validation"; do
    grep -q "$label" val.svg && ok "the validation plot shows '$label'" || bad "the validation plot lacks '$label'"
  done
  # validation and test curves in both the loss and the accuracy panel
  [ "$(grep -o '>val val<' val.svg | wc -l)" -eq 2 ] && [ "$(grep -o '>val test<' val.svg | wc -l)" -eq 2 ] \
    && ok "validation loss and accuracy curves beside the test ones" || bad "val curves: $(grep -o '>val [a-z]*<' val.svg)"
  n=$(python3 -c 'import json,sys; print(sum(1 for l in open("val.jsonl")))')
  [ "$(grep -c '^val ' val.txt)" -eq "$n" ] && head -1 val.txt | grep -q "val_loss *val_acc" \
    && ok "its table has the $n records and the validation columns" || bad "validation table: $(cat val.txt)"
  grep -q ">step<" val.svg && ok "a step-logged run is drawn against the step" || bad "no step axis"
else bad "plot with validation: $(cat val.txt)"; fi
# adam.jsonl's constant lr 0.001: each tick label of the lr axis once (they were 0.00100 three times)
$DT plot adam.jsonl -o lr.svg >/dev/null 2>&1 || bad "plot adam.jsonl alone failed"
python3 - lr.svg >ticks.txt <<'PY'
import re, sys
labels = re.findall(r">\s*(0\.00\d*)\s*</text>", open(sys.argv[1]).read())
print("ticks ok" if labels and len(labels) == len(set(labels)) else "ticks BAD %r" % labels)
PY
grep -q "ticks ok" ticks.txt && ok "the learning-rate axis labels are distinct" || bad "$(cat ticks.txt)"

expect_fail "a missing file is named" "nope.jsonl: No such file" $DT plot nope.jsonl -o x.png
$DT plot nope.jsonl -o x.png >/dev/null 2>&1; [ $? -eq 78 ] && ok "a missing file exits 78" || bad "missing file exit status"
printf '{"epoch": 1, "step": 5, "train_loss": 1}\nnot json\n' >broken.jsonl
expect_fail "a broken line is named by file and line" "broken.jsonl:2: not a JSON object" $DT plot broken.jsonl -o x.png
printf '{"step": 5}\n' >noepoch.jsonl
expect_fail "a record without an epoch is refused" "noepoch.jsonl:1: not a dtrain metrics record ('epoch' is missing)" \
  $DT plot noepoch.jsonl -o x.png
expect_fail "the image must be png or svg" "must end in .png or .svg" $DT plot adam.jsonl -o x.jpg
expect_fail "-o is required" "-o FILE (.png or .svg) is missing" $DT plot adam.jsonl
expect_fail "without gnuplot it says how to get it" "apt-get install gnuplot-nox" env PATH=/nonexistent $DT plot adam.jsonl -o y.png
# a gnuplot that fails (failure injection on PATH): an error with its message and no image left
mkdir fakebin && printf '#!/bin/sh\necho "cannot open terminal" >&2\nexit 1\n' >fakebin/gnuplot && chmod +x fakebin/gnuplot
expect_fail "a failing gnuplot's message is shown" "gnuplot failed: cannot open terminal" env PATH="$TMP/fakebin:$PATH" $DT plot adam.jsonl -o z.png
[ ! -e z.png ] && [ -z "$(ls | grep 'z.png.tmp')" ] && ok "a failed plot leaves no file" || bad "left: $(ls)"
finish
