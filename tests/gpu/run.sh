#!/bin/bash
# make test-gpu (docs/device.md "cuda"): the cuda device on a GPU against the cpu device, in one
# command, for a session with a GPU for a few minutes. Prints what it ran and what it found:
#   1. every step primitive and kernel slot on random inputs (cuda_ops_test: a line per op);
#   2. MLP, CNN (and batchnorm/dropout/avgpool/tanh layers) and a small GPT, 20 steps each, on cuda
#      and on cpu: the loss curves agree to f32 tolerance;
#   3. a resume on the GPU continues bit for bit; a GPU checkpoint resumes on the CPU;
#   4. ddp with 2 ranks on one GPU (host-staged shm collectives) equals 1 rank at the same batch.
# Without a GPU it says so and exits 1: nothing has been shown then. DTRAIN_CUDA_SYNC=1 makes the
# device wait after every call, so a failing kernel is named at the call that launched it.
# DTRAIN_GPU_DEVICE=checked runs the whole script against the checked device instead: a check of the
# script itself on a machine without a GPU (it proves nothing about cuda).
. "$(dirname "$0")/../testlib.bash"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T0=$(date +%s)
# a bundle from scripts/gpu-bundle carries its libraries; cuBLASLt and cuDNN come from the loader
# path, DTRAIN_CUDA_LIBS, or else the lib folders of PyTorch's nvidia wheels, found here
[ -d "$BUILD/lib" ] && export LD_LIBRARY_PATH="$(cd "$BUILD/lib" && pwd):${LD_LIBRARY_PATH:-}"
if [ -z "${DTRAIN_CUDA_LIBS:-}" ]; then
  DTRAIN_CUDA_LIBS=$(python3 - 2>/dev/null <<'PY'
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
print(":".join(dirs + ["/usr/local/cuda/lib64"]))
PY
  ) && export DTRAIN_CUDA_LIBS
fi
DEV=${DTRAIN_GPU_DEVICE:-cuda}
probe=$("$BUILD/gpu/cuda_ops_test" --device "$DEV" --probe 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  echo "test-gpu: NO GPU HERE: $probe"
  echo "test-gpu: nothing was run, so nothing is shown (this is not a pass)"
  exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$DT" --version 2>/dev/null | head -1

echo "== 1. every op against the cpu device"
"$BUILD/gpu/cuda_ops_test" --device "$DEV" && ok "cuda_ops_test: every op within its tolerance" || bad "cuda_ops_test (lines marked FAIL above)"

# The data: Fashion-MNIST where installed, else 2,000 synthetic 28x28 images in its IDX format
# (class-dependent stripes plus noise); a word corpus for the GPT.
FM=/usr/share/datasets/fashion-mnist
if [ ! -f "$FM/train-images-idx3-ubyte.gz" ]; then
  FM="$TMP/fm"
  python3 - "$FM" <<'PY'
import gzip, os, random, struct, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True); random.seed(5)
for name, n in (("train", 2000), ("t10k", 500)):
    labels = [random.randrange(10) for _ in range(n)]
    px = bytearray()
    for y in labels:
        for r in range(28):
            for c in range(28):
                px.append(min(255, (200 if (r + c * y) % 10 < 3 else 20) + random.randrange(40)))
    with gzip.open(f"{d}/{name}-images-idx3-ubyte.gz", "wb") as f: f.write(struct.pack(">IIII", 2051, n, 28, 28) + px)
    with gzip.open(f"{d}/{name}-labels-idx1-ubyte.gz", "wb") as f: f.write(struct.pack(">II", 2049, n) + bytes(labels))
PY
fi
python3 "$DTRAIN_TOOLS/word_corpus.py" "$TMP/corpus.txt" 7 20000

COMMON=(--epochs 1 --quiet --eval-batches 1 --log-every 1)
# curve NAME ARGS...: 20 steps on cpu and on cuda; the step losses agree within 1e-3 relative
curve() {
  local name=$1; shift
  for dev in cpu $DEV; do
    "$DT" train "${COMMON[@]}" --device $dev --max-steps 20 --metrics "$TMP/$name-$dev.jsonl" "$@" >"$TMP/$name-$dev.log" 2>&1 \
      || { bad "$name on --device $dev: exit $?: $(tail -5 "$TMP/$name-$dev.log")"; return; }
  done
  d=$(python3 - "$TMP/$name-cpu.jsonl" "$TMP/$name-$DEV.jsonl" <<'PY'
import json, sys
def losses(p): return [r["train_loss"] for r in map(json.loads, open(p)) if r.get("kind") == "step"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b))
print(f"max rel diff {worst:.2e}, loss {a[0]:.4f} -> {a[-1]:.4f} on cpu, {b[-1]:.4f} on cuda")
sys.exit(0 if worst <= 1e-3 else 1)
PY
  ) && ok "$name, 20 steps: cuda's loss curve is cpu's ($d)" || bad "$name: loss curves differ: $d"
}

echo "== 2. loss curves, cuda against cpu"
curve mlp --data "$FM" --model mlp --batch 32 --optimizer sgd --momentum 0.9 --lr 0.05
curve cnn --data "$FM" --model cnn --batch 16 --optimizer sgd --momentum 0.9 --lr 0.02
curve layers --data "$FM" --batch 16 --optimizer adam --lr 1e-3 \
  --model "conv(8,3,pad=1) batchnorm relu avgpool(2) flatten dropout(0.2) linear(32) tanh linear(10)"
curve gpt --data "text:$TMP/corpus.txt" --model "gpt:L=2,H=4,C=64,T=32" --batch 8 --optimizer adamw --lr 1e-3

echo "== 3. resume on the GPU; a GPU checkpoint on the CPU"
R=(--data "$FM" --model mlp --epochs 1 --quiet --eval-batches 1 --optimizer adam)
"$DT" train "${R[@]}" --device $DEV --max-steps 8 --save "$TMP/full.st" >"$TMP/r1.log" 2>&1 &&
  "$DT" train "${R[@]}" --device $DEV --max-steps 4 --save "$TMP/half.st" >"$TMP/r2.log" 2>&1 &&
  "$DT" train "${R[@]}" --device $DEV --max-steps 8 --resume "$TMP/half.st" --save "$TMP/res.st" >"$TMP/r3.log" 2>&1 \
  || bad "resume runs on cuda failed: $(tail -3 "$TMP"/r[123].log)"
cmp -s "$TMP/full.st" "$TMP/res.st" && ok "resume on cuda: 4 + 4 steps are 8 straight, bit for bit" \
  || bad "resume on cuda differs from the straight run ($(python3 "$DTRAIN_TOOLS/ckpt_diff.py" "$TMP/full.st" "$TMP/res.st" 0 --abs))"
"$DT" train "${R[@]}" --device $DEV --max-steps 8 --save "$TMP/full2.st" >/dev/null 2>&1 && cmp -s "$TMP/full.st" "$TMP/full2.st" \
  && ok "cuda runs are deterministic: two 8-step runs write the same checkpoint" || bad "two identical cuda runs differ"
"$DT" train "${R[@]}" --device cpu --max-steps 8 --resume "$TMP/half.st" --save "$TMP/cpu_res.st" >"$TMP/r4.log" 2>&1 \
  || bad "the GPU checkpoint does not resume on the CPU: $(tail -3 "$TMP/r4.log")"
d=$(python3 "$DTRAIN_TOOLS/ckpt_diff.py" "$TMP/full.st" "$TMP/cpu_res.st" 1e-3 --params) \
  && ok "a GPU checkpoint resumed on the CPU: 4 more steps land where cuda's did ($d)" || bad "GPU->CPU resume: $d"

echo "== 4. ddp, 2 ranks on one GPU (host-staged shm) = 1 rank at the same global batch"
D=(--data "$FM" --model mlp --optimizer sgd --max-steps 20 --epochs 1 --quiet --eval-batches 1 --device $DEV)
"$DT" train "${D[@]}" --batch 64 --save "$TMP/eq1.st" >"$TMP/d1.log" 2>&1 &&
  "$DT" train "${D[@]}" --workers 2 --batch 32 --save "$TMP/eq2.st" >"$TMP/d2.log" 2>&1 \
  || bad "ddp runs on cuda failed: $(tail -3 "$TMP"/d[12].log)"
d=$(python3 "$DTRAIN_TOOLS/ckpt_diff.py" "$TMP/eq1.st" "$TMP/eq2.st" 1e-5 --params) \
  && ok "ddp on one GPU: 2 ranks x 32 = 1 rank x 64 after 20 SGD steps ($d)" || bad "ddp 2 ranks differ from 1: $d"

echo "not run here: NCCL (a separate transport), bf16/fp16 on the GPU (the cuda table is f32 so far), other strategies"
echo "test-gpu: $(( $(date +%s) - T0 )) s"
finish
