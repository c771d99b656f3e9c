# The examples/ programs, built by `make` against the library: the reference MLP through the
# library equals `dtrain train` with the same flags; the same on 2 workers equals 1 worker at the
# same global batch; the custom graph model learns the spirals; the custom loop on 1, 2 and 4
# workers ends with the same parameters; a worker's error reaches the caller naming the worker;
# the complete single-process loop of docs/library.md learns (test accuracy above a bound).
# Steps are cut (DTRAIN_EXAMPLE_STEPS) so it stays fast: 120 steps, 40 under ASan.
. "$(dirname "$0")/testlib.bash"
EX="$BUILD/examples"
[ -x "$EX/mlp" ] || { echo "skip: $EX/mlp is not built (make all builds the examples)"; exit 77; }
have_fmnist || { echo "skip: Fashion-MNIST is missing (apt-get install dataset-fashion-mnist)"; exit 77; }
STEPS=120; [ -n "${DTRAIN_SANITIZED:-}" ] && STEPS=40
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" | tail -1; }
# |a-b| <= tol (relative to |a| when rel is set)
close() { python3 -c "import sys; a,b,t=map(float,sys.argv[1:4]); r=sys.argv[4]=='rel'; sys.exit(0 if abs(a-b)<=t*(abs(a) if r else 1) else 1)" "$@"; }

# ---- the reference MLP: the library equals the command ----
out=$(DTRAIN_EXAMPLE_STEPS=$STEPS "$EX/mlp" 2>&1) || bad "examples/mlp failed: $out"
lib_loss=$(field test_loss <<<"$out")
$DT train --data fashion-mnist --model mlp --epochs 2 --batch 32 --optimizer adam --lr 0.001 --max-steps $STEPS \
  --metrics "$TMP/m.jsonl" --quiet >/dev/null 2>&1 || bad "dtrain train failed"
cli_loss=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])['test_loss'])" "$TMP/m.jsonl")
if [ -n "$lib_loss" ] && close "$lib_loss" "$cli_loss" 2e-6 rel; then ok "examples/mlp test loss $lib_loss = dtrain train's $cli_loss"
else bad "examples/mlp test loss '$lib_loss' vs dtrain train '$cli_loss'"; fi

# ---- the same on 2 workers (batch 16 each) equals 1 worker x 32 ----
out=$(DTRAIN_EXAMPLE_STEPS=$STEPS "$EX/mlp_workers" 2 2>&1) || bad "examples/mlp_workers failed: $out"
w_loss=$(field test_loss <<<"$out")
if [ -n "$w_loss" ] && close "$lib_loss" "$w_loss" 1e-4 rel; then ok "mlp_workers 2 x 16: test loss $w_loss = 1 x 32's $lib_loss"
else bad "mlp_workers test loss '$w_loss' vs 1 worker '$lib_loss': $out"; fi
expect_fail "a worker's error names the worker" "mlp_workers: worker " "$EX/mlp_workers" 2 "$TMP/missing.csv"
expect_fail "a worker's error names the missing file" "$TMP/missing.csv" "$EX/mlp_workers" 2 "$TMP/missing.csv"

# ---- a custom graph model on in-memory data ----
out=$("$EX/graph" 2>&1) || bad "examples/graph failed: $out"
acc=$(field train_acc <<<"$out")
if [ -n "$acc" ] && close 1 "$acc" 0.1 abs; then ok "examples/graph learns the spirals (train acc $acc)"
else bad "examples/graph train acc '$acc' (want >= 0.9): $out"; fi
grep -q "residual-mlp: 1251 parameters in 6 tensors" <<<"$out" && ok "graph reports its 6 tensors" || bad "graph: $out"

# ---- the complete custom loop of docs/library.md: a 2-layer MLP built by dt_model_build learns ----
out=$("$EX/custom_loop" 300 2>&1) || bad "examples/custom_loop failed: $out"
acc=$(field test_acc <<<"$out")
if [ -n "$acc" ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0.75 else 1)" "$acc"; then
  ok "examples/custom_loop: linear(128) relu linear(10) reaches test accuracy $acc > 0.75 in 300 steps"
else bad "examples/custom_loop test accuracy '$acc' (want > 0.75: an uninitialised model stays near 0.1): $out"; fi
printf '1,2,3\n0,1,1\n1,5,5\n0,1,0\n' >"$TMP/x_train.csv"  # no x_test.csv beside it
expect_fail "custom_loop says when the data has no test set" "has no test set" "$EX/custom_loop" 10 "$TMP/x_train.csv"

# ---- a custom loop: 1, 2, 4 workers at global batch 64 give the same parameters ----
LS=30; [ -n "${DTRAIN_SANITIZED:-}" ] && LS=10
sq=()
for n in 1 2 4; do
  out=$("$EX/loop" $n $LS 2>&1) || bad "examples/loop $n failed: $out"
  sq+=("$(field param_sq <<<"$out")")
done
if [ -n "${sq[0]}" ] && close "${sq[0]}" "${sq[1]}" 1e-5 rel && close "${sq[0]}" "${sq[2]}" 1e-5 rel; then
  ok "examples/loop on 1, 2, 4 workers: sum of squared parameters ${sq[*]}"
else bad "examples/loop parameters differ across workers: ${sq[*]}"; fi
expect_fail "loop refuses a worker count that does not divide 64" "N dividing 64" "$EX/loop" 3
finish
