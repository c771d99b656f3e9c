# The device layer end to end (docs/device.md): single-process training on --device checked (the
# CPU kernels on memory the host cannot touch, so any host dereference of model memory crashes)
# writes checkpoints cmp-equal to --device cpu for the MLP, the CNN and a tiny GPT, with fp16 loss
# scaling and clipping on the device, and a resume on checked continues bit for bit; what is not
# yet device-neutral (other strategies, ddp's ZeRO, sharded update and compressors) is refused with a
# clear error. ddp with 2 workers on checked (its buckets staged through host buffers) writes
# checkpoints cmp-equal to ddp on cpu, and so does tensor parallelism (tp 2, and tp 2 x dp 2) on
# the GPT, which also resumes on checked bit for bit, and tp 2 on the MLP.
. "$(dirname "$0")/testlib.bash"

# both: NAME ARGS...: trains on cpu and on checked and compares the checkpoints byte for byte
both() {
  local name=$1 out; shift
  for dev in cpu checked; do
    out=$($DT train --epochs 1 --quiet --eval-batches 1 --device $dev --save "$TMP/$name-$dev.st" "$@" 2>&1) \
      || { bad "$name on --device $dev: exit $? (139: a host dereference of device memory): $out"; return; }
  done
  cmp -s "$TMP/$name-cpu.st" "$TMP/$name-checked.st" && ok "$name: checked and cpu checkpoints are cmp-equal" \
    || bad "$name: the checkpoints of checked and cpu differ"
}

if have_fmnist; then
  both mlp --model mlp --max-steps 20 --optimizer adam --clip 1
  both mlp-fp16 --model mlp --max-steps 8 --precision fp16 --momentum 0.9
  both cnn --model cnn --max-steps 3 --batch 16
  # ddp, 2 workers: each bucket downloaded, allreduced on the host, uploaded (cpu: in place, update=shard)
  both ddp --model mlp --max-steps 4 --workers 2
  both ddp-accum --model mlp --max-steps 4 --workers 2 --grad-accum 2 --optimizer adam --strategy "ddp(bucket_mb=0.1)"
  # tp on the MLP (the sequential builder's column/row pair): the row-parallel allreduce staged
  both tp-mlp --model mlp --max-steps 4 --workers 2 --strategy tp --optimizer adam --clip 0.5
  # the staged buckets still overlap backward: an allreduce starts before its step's backward ends
  $DT train --workers 2 --model "flatten linear(64) relu linear(64) relu linear(10)" --max-steps 3 --bucket-mb 0.01 \
    --quiet --device checked --timeline "$TMP/t.json" >"$TMP/t.log" 2>&1 || bad "ddp timeline on checked: $(cat "$TMP/t.log")"
  python3 - "$TMP/t.json" <<'PY' && ok "ddp on checked: a staged bucket's allreduce starts before backward ends" \
    || bad "ddp on checked: no bucket overlaps backward"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
back = {(e["pid"], e["args"]["step"]): e["ts"] + e["dur"] for e in ev if e["name"] == "backward"}
assert any(e["name"].startswith("allreduce") and e["ts"] < back.get((e["pid"], e["args"]["step"]), -1) for e in ev)
PY
  # --save-weights downloads, --weights uploads: fine-tuning from the MLP's weights on both devices
  for dev in cpu checked; do
    $DT train --model mlp --epochs 1 --max-steps 3 --quiet --eval-batches 1 --device $dev \
      --save-weights "$TMP/w-$dev.st" >/dev/null 2>&1 || bad "--save-weights on --device $dev: exit $?"
  done
  cmp -s "$TMP/w-cpu.st" "$TMP/w-checked.st" && ok "--save-weights: checked and cpu files are cmp-equal" \
    || bad "--save-weights: the files of checked and cpu differ"
  both tune --model mlp --max-steps 3 --weights "$TMP/w-cpu.st"
  # batchnorm's running stats, dropout (its copy when evaluating), avgpool, tanh
  both layers --model "conv(8,3,pad=1) batchnorm relu avgpool(2) flatten dropout(0.2) linear(32) tanh linear(10)" \
    --max-steps 4 --batch 16 --eval-batches 2
  # resume on checked: 4 steps, then 4 more, equal to 8 straight (the optimizer state goes through the device)
  $DT train --model mlp --epochs 1 --max-steps 8 --quiet --eval-batches 1 --optimizer adam --device checked \
    --save "$TMP/full.st" >/dev/null 2>&1 &&
    $DT train --model mlp --epochs 1 --max-steps 4 --quiet --eval-batches 1 --optimizer adam --device checked \
      --save "$TMP/half.st" >/dev/null 2>&1 &&
    $DT train --model mlp --epochs 1 --max-steps 8 --quiet --eval-batches 1 --optimizer adam --device checked \
      --resume "$TMP/half.st" --save "$TMP/res.st" >/dev/null 2>&1 &&
    cmp -s "$TMP/full.st" "$TMP/res.st" && ok "resume on checked continues bit for bit" || bad "resume on checked differs"
else
  echo "skip: Fashion-MNIST not installed (MLP and CNN on checked)"
fi

python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 4000
both gpt --data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --optimizer adamw --max-steps 6
# tp: the shards on the device, the activation allreduces and the vocabulary-parallel loss's row
# reductions staged through host buffers, the clip's norm from one sqnorm partial per rank
tpgpt=(--data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --strategy tp)
both tp "${tpgpt[@]}" --workers 2 --optimizer adamw --max-steps 4 --clip 0.5 --grad-accum 2
both tp-dp "${tpgpt[@]}" --workers 4 --optimizer adam --max-steps 2 --clip 1  # tp 2 x dp 2: the dp axis's ddp
# a tp resume on checked: the shards restored through host copies, 3 + 3 steps equal to 6 straight
tprun() { $DT train "${tpgpt[@]}" --workers 2 --epochs 1 --quiet --eval-batches 1 --optimizer adamw --device checked "$@" >/dev/null 2>&1; }
tprun --max-steps 6 --save "$TMP/tp-full.st" && tprun --max-steps 3 --save "$TMP/tp-half.st" &&
  tprun --max-steps 6 --resume "$TMP/tp-half.st" --save "$TMP/tp-res.st" && cmp -s "$TMP/tp-full.st" "$TMP/tp-res.st" &&
  ok "tp resume on checked continues bit for bit" || bad "tp resume on checked differs (or a run failed)"
expect_fail "tp with ZeRO is refused on checked" "tp with zero=1 (ZeRO over the mesh's dp axis) does not run on a device" \
  $DT train "${tpgpt[@]}" --device checked --workers 4 --strategy "tp(zero=1)" --max-steps 1

expect_fail "an unknown device names the devices" "devices: cpu, checked" $DT train --device gpu --max-steps 1
expect_fail "a bad checked option names the syntax" "arena=BYTES" $DT train --device checked:size=1 --max-steps 1
expect_fail "a strategy that is not device-neutral yet is refused" "run on it so far" \
  $DT train --device checked --workers 2 --strategy localsgd --max-steps 1
expect_fail "ddp's ZeRO is refused on checked" "ddp with zero=1 does not run on this device" \
  $DT train --device checked --workers 2 --strategy "ddp(zero=1)" --max-steps 1
finish
