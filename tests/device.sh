# The device layer end to end (docs/device.md): single-process training on --device checked (the
# CPU kernels on memory the host cannot touch, so any host dereference of model memory crashes)
# writes checkpoints cmp-equal to --device cpu for the MLP, the CNN and a tiny GPT, with fp16 loss
# scaling and clipping on the device, bf16 (the MLP and the GPT), and a resume on checked continues bit for bit; what is not
# yet device-neutral is refused with a clear error. ddp with 2 workers on checked (its buckets
# staged through host buffers, also compressed with fp16, topk and powersgd) writes checkpoints
# cmp-equal to ddp on cpu, and resumes bit for bit; so do ZeRO stages 1-3 and update=shard (their
# shards device blocks, their reduce-scatters and gathers staged, ZeRO-2/3's buckets in blocks of
# their own; a sharded checkpoint resumes on checked, and --dry-run's rows hold), tensor parallelism (tp 2, and tp 2 x dp 2) on the GPT and tp 2 on the MLP, and pp (gpipe with dp2 x pp2,
# 1f1b on the GPT, ZeRO-2 and ZeRO-3 over its DP axis; tp x pp is refused there). localsgd (plain and
# compressed, 2 workers) and ps (one worker: its deterministic setting) write checkpoints cmp-equal
# to cpu's, also when resumed from the same checkpoint; async ps on checked trains.
. "$(dirname "$0")/testlib.bash"

# one: the checkpoint FILE as one file (a sharded one, whose index and shards carry a random save
# id, consolidated with its optimizer state into FILE.one), printed
one() {
  if [ -f "$1.r0-of-2" ]; then $DT ckpt consolidate "$1" -o "$1.one" --optimizer-state >/dev/null && echo "$1.one"
  else echo "$1"; fi
}

# both: NAME ARGS...: trains on cpu and on checked and compares the checkpoints byte for byte
both() {
  local name=$1 out; shift
  for dev in cpu checked; do
    out=$($DT train --epochs 1 --quiet --eval-batches 1 --device $dev --save "$TMP/$name-$dev.st" "$@" 2>&1) \
      || { bad "$name on --device $dev: exit $? (139: a host dereference of device memory): $out"; return; }
  done
  cmp -s "$(one "$TMP/$name-cpu.st")" "$(one "$TMP/$name-checked.st")" \
    && ok "$name: checked and cpu checkpoints are cmp-equal" || bad "$name: the checkpoints of checked and cpu differ"
}

if have_fmnist; then
  both mlp --model mlp --max-steps 20 --optimizer adam --clip 1
  both mlp-fp16 --model mlp --max-steps 8 --precision fp16 --momentum 0.9
  both mlp-bf16 --model mlp --max-steps 8 --precision bf16 --optimizer adam
  both cnn --model cnn --max-steps 3 --batch 16
  # ddp, 2 workers: update=shard on both (stage 1's reduce-scatter, update and allgather, each
  # collective staged through a host copy on checked; the moments gathered for the checkpoint); with
  # --grad-accum each bucket downloaded, allreduced on the host, uploaded (update=auto takes full
  # there; cpu: in place, update=shard)
  both ddp --model mlp --max-steps 4 --workers 2 --momentum 0.9 --strategy "ddp(update=shard)"
  both ddp-accum --model mlp --max-steps 4 --workers 2 --grad-accum 2 --optimizer adam --strategy "ddp(bucket_mb=0.1)"
  # --compress on checked: each compressor runs on the bucket's staged host copy, its error feedback
  # and PowerSGD's factors in host memory beside it (warmup=0: compressed from the first step)
  both ddp-fp16 --model mlp --max-steps 4 --workers 2 --compress fp16
  both ddp-topk --model mlp --max-steps 4 --workers 2 --compress topk:0.1:momentum=0.9:warmup=0
  both ddp-powersgd --model mlp --max-steps 4 --workers 2 --compress powersgd:2:warmup=0:min_rate=0 \
    --strategy "ddp(bucket_mb=0.1)" --optimizer adam
  # resume of ddp with powersgd on checked: the model's pieces restored through the device, the
  # residual (host state) in place; 3 + 3 steps equal 6 straight
  R=(--model mlp --epochs 1 --quiet --eval-batches 1 --workers 2 --optimizer adam --device checked
    --compress powersgd:2:warmup=1 --strategy "ddp(bucket_mb=0.1)")
  $DT train "${R[@]}" --max-steps 6 --save "$TMP/cf.st" >/dev/null 2>&1 &&
    $DT train "${R[@]}" --max-steps 3 --save "$TMP/ch.st" >/dev/null 2>&1 &&
    $DT train "${R[@]}" --max-steps 6 --resume "$TMP/ch.st" --save "$TMP/cr.st" >/dev/null 2>&1 &&
    cmp -s "$TMP/cf.st" "$TMP/cr.st" && ok "ddp with powersgd resumes on checked bit for bit" \
    || bad "ddp with powersgd: resume on checked differs or fails"
  # localsgd: the optimizer on the device, the average downloaded, allreduced on the host, uploaded
  # (compressed: the delta's arithmetic on the host copy); batchnorm buffers averaged too
  BN="conv(4,3,pad=1) batchnorm relu avgpool(2) flatten linear(10)"
  both lsgd --model "$BN" --batch 16 --max-steps 5 --workers 2 --strategy "localsgd(sync_every=2)" --clip 1 \
    --optimizer adam
  # compressed, resumed on checked: the model restored through the device, the residual on the host;
  # equal to the same resume on cpu (localsgd's per-rank optimizer state is rank 0's after a resume,
  # so 3 + 3 steps are not 6 straight on any device)
  LC="localsgd(sync_every=2,compress=powersgd:2:warmup=0)"
  $DT train --model "$BN" --batch 16 --epochs 1 --quiet --workers 2 --strategy "$LC" --max-steps 3 \
    --save "$TMP/lh.st" >/dev/null 2>&1 || bad "localsgd with powersgd, 3 steps on cpu: exit $?"
  both lsgd-resume --model "$BN" --batch 16 --max-steps 6 --workers 2 --resume "$TMP/lh.st" --strategy "$LC"
  # ps with one worker (bitwise like a single process, so cmp applies): the worker clips on the device
  # and exchanges through host buffers; the servers keep host shards, download the model at start,
  # server 0 uploads the assembled model. --ps-overlap with --grad-accum; blocking with 2 servers,
  # resumed (from a 1-server checkpoint: it holds the assembled model)
  both ps-overlap --model mlp --max-steps 6 --workers 1 --strategy ps --ps-overlap --grad-accum 2 --optimizer adam
  $DT train --model mlp --epochs 1 --quiet --workers 1 --strategy ps --momentum 0.9 --max-steps 3 \
    --save "$TMP/ph.st" >/dev/null 2>&1 || bad "ps, 3 steps on cpu: exit $?"
  both ps-resume --model mlp --max-steps 6 --workers 1 --strategy "ps(servers=2)" --clip 0.5 --momentum 0.9 \
    --resume "$TMP/ph.st"
  # asynchronous ps (3 workers, 2 servers, --ps-overlap) on checked: the arrival order decides the
  # numbers, so no cmp; it trains (the handler and exchange threads share the device) and learns
  out=$($DT train --model mlp --epochs 1 --max-steps 30 --eval-batches 4 --workers 3 --strategy "ps(servers=2)" \
    --ps-overlap --device checked 2>&1)
  a=$(echo "$out" | grep -o 'test accuracy [0-9.]*' | tail -1 | cut -d' ' -f3)
  [ -n "$a" ] && python3 -c "import sys; sys.exit(float('$a') < 0.3)" && ok "async ps on checked (3 workers, 2 servers, overlap): test accuracy $a" \
    || bad "async ps on checked: $(echo "$out" | tail -3)"
  # ZeRO over 2 workers: the shards device blocks, each reduce-scatter and gather staged (cpu: in place)
  Z1=(--model mlp --workers 2 --optimizer adam --clip 0.5 --strategy "ddp(zero=1,bucket_mb=0.1)")
  both zero1 "${Z1[@]}" --max-steps 4
  both zero2 --model "conv(8,3,pad=1) batchnorm relu avgpool(2) flatten linear(10)" --max-steps 3 --batch 16 \
    --workers 2 --grad-accum 2 --optimizer adamw --clip 1 --strategy "ddp(zero=2,bucket_mb=0.01)"
  # a sharded checkpoint saved and resumed on checked: 2 steps, then 2 more, equal to zero1's 4 straight
  $DT train --epochs 1 --quiet --eval-batches 1 --device checked "${Z1[@]}" --max-steps 2 --save "$TMP/zh.st" \
    >/dev/null 2>&1 && $DT train --epochs 1 --quiet --eval-batches 1 --device checked "${Z1[@]}" --max-steps 4 \
    --resume "$TMP/zh.st" --save "$TMP/zr.st" >/dev/null 2>&1 && cmp -s "$(one "$TMP/zr.st")" "$TMP/zero1-checked.st.one" \
    && ok "zero=1 on checked resumes its sharded checkpoint bit for bit" || bad "zero=1 resume on checked differs"
  # tp on the MLP (the sequential builder's column/row pair): the row-parallel allreduce staged
  both tp-mlp --model mlp --max-steps 4 --workers 2 --strategy tp --optimizer adam --clip 0.5
  # the staged buckets still overlap backward: an allreduce (ZeRO-2: a reduce-scatter) starts before
  # its step's backward ends
  for zs in "0 allreduce" "2 reduce_scatter"; do read -r zst coll <<<"$zs"
    $DT train --workers 2 --model "flatten linear(64) relu linear(64) relu linear(10)" --max-steps 3 --bucket-mb 0.01 \
      --zero $zst --quiet --device checked --timeline "$TMP/t.json" >"$TMP/t.log" 2>&1 \
      || bad "ddp --zero $zst timeline on checked: $(cat "$TMP/t.log")"
    python3 - "$TMP/t.json" "$coll" <<'PY' && ok "ddp --zero $zst on checked: a staged bucket's $coll starts before backward ends" \
      || bad "ddp --zero $zst on checked: no bucket overlaps backward"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
back = {(e["pid"], e["args"]["step"]): e["ts"] + e["dur"] for e in ev if e["name"] == "backward"}
assert any(e["name"].startswith(sys.argv[2]) and e["ts"] < back.get((e["pid"], e["args"]["step"]), -1) for e in ev)
PY
  done
  # pp on checked: activations and gradients staged through host slots, losses read once a step,
  # clip from device sqnorm partials; dp2 x pp2 stages the DP average and batchnorm's buffers,
  # GPipe recomputes the forwards (its buffers kept in a host copy); eval runs on the stages
  both pp-gpipe --model "flatten linear(32) batchnorm relu linear(10)" --max-steps 4 --workers 4 --optimizer adam \
    --clip 0.5 --strategy "pp(schedule=gpipe,microbatches=4)"
  # pp's ZeRO-2 over dp2: the chunk's moments and the gradient shard on the device, the reduce-scatter
  # and allgather on host copies, the clip norm from the shard's sqnorm
  both pp-zero2 --model mlp --max-steps 4 --workers 4 --optimizer adam --clip 0.5 --strategy "pp(zero=2,schedule=1f1b)"
  # resume under pp on checked: 3 steps, then 3 more, equal to 6 straight (moments through the sync)
  ppr() { $DT train --model mlp --epochs 1 --quiet --eval-batches 1 --optimizer adam --device checked --workers 2 \
    --strategy "pp(schedule=1f1b,microbatches=2)" "$@" >/dev/null 2>&1; }
  ppr --max-steps 6 --save "$TMP/ppfull.st" && ppr --max-steps 3 --save "$TMP/pphalf.st" &&
    ppr --max-steps 6 --resume "$TMP/pphalf.st" --save "$TMP/ppres.st" && cmp -s "$TMP/ppfull.st" "$TMP/ppres.st" \
    && ok "pp resume on checked continues bit for bit" || bad "pp resume on checked differs"
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
both gpt-bf16 --data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --optimizer adamw --max-steps 4 \
  --precision bf16
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
# pp 1f1b on the GPT: its tied embedding's gradient summed over the stages (staged), clipped
both pp-gpt --data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --optimizer adamw --max-steps 4 \
  --workers 2 --strategy "pp(schedule=1f1b)" --clip 0.5
# ddp's ZeRO-3: the rank's parameter shard a device block; a node's buckets gathered (through host
# copies) into staging blocks bound into the graph and freed after; a bucket's gradients in a block
# from backward's first write (kept over --grad-accum's micro-batches) to its reduce; the tied
# embedding's bucket read by the first and the last node
z3=(--data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --optimizer adamw --workers 2 --clip 0.5
  --grad-accum 2 --strategy "ddp(zero=3,bucket_mb=0.01)")
both zero3 "${z3[@]}" --max-steps 4
# its sharded checkpoint resumed on checked: 2 steps, then 2 more, equal to zero3's 4 straight
$DT train --epochs 1 --quiet --eval-batches 1 --device checked "${z3[@]}" --max-steps 2 --save "$TMP/z3h.st" \
  >/dev/null 2>&1 && $DT train --epochs 1 --quiet --eval-batches 1 --device checked "${z3[@]}" --max-steps 4 \
  --resume "$TMP/z3h.st" --save "$TMP/z3r.st" >/dev/null 2>&1 && cmp -s "$(one "$TMP/z3r.st")" "$TMP/zero3-checked.st.one" \
  && ok "zero=3 on checked resumes its sharded checkpoint bit for bit" || bad "zero=3 resume on checked differs"
# --save-weights under ZeRO: rank 0 assembles the model from every rank's pieces, downloaded from the device
for dev in cpu checked; do
  $DT train --epochs 1 --quiet --eval-batches 1 --device $dev "${z3[@]}" --max-steps 1 --save-weights "$TMP/z3w-$dev.st" \
    >"$TMP/z3w.log" 2>&1 || bad "zero=3 --save-weights on $dev: exit $?: $(tail -2 "$TMP/z3w.log")"
done
cmp -s "$TMP/z3w-cpu.st" "$TMP/z3w-checked.st" && ok "zero=3 --save-weights: checked and cpu files are cmp-equal" \
  || bad "zero=3 --save-weights: the files of checked and cpu differ"
# pp's ZeRO-3 on dp2 x pp2: each node's tensors gathered on a host copy before it runs, zeroed after
both pp-zero3 --data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --optimizer adamw --max-steps 3 \
  --workers 4 --strategy "pp(zero=3,schedule=gpipe)" --clip 0.5

# --device cuda where it cannot run (no GPU or driver here, or a build without CUDA): exit 78 (the
# configuration cannot run) with what was found and what to use instead; on a GPU machine it runs
out=$($DT train --device cuda --data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --max-steps 1 \
  --quiet 2>&1); rc=$?
if [ $rc -eq 0 ]; then
  echo "note: --device cuda ran here (a GPU is present): make test-gpu checks it against the cpu"
elif [ $rc -eq 78 ] && grep -q "use --device cpu" <<<"$out" && grep -qE "needs an NVIDIA GPU|built without CUDA" <<<"$out"; then
  ok "--device cuda without a GPU: exit 78, saying what is missing and to use --device cpu"
else
  bad "--device cuda without a GPU: exit $rc, wanted 78 and a clear error: $out"
fi

expect_fail "an unknown device names the devices" "devices: cpu, checked, cuda" $DT train --device gpu --max-steps 1
expect_fail "a bad checked option names the syntax" "arena=BYTES" $DT train --device checked:size=1 --max-steps 1
# --dry-run on a device: ZeRO-2 and -3 hold what they hold on cpu (a bucket's gradients in a block of
# its own until reduced; ZeRO-3 the parameter shard, each gathered bucket a whole staging block),
# besides the host copies their collectives run on; the checked device charges its blocks against
# --mem-limit, and ZeRO-2 and -3 train under 1.02 times the plan's total
zplan() { $DT train --data "text:$TMP/corpus.txt" --model "gpt:L=2,H=2,C=64,T=16" --batch 4 --optimizer adam \
  --workers 2 --bucket-mb 0.02 --val-fraction 0 --max-steps 2 "$@" 2>&1; }
rowof() { awk -v r="$1" 'index($0, "  " r " ") == 1 { print $(NF - 3); exit }'; }
c2=$(zplan --device checked --zero 2 --dry-run); u2=$(zplan --device cpu --zero 2 --dry-run)
c3=$(zplan --device checked --zero 3 --dry-run); u3=$(zplan --device cpu --zero 3 --dry-run)
p2=$(rowof parameters <<<"$c2"); g2=$(rowof gradients <<<"$c2"); h2=$(rowof "host staging" <<<"$c2")
p3=$(rowof parameters <<<"$c3"); o3=$(rowof optimizer <<<"$c3")
[ -n "$g2" ] && [ "$g2" = "$(rowof gradients <<<"$u2")" ] && [ "$g2" -lt "$p2" ] && [ "$h2" = "$p2" ] \
  && [ -n "$p3" ] && [ "$p3" = "$(rowof parameters <<<"$u3")" ] && [ "$((2 * p3))" -le "$((p2 + 64))" ] \
  && [ "$o3" = "$(rowof optimizer <<<"$u3")" ] && [ -n "$(rowof gathered <<<"$c3")" ] \
  && ok "--dry-run on checked: ZeRO-2's gradients $g2 bytes (the cpu's; parameters $p2), ZeRO-3's parameters $p3" \
  || bad "--dry-run on checked, --zero 2 and 3: $c2 / $c3"
for z in 2 3; do
  t=$(rowof total <<<"$([ $z = 2 ] && echo "$c2" || echo "$c3")"); lim=$((t * 102 / 100))
  out=$(zplan --device checked --zero $z --mem-limit $lim); rc=$?
  [ $rc -eq 0 ] && [ "$(grep -c "held at most" <<<"$out")" = 2 ] \
    && ok "ZeRO-$z on checked trains under --mem-limit $lim (1.02 x the plan's $t): $(grep -o 'held at most [0-9]*' <<<"$out" | head -1) bytes" \
    || bad "ZeRO-$z on checked under --mem-limit $lim (exit $rc): $out"
done
expect_fail "tp x pp is refused on checked" "pp with tp=2 (stages of tensor-parallel shards) does not run on" \
  $DT train --device checked --workers 4 --data "text:$TMP/corpus.txt" --model "gpt:L=2,H=2,C=32,T=16" --tp 2 --pp 2 \
  --max-steps 1
finish
