# The commands that load a model, on a device (docs/device.md): dtrain eval, predict, sample and
# export with --device checked (the CPU kernels on memory the host cannot touch: a host read of
# the model's memory crashes, exit 139) print and write exactly what --device cpu does, for an MLP
# checkpoint, plain weights and a tiny GPT (its logits downloaded once a batch, or one row a
# sampled token, and sampled on the host; the ONNX initializers downloaded tensor by tensor); and
# an fl-sim run (FedProx's local steps on each client's device, the global model uploaded and the
# update downloaded; plain and secure aggregation) writes the cpu run's global model.
. "$(dirname "$0")/testlib.bash"

# same NAME FILE CMD...: runs CMD (with --device DEV appended) on cpu and on checked, each writing
# FILE-DEV (its stdout, or the -o file when FILE names one: CMD's "@" is replaced by FILE-DEV),
# and compares the two byte for byte.
same() {
  local name=$1 file=$2 dev out; shift 2
  for dev in cpu checked; do
    local args=() a
    for a in "$@"; do [ "$a" = @ ] && args+=("$file-$dev") || args+=("$a"); done
    if [[ " $* " == *" @ "* ]]; then out=$("${args[@]}" --device $dev 2>&1)
    else out=$("${args[@]}" --device $dev 2>&1 >"$file-$dev"); fi \
      || { bad "$name on --device $dev: exit $? (139: a host dereference of device memory): $out"; return; }
  done
  [ -s "$file-cpu" ] && cmp -s "$file-cpu" "$file-checked" && ok "$name: checked and cpu give the same bytes" \
    || bad "$name: checked and cpu differ ($(wc -c <"$file-cpu") and $(wc -c <"$file-checked") bytes)"
}

onnx=1
if have_fmnist; then
  $DT train --model mlp --epochs 1 --max-steps 3 --quiet --eval-batches 1 --save "$TMP/mlp.st" \
    --save-weights "$TMP/mlp-w.st" >/dev/null 2>&1 || bad "training the MLP: exit $?"
  same "eval of a checkpoint" "$TMP/eval" $DT eval --checkpoint "$TMP/mlp.st" --batch 500
  same "eval of plain weights" "$TMP/evalw" $DT eval --weights "$TMP/mlp-w.st" --model mlp --batch 500
  same "predict with --logits" "$TMP/pred.csv" $DT predict --checkpoint "$TMP/mlp.st" --limit 300 --logits -o @
  sim=($DT fl-sim --clients 3 --clients-per-round 3 --partition iid --train-limit 600 --rounds 2 --lr 0.05 --mu 0.1 --quiet)
  same "fl-sim rounds (FedProx)" "$TMP/fl.st" "${sim[@]}" --checkpoint @
  same "fl-sim rounds with secure aggregation" "$TMP/fls.st" "${sim[@]}" --secure-agg --checkpoint @
  if $DT export --checkpoint "$TMP/mlp.st" -o "$TMP/probe.onnx" >/dev/null 2>&1; then
    same "ONNX export of the MLP" "$TMP/mlp.onnx" $DT export --checkpoint "$TMP/mlp.st" -o @
  else onnx=0; echo "skip: built without ONNX export"; fi
else
  echo "skip: Fashion-MNIST not installed (the MLP's eval, predict and export on checked)"
fi

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 4000
$DT train --data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --max-steps 4 --epochs 1 --quiet \
  --eval-batches 1 --save "$TMP/gpt.st" >/dev/null 2>&1 || bad "training the GPT: exit $?"
same "sample (top-k 5)" "$TMP/sample" $DT sample --checkpoint "$TMP/gpt.st" --prompt "the " --tokens 30 --top-k 5
same "sample (greedy)" "$TMP/greedy" $DT sample --checkpoint "$TMP/gpt.st" --prompt "the " --tokens 10 --temperature 0
same "predict of a GPT's windows" "$TMP/gpred.jsonl" $DT predict --checkpoint "$TMP/gpt.st" --limit 3 --logits -o @
same "eval of a GPT" "$TMP/geval" $DT eval --checkpoint "$TMP/gpt.st"
[ $onnx = 1 ] && same "ONNX export of the GPT" "$TMP/gpt.onnx" $DT export --checkpoint "$TMP/gpt.st" -o @

expect_fail "eval names a device it does not know" "devices: cpu, checked" \
  $DT eval --checkpoint "$TMP/gpt.st" --device gpu
finish
