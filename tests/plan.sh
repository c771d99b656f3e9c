# dtrain plan and --strategy auto with the real command: a tight --mem-limit makes the plan choose
# ZeRO 3 or pp, and that layout then trains under the same limit; the plan's memory per rank is
# --dry-run's; --strategy auto trains to the same tensors as its chosen flags run by hand, and its
# metrics carry the predicted step time beside the measured one; a cluster file with a 0.1 Gbit/s
# inter-host link keeps tp within a host and says why; the tp bytes the plan predicts are the ones
# a tp run counts; a bad cluster file is refused naming the field. No check depends on speed.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
DT=$(readlink -f "$DT")  # section 3 runs in $TMP
export DTRAIN_PLAN_CACHE="$TMP/cache"  # no probe cached: the host's default link figures
awk 'BEGIN { srand(7); for (i = 0; i < 600; i++) { y = int(rand() * 4); printf "%d", y;
       for (k = 0; k < 12; k++) printf ",%.4f", rand() + (k % 4 == y ? 1.5 : 0); printf "\n" } }' >"$TMP/d.csv"
DEEP="linear(1024) relu linear(1024) relu linear(1024) relu linear(1024) relu linear(4)"  # 3.17M parameters
LIM=29M  # --dry-run at batch 8 on 4 ranks: ddp 51.2 MB, ZeRO 1 32.2, ZeRO 2 35.3, ZeRO 3 27.9 (31.1 at evaluation)
jget() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

# 1. the tight limit: ddp's 16 bytes a parameter, ZeRO 1-2 and ZeRO 3's evaluation do not fit, pp must
js=$($DT plan --data "$TMP/d.csv" --model "$DEEP" --batch 32 --workers 4 --mem-limit $LIM --json 2>&1)
flags=$(jget "d['layouts'][0]['flags']" <<<"$js")
pp=$(jget "d['layouts'][0]['pp']" <<<"$js") mem=$(jget "int(d['layouts'][0]['mem_bytes'])" <<<"$js")
ddpwhy=$(jget "[a['why'] for a in d['alternatives'] if a['layout']['zero'] == 0 and a['layout']['pp'] == 1][0]" <<<"$js")
if [ "$pp" -gt 1 ] && grep -q "does not fit" <<<"$ddpwhy"; then
  ok "--mem-limit $LIM: the plan chooses $flags; $ddpwhy"
else bad "the plan under --mem-limit $LIM: $js"; fi
# ZeRO-3 fits the training (27.9 MB) but not its evaluation's gather of the model (31.1 MB, --dry-run's
# 'at eval/ckpt'): the plan says so, and --dry-run refuses it under the same limit
z3why=$(jget "[a['why'] for a in d['alternatives'] if a['layout']['zero'] == 3 and a['layout']['pp'] == 1][0]" <<<"$js")
z3dry=$($DT train --data "$TMP/d.csv" --model "$DEEP" --workers 4 --batch 8 --zero 3 --dry-run --mem-limit $LIM 2>&1)
if grep -q "does not fit: .* while evaluation or a checkpoint gathers the model" <<<"$z3why" &&
   grep -q "would exceed it" <<<"$z3dry"; then ok "ZeRO-3 under $LIM: $z3why; --dry-run agrees"
else bad "ZeRO-3 at evaluation under $LIM: plan '$z3why', --dry-run: $z3dry"; fi
# shellcheck disable=SC2086
out=$($DT train --data "$TMP/d.csv" --model "$DEEP" $flags --max-steps 3 --mem-limit $LIM --quiet 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "done:" <<<"$out"; then ok "the chosen layout trains under --mem-limit $LIM"
else bad "the chosen layout under --mem-limit $LIM (exit $rc): $out"; fi

# 2. the plan's memory is --dry-run's: its fullest rank's total
# shellcheck disable=SC2086
dry=$($DT train --data "$TMP/d.csv" --model "$DEEP" $flags --dry-run 2>&1)
drymax=$(awk '/^  total/ { if ($2 > m) m = $2 } END { printf "%d", m }' <<<"$dry")
if [ -n "$drymax" ] && [ $((drymax - mem)) -le 1 ] && [ $((mem - drymax)) -le 1 ]; then
  ok "the plan's $mem bytes per rank are --dry-run's"
else bad "plan $mem bytes against --dry-run $drymax: $dry"; fi

# 3. --strategy auto runs the chosen layout: the same tensors as its flags by hand
cd "$TMP" || exit 1
out=$($DT train --strategy auto --workers 2 --data "$TMP/d.csv" --model "linear(64) relu linear(4)" --batch 16 \
      --max-steps 12 --metrics "$TMP/m.jsonl" --save-weights "$TMP/auto.safetensors" --quiet 2>&1); rc=$?
chose=$(sed -n 's/^dtrain: --strategy auto chose [^:]*: \(.*\) (predicted .*/\1/p' <<<"$out")
# shellcheck disable=SC2086
hand=$($DT train $chose --data "$TMP/d.csv" --model "linear(64) relu linear(4)" --max-steps 12 \
       --save-weights "$TMP/hand.safetensors" --quiet 2>&1); rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ -n "$chose" ] &&
   d=$(/usr/bin/python3 "$ROOT/tests/st_maxdiff.py" "$TMP/auto.safetensors" "$TMP/hand.safetensors" 0); then
  ok "--strategy auto ($chose) equals the layout by hand (max diff $d)"
else bad "--strategy auto (exit $rc, chose '$chose') against by hand (exit $rc2): $out / $hand"; fi
plan=$(jget "d['plan']" <"$TMP/m.jsonl" 2>&1)
if jget "d['plan']['predicted_step_s'] > 0 and d['plan']['measured_step_s'] > 0" <"$TMP/m.jsonl" | grep -q True &&
   grep -q "against the planner's" <<<"$out"; then ok "the metrics carry the plan beside the measurement: $plan"
else bad "no plan in the metrics: $plan / $out"; fi
expect_fail "--strategy auto refuses a layout flag" "--tp with --strategy auto" \
  $DT train --strategy auto --workers 2 --tp 2 --data "$TMP/d.csv"

# 4. a slow inter-host link: tp stays within a host, and the plan says what tp 4 would cost
sed 's/"bandwidth_Gbit_s": 1600/"bandwidth_Gbit_s": 0.1/' "$ROOT/examples/clusters/dgx-a100.json" >"$TMP/slow.json"
head -c 20000 "$ROOT/README.md" >"$TMP/t.txt"
js=$($DT plan --data "text:$TMP/t.txt" --model "gpt:L=2,H=4,C=256,T=32" --batch 16 --cluster "$TMP/slow.json" \
     --hosts 2 --ranks-per-host 2 --json 2>&1)
tp=$(jget "d['layouts'][0]['tp']" <<<"$js")
why=$(jget "[a['why'] for a in d['alternatives'] if a['layout']['tp'] == 4][0]" <<<"$js")
if [ "$tp" -le 2 ] && grep -q "tp 4 would send .* MB per step through a 0.1 Gbit/s inter-node link" <<<"$why"; then
  ok "0.1 Gbit/s between hosts: tp $tp; $why"
else bad "slow link plan: $js"; fi

# 5. the tp bytes the plan predicts are those a tp 2 run counts
js=$($DT plan --data "text:$TMP/t.txt" --model "gpt:L=2,H=2,C=32,T=16" --batch 4 --workers 2 --tp 2 --json 2>&1)
want=$(jget "int(d['layouts'][0]['tp_bytes'])" <<<"$js") tflags=$(jget "d['layouts'][0]['flags']" <<<"$js")
# shellcheck disable=SC2086
$DT train --data "text:$TMP/t.txt" --model "gpt:L=2,H=2,C=32,T=16" $tflags --max-steps 2 --metrics "$TMP/tp.jsonl" \
  --quiet >/dev/null 2>&1
got=$(jget "int(d['comm_bytes']['tp'] / d['step'])" <"$TMP/tp.jsonl" 2>&1)
if [ -n "$want" ] && [ "$want" = "$got" ]; then ok "tp 2 sends the $want bytes per step the plan predicts"
else bad "tp bytes: plan $want, the run $got ($tflags)"; fi

# 6. --probe caches the per-op times at the plan's shapes: the same plan uses them, a changed batch,
# precision or model measures again
SMALL="linear(32) relu linear(4)"
$DT plan --probe --workers 2 --data "$TMP/d.csv" --model "$SMALL" --batch 32 >"$TMP/probe.txt" 2>&1
hit=$($DT plan --workers 2 --data "$TMP/d.csv" --model "$SMALL" --batch 32 2>&1 | head -1)
miss=""
for change in "--batch 64" "--batch 32 --precision fp32,bf16" "--batch 32 --model linear(16) relu linear(4)"; do
  # shellcheck disable=SC2086
  miss+=$($DT plan --workers 2 --data "$TMP/d.csv" --model "$SMALL" $change 2>&1 | head -1 | grep -c "per-op times cached")
done
if grep -q "per-op times of .* nodes cached in" "$TMP/probe.txt" && grep -q "per-op times cached by --probe" <<<"$hit" &&
   [ "$miss" = 000 ]; then ok "--probe caches the per-op times; a changed batch, precision or model misses"
else bad "the per-op cache: probe $(cat "$TMP/probe.txt") / same plan: $hit / changed: $miss"; fi

# 7. a bad cluster file names the field
sed 's/"mem_GB": 80, //' "$ROOT/examples/clusters/dgx-a100.json" >"$TMP/bad.json"
expect_fail "a cluster file without device.mem_GB" "bad.json: device.mem_GB: missing" \
  $DT plan --data "$TMP/d.csv" --batch 8 --cluster "$TMP/bad.json"
for f in "$ROOT"/examples/clusters/*.json; do
  if $DT plan --data "$TMP/d.csv" --batch 64 --cluster "$f" >/dev/null 2>&1; then ok "$(basename "$f") plans"
  else bad "$(basename "$f"): $($DT plan --data "$TMP/d.csv" --batch 64 --cluster "$f" 2>&1)"; fi
done
finish
