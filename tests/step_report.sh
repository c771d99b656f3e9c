# Step-based reporting through the real command (dtrain train --log-every, --eval-every,
# --eval-batches) on a small GPT and a corpus the test writes: a 40-step run's --metrics hold a
# record every --log-every steps (loss, lr, throughput, gradient norm) and an evaluation every
# --eval-every steps over --eval-batches batches, beside the epoch's record; ddp --workers 2,
# --tp 2 and --pp 2 write the same records (the same global batch: the same losses and norms to
# float rounding); the plain progress line and the bar end at --max-steps; under --workers 2 on a
# terminal (script(1)) the epoch line starts on a line of its own; dtrain plot draws the records;
# the flags' mistakes get clear errors.
. "$(dirname "$0")/testlib.bash"

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 40000
M="gpt:L=1,H=2,C=32,T=16"
D="text:$TMP/corpus.txt"
run() { $DT train --data "$D" --model "$M" --max-steps 40 --log-every 10 --eval-every 20 --eval-batches 4 "$@"; }

run --batch 8 --metrics "$TMP/single.jsonl" >"$TMP/single.out" 2>"$TMP/single.err" || bad "single run: $(cat "$TMP/single.err")"
grep -q "^step 20 (epoch [0-9.e-]*): train_loss [0-9.]* lr 0.001 grad_norm [0-9.]* [0-9]* samples/s$" "$TMP/single.out" \
  && ok "a --log-every line on stdout" || bad "no step line: $(cat "$TMP/single.out")"
grep -q "^step 20 (epoch [0-9.e-]*): eval test_loss [0-9.]* test_acc [0-9.]* (32 samples" "$TMP/single.out" \
  && ok "an --eval-every line on stdout (4 batches of 8)" || bad "no eval line: $(cat "$TMP/single.out")"
# a pipe gets plain progress lines; the first (step 1) counts to --max-steps, not to the epoch's end
grep -q "^epoch 1/1 step 1/40 loss" "$TMP/single.err" && ok "the progress line ends at --max-steps (1/40)" \
  || bad "progress line: $(grep -m2 step "$TMP/single.err")"

run --workers 2 --batch 4 --metrics "$TMP/ddp.jsonl" >/dev/null 2>"$TMP/ddp.err" || bad "ddp: $(tail -3 "$TMP/ddp.err")"
run --workers 2 --tp 2 --batch 8 --metrics "$TMP/tp.jsonl" >/dev/null 2>"$TMP/tp.err" || bad "tp: $(tail -3 "$TMP/tp.err")"
run --workers 2 --pp 2 --batch 8 --metrics "$TMP/pp.jsonl" >/dev/null 2>"$TMP/pp.err" || bad "pp: $(tail -3 "$TMP/pp.err")"
out=$(/usr/bin/python3 - "$TMP" <<'PY' 2>&1
import json, math, sys
tmp = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, name))]
ref = load("single")
steps = [r for r in ref if r.get("kind") == "step"]
evals = [r for r in ref if r.get("kind") == "eval"]
epochs = [r for r in ref if "kind" not in r]
good = [r["step"] for r in steps] == [10, 20, 30, 40] and all(
    r["steps"] == 10 and r["grad_norm"] > 0 and r["train_loss"] > 0 and r["lr"] == 0.001 and r["samples_per_s"] > 0
    and abs(r["epoch"] * epochs[0]["steps_per_epoch"] - r["step"]) < 1e-3 * r["step"] for r in steps)
print("single step-records", "ok" if good else "BAD %r" % steps)
good = [r["step"] for r in evals] == [20, 40] and all(r["eval_samples"] == 32 and r["test_loss"] > 0 for r in evals)
print("single eval-records", "ok" if good else "BAD %r" % evals)
good = len(epochs) == 1 and epochs[0]["step"] == 40 and epochs[0]["eval_samples"] == 32 \
    and epochs[0]["test_loss"] == evals[-1]["test_loss"]
print("single epoch-record", "ok" if good else "BAD %r" % epochs)
for name in ("ddp", "tp", "pp"):
    recs = load(name)
    same = len(recs) == len(ref) and all(a.get("kind") == b.get("kind") and a["step"] == b["step"] for a, b in zip(recs, ref))
    for a, b in zip(recs, ref):
        for k in ("train_loss", "grad_norm", "test_loss", "test_acc"):
            if k in b and b[k] is not None:
                same &= abs(a[k] - b[k]) <= 2e-4 * abs(b[k]) + 1e-6
        same &= a.get("eval_samples", 0) == b.get("eval_samples", 0)
    print(name, "same-records", "ok" if same else "BAD\n%s\n%s" % (recs, ref))
PY
)
while read -r run what verdict rest; do
  [ "$verdict" = ok ] && ok "$run: $what" || bad "$run: $what $verdict $rest"
done <<<"$(grep -E ' (ok|BAD)' <<<"$out")"
[ "$(grep -c ' ok$' <<<"$out")" -eq 6 ] || bad "checker: $out"

# a terminal under --workers 2: the bar is cleared before the epoch line, which is not glued to it
if command -v script >/dev/null; then
  script -qec "$DT train --data '$D' --model '$M' --workers 2 --batch 4 --max-steps 30 --eval-batches 4" /dev/null \
    >"$TMP/tty.out" 2>&1 || bad "the run under script failed: $(tail -3 "$TMP/tty.out")"
  /usr/bin/python3 - "$TMP/tty.out" >"$TMP/tty.check" <<'PY'
import re, sys
raw = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
at = raw.find("[0] epoch 1/1 (30 of")
bars = re.findall(r"\[#*\.*\] (\d+)/(\d+) loss", raw)
print("ok" if at > 0 and raw[at - 3:at] == "\x1b[K" and bars and bars[-1] == ("30", "30")
      else "BAD at %d %r bars %r" % (at, raw[max(0, at - 40):at + 20], bars[-3:]))
PY
  grep -q "^ok" "$TMP/tty.check" && ok "--workers 2 on a terminal: the bar ends at 30/30 and is cleared before the epoch line" \
    || bad "tty: $(cat "$TMP/tty.check")"
else
  echo "skip part: script(1) is missing (util-linux): the terminal check did not run"
fi

if command -v gnuplot >/dev/null; then
  $DT plot "$TMP/single.jsonl" -o "$TMP/steps.svg" >"$TMP/plot.out" 2>&1 || bad "plot: $(cat "$TMP/plot.out")"
  rows=$(grep -c "^single " "$TMP/plot.out")
  [ "$rows" -eq 7 ] && ok "plot: the table holds the 4 step, 2 eval and 1 epoch records" || bad "plot table: $(cat "$TMP/plot.out")"
  grep -q ">step<" "$TMP/steps.svg" && ok "plot: a step-logged run is drawn against the step" || bad "plot: no step axis"
  # against the epoch, the epoch cut short by --max-steps sits at its fraction (40 steps of thousands),
  # with the step records, not at epoch 1: the axis has no tick at 1
  $DT plot "$TMP/single.jsonl" -o "$TMP/epochs.svg" --x epoch >/dev/null 2>&1 || bad "plot --x epoch failed"
  grep -q ">epoch<" "$TMP/epochs.svg" && ! grep -q "<text> 1</text>" "$TMP/epochs.svg" \
    && ok "plot --x epoch: the cut-short epoch at its fraction" || bad "plot --x epoch: $(grep -o '<text>[^<]*</text>' "$TMP/epochs.svg" | head -20)"
fi

for i in $(seq 64); do echo "$((i % 2)),$i,$((i * 3 % 7))"; done >"$TMP/points.csv"
expect_fail "--eval-every without a test set says what to add" "add --val-split F" \
  $DT train --data "$TMP/points.csv" --model "linear(2)" --eval-every 5 --max-steps 1
expect_fail "a negative --log-every is refused" "--log-every -3" $DT train --data "$D" --model "$M" --log-every -3 --max-steps 1
finish
