# The device layer end to end (docs/device.md): single-process training on --device checked (the
# CPU kernels on memory the host cannot touch, so any host dereference of model memory crashes)
# writes checkpoints cmp-equal to --device cpu for the MLP, the CNN and a tiny GPT, with fp16 loss
# scaling (also skipping steps and halving its scale) and clipping on the device, bf16 (the MLP and
# the GPT), and a resume on checked continues bit for bit; what is not yet device-neutral is refused
# with a clear error. ddp with 2 and 3 workers on checked (its buckets staged through host buffers,
# also compressed with fp16, topk and powersgd) writes checkpoints cmp-equal to ddp on cpu, and
# resumes bit for bit; so do ZeRO stages 1-3 and update=shard (their shards device blocks, their
# reduce-scatters and gathers staged, ZeRO-2/3's buckets in blocks of their own; a sharded checkpoint
# resumes on checked, and --dry-run's rows hold), tensor parallelism
# (tp 2, tp 2 x dp 2, tp 2 x dp 2 with ZeRO-1 and -2; tp's ZeRO-3 is refused there) on the GPT and
# tp 2 on the MLP, pp (gpipe with dp2 x pp2, 1f1b on the GPT, ZeRO-2 and ZeRO-3 over its DP axis)
# and tp 2 x pp 2. localsgd (plain and compressed, 2 workers) and ps (one worker: its deterministic
# setting) write checkpoints cmp-equal to cpu's, also when resumed from the same checkpoint; async
# ps on checked trains.
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

# resumed NAME HALF FULL ARGS...: the checked run of `both NAME ARGS --max-steps FULL` again on checked
# in two parts, HALF steps saved and resumed to FULL: cmp-equal to NAME-checked.st
resumed() {
  local name=$1 half=$2 full=$3; shift 3
  local c=(--epochs 1 --quiet --eval-batches 1 --device checked "$@")
  $DT train "${c[@]}" --max-steps $half --save "$TMP/$name-half.st" >/dev/null 2>&1 &&
    $DT train "${c[@]}" --max-steps $full --resume "$TMP/$name-half.st" --save "$TMP/$name-res.st" >/dev/null 2>&1 &&
    cmp -s "$TMP/$name-checked.st" "$TMP/$name-res.st" && ok "$name resumes on checked bit for bit ($half + $((full - half)) steps)" \
    || bad "$name: the resume on checked differs from $full straight steps (or a run failed)"
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
  # and PowerSGD's factors in host memory beside it (warmup=0: compressed from the first step); fp16 on
  # 3 workers (an odd world: each bucket allreduced over 3 ranks on the host copies)
  both ddp-fp16 --model mlp --max-steps 4 --workers 3 --compress fp16
  both ddp-topk --model mlp --max-steps 4 --workers 2 --compress topk:0.1:momentum=0.9:warmup=0
  both ddp-powersgd --model mlp --max-steps 4 --workers 2 --compress powersgd:2:warmup=0:min_rate=0 \
    --strategy "ddp(bucket_mb=0.1)" --optimizer adam
  # resume of ddp with powersgd on checked: the model's pieces restored through the device, the
  # residual (host state) in place
  resumed ddp-powersgd 2 4 --model mlp --workers 2 --compress powersgd:2:warmup=0:min_rate=0 \
    --strategy "ddp(bucket_mb=0.1)" --optimizer adam
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
# fp16 loss scaling that really skips: a regression (mse, float IDX targets near 20) at batch 4, whose
# scaled gradient (65536 x 2 x error / 4) overflows fp16's GEMM inputs at first: steps are skipped and
# the scale halved (the non-finite flag read from device memory) until it fits; equal to cpu, skips included
mkdir -p "$TMP/reg"
python3 - "$TMP/reg" <<'PY'
import random, struct, sys
def idx(path, dims, vals):  # an IDX file of f32 (type 0x0D), big-endian
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x0D, len(dims)]) + struct.pack(">%dI" % len(dims), *dims) + struct.pack(">%df" % len(vals), *vals))
random.seed(1)
for part, n in (("train", 64), ("t10k", 16)):
    X = [random.uniform(-1, 1) for _ in range(n * 4)]
    idx("%s/%s-images-idx3-ubyte" % (sys.argv[1], part), (n, 2, 2), X)
    idx("%s/%s-labels-idx1-ubyte" % (sys.argv[1], part), (n,), [20 + 10 * X[4 * i] for i in range(n)])
PY
both fp16-skip --data "$TMP/reg" --model "flatten linear(8) relu linear(1) mse" --batch 4 --max-steps 8 --precision fp16
ls=$(python3 - "$TMP/fp16-skip-checked.st" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
print(json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]["dtrain.loss_scale"])  # scale,good,skipped
PY
)
IFS=, read -r lsc lgood lskip <<<"$ls"
[ "${lskip:-0}" -gt 0 ] && [ "${lsc%.*}" -lt 65536 ] && ok "fp16 on checked skipped $lskip steps, scale 65536 -> $lsc" \
  || bad "fp16 on checked: no step skipped or scale not lowered (loss_scale '$ls')"
# tp: the shards on the device, the activation allreduces and the vocabulary-parallel loss's row
# reductions staged through host buffers, the clip's norm from one sqnorm partial per rank
tpgpt=(--data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --strategy tp)
tpa=("${tpgpt[@]}" --workers 2 --optimizer adamw --clip 0.5 --grad-accum 2)
both tp "${tpa[@]}" --max-steps 4
both tp-dp "${tpgpt[@]}" --workers 4 --optimizer adam --max-steps 2 --clip 1  # tp 2 x dp 2: the dp axis's ddp
resumed tp 2 4 "${tpa[@]}"  # the shards restored through host copies
# tp with ZeRO over the dp axis (tp 2 x dp 2): the packed moments (and ZeRO-2's gradient shard) device
# blocks, the clip's norm from sqnorm partials of the counted tensors; ZeRO-2 resumed (its moments
# expanded into a whole local optimizer on the device and packed back)
tpz=("${tpgpt[@]}" --workers 4 --optimizer adam --clip 0.5)
both tp-zero1 "${tpz[@]}" --strategy "tp(zero=1,bucket_mb=0.01)" --max-steps 2
both tp-zero2 "${tpz[@]}" --strategy "tp(zero=2,bucket_mb=0.01)" --max-steps 3
resumed tp-zero2 2 3 "${tpz[@]}" --strategy "tp(zero=2,bucket_mb=0.01)"
expect_fail "tp with ZeRO-3 is refused on checked" "tp with zero=3 (ZeRO-3 over the mesh's dp axis" \
  $DT train "${tpgpt[@]}" --device checked --workers 4 --strategy "tp(zero=3)" --max-steps 1
# tp 2 x pp 2 (1f1b): each stage's shard whole on the device, its hooks' allreduces and the
# vocabulary-parallel loss staged, the sync's gathers, broadcasts and moment sends staged; resumed
tpp=(--data "text:$TMP/corpus.txt" --model "gpt:L=2,H=2,C=32,T=16" --batch 4 --workers 4 --tp 2 --pp 2
  --optimizer adamw --clip 0.5)
both tp-pp "${tpp[@]}" --max-steps 3
resumed tp-pp 2 3 "${tpp[@]}"
# pp 1f1b on the GPT: its tied embedding's gradient summed over the stages (staged), clipped
ppg=(--data "text:$TMP/corpus.txt" --model "gpt:L=1,H=2,C=32,T=16" --batch 4 --optimizer adamw --workers 2
  --strategy "pp(schedule=1f1b)" --clip 0.5)
both pp-gpt "${ppg[@]}" --max-steps 4
resumed pp-gpt 2 4 "${ppg[@]}"  # the stages' moments through the sync
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
# --mem-limit, and ZeRO-2 and -3 train under 1.05 times the plan's total (the
# issue's 5%: how many buckets are in flight at once depends on the threads' timing)
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
  t=$(rowof total <<<"$([ $z = 2 ] && echo "$c2" || echo "$c3")"); lim=$((t * 105 / 100))
  out=$(zplan --device checked --zero $z --mem-limit $lim); rc=$?
  [ $rc -eq 0 ] && [ "$(grep -c "held at most" <<<"$out")" = 2 ] \
    && ok "ZeRO-$z on checked trains under --mem-limit $lim (1.05 x the plan's $t): $(grep -o 'held at most [0-9]*' <<<"$out" | head -1) bytes" \
    || bad "ZeRO-$z on checked under --mem-limit $lim (exit $rc): $out"
done
finish
