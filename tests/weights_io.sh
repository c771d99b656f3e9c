# Weights in and out (issue 16). In: plain safetensors files written from PyTorch state_dicts
# (tests/ref/weights, by tests/ref/gen_weights_ref.py; F32, BF16, and F16 with a batchnorm's
# num_batches_tracked) load with --weights/--model, and `dtrain eval` gives PyTorch's test loss
# (to 1e-5) and accuracy (exactly); a mis-shaped, missing or extra tensor is named, with the
# expected shape. Out: --save-weights files load into the equivalent torch model with a strict
# load_state_dict (MLP with --normalize folded in, a conv/batchnorm net, a GPT with its tied
# lm_head) and give dtrain's logits; `dtrain eval --weights` of them equals eval of the checkpoint.
# Needs Fashion-MNIST; the torch half skips without python3-torch.
. "$(dirname "$0")/testlib.bash"
ROOT=${DTRAIN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
REF="$ROOT/tests/ref/weights"
PY=/usr/bin/python3
if ! have_fmnist; then echo "skip: Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"; exit 77; fi
SAN=${DTRAIN_SANITIZED:+1}
steps=$([ -n "$SAN" ] && echo 20 || echo 80)

# ---- weights in: dtrain eval of the PyTorch-written files against PyTorch's figures ----
for f in mlp_f32 mlp_bf16 cnn_f16; do
  read -r spec loss acc < <(python3 -c "import json,sys; e=json.load(open('$REF/expected.json'))['$f.safetensors']; print(e['model'].replace(' ','_'), repr(e['loss']), repr(e['acc']))")
  spec=${spec//_/ }
  out=$($DT eval --weights "$REF/$f.safetensors" --model "$spec" 2>&1) || { bad "$f: eval failed: $out"; continue; }
  read -r d_loss d_acc < <(sed -E 's/.*loss ([0-9.]+), accuracy ([0-9.]+).*/\1 \2/' <<<"$out")
  python3 -c "import sys; sys.exit(0 if abs($d_loss-$loss) <= 1e-5 and round($d_acc*10000) == round($acc*10000) else 1)" \
    && ok "$f ($spec): dtrain eval loss $d_loss acc $d_acc = PyTorch's $loss $acc" \
    || bad "$f: dtrain eval loss $d_loss acc $d_acc, PyTorch $loss $acc"
done
W="$REF/mlp_f32.safetensors"
expect_fail "mis-shaped tensor named with the expected shape" "'1.weight' has shape [16, 784], the model expects [32, 784]" \
  $DT eval --weights "$W" --model "flatten linear(32) relu linear(10)"
expect_fail "missing tensor named with its shape" "'5.weight' (expected shape [10, 16]) is missing" \
  $DT eval --weights "$W" --model "flatten linear(16) relu linear(16) relu linear(10)"
expect_fail "extra tensor named" "'3.bias' is not a tensor of the model" \
  $DT eval --weights "$W" --model "flatten linear(16) relu linear(10,bias=0)"
$DT eval --weights "$W" --model "flatten linear(32) relu linear(10)" >/dev/null 2>&1; rc=$?
[ $rc -eq 78 ] && ok "an unusable weights file exits 78" || bad "mis-shaped weights exit $rc, want 78"
expect_fail "plain weights need --model" "needs --model SPEC" $DT eval --weights "$W"
expect_fail "--weights and --resume exclude each other" "pass one of them" \
  $DT train --weights "$W" --model "flatten linear(16) relu linear(10)" --resume "$W" --max-steps 1
# fine-tuning starts from the weights: a step at a negligible learning rate keeps PyTorch's loss
out=$($DT train --weights "$W" --model "flatten linear(16) relu linear(10)" --max-steps 1 --lr 1e-12 --quiet 2>&1)
grep -q "test_loss 0.5902 test_acc 0.7913" <<<"$out" && ok "train --weights starts from the file's weights" \
  || bad "train --weights: $out"

# ---- weights out: --save-weights (trained on a subset: 3000 training, 2000 test images) ----
FM="$TMP/fm"
python3 "$ROOT/tests/tools/fmnist_subset.py" /usr/share/datasets/fashion-mnist "$FM" 3000 2000 || bad "fmnist subset"
export DTRAIN_DATA_CACHE=0
$DT train --data "$FM" --model mlp --normalize --max-steps $steps --quiet --save "$TMP/mlp.st" --save-weights "$TMP/mlp.w" >/dev/null \
  || bad "train mlp --save-weights"
$DT predict --data "$FM" --checkpoint "$TMP/mlp.st" --logits -o "$TMP/ck.jsonl" >/dev/null || bad "predict --checkpoint"
$DT predict --data "$FM" --weights "$TMP/mlp.w" --logits -o "$TMP/w.jsonl" >/dev/null || bad "predict --weights (spec from the file)"
python3 - "$TMP/ck.jsonl" "$TMP/w.jsonl" <<'PY' && ok "the --save-weights file (normalisation folded) on raw inputs = the checkpoint on normalised ones" || bad "folded weights differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 2000
d = max(abs(x - y) for r, s in zip(a, b) for x, y in zip(r["logits"], s["logits"]))
print(f"max logit difference {d:.2e} over {len(a)} test images"); assert d <= 1e-4, d
PY
SPEC_BN="conv(4,3) batchnorm relu maxpool(2) flatten linear(10)"
$DT train --data "$FM" --model "$SPEC_BN" --normalize --max-steps $steps --quiet --save "$TMP/bn.st" --save-weights "$TMP/bn.w" >/dev/null \
  || bad "train conv/batchnorm --save-weights"
expect_fail "--save-weights refuses --normalize before a padded conv at start" "padded conv" \
  $DT train --data "$FM" --model "conv(4,3,pad=1) relu flatten linear(10)" --normalize --max-steps 1 --save-weights "$TMP/no.w"
[ ! -e "$TMP/no.w" ] && ok "no weights file after the refusal" || bad "a weights file was written after the refusal"
python3 -c "
import random; random.seed(3); w='and the lord spake unto moses saying .'.split()
open('$TMP/c.txt','w').write(' '.join(random.choice(w) for _ in range(3000)))"
$DT train --data "text:$TMP/c.txt" --model "gpt:L=1,H=2,C=16,T=8" --max-steps 10 --quiet --save "$TMP/g.st" \
  --save-weights "$TMP/g.w" >/dev/null || bad "train gpt --save-weights"
for m in mlp bn; do
  $DT predict --data "$FM" --checkpoint "$TMP/$m.st" --limit 300 --logits -o "$TMP/$m.jsonl" >/dev/null || bad "predict $m"
done
$DT predict --checkpoint "$TMP/g.st" --data "text:$TMP/c.txt" --limit 20 --logits -o "$TMP/g.jsonl" >/dev/null || bad "predict gpt"
# predict: CSV with a header and one row per sample; errors leave no file
$DT predict --data "$FM" --checkpoint "$TMP/mlp.st" --limit 25 -o "$TMP/p.csv" >/dev/null || bad "predict csv"
[ "$(head -1 "$TMP/p.csv")" = "index,label,prediction,probability" ] && [ "$(wc -l <"$TMP/p.csv")" -eq 26 ] \
  && ok "predict writes CSV: a header and 25 rows" || bad "predict csv: $(head -3 "$TMP/p.csv")"
expect_fail "predict of a GPT on image data" "does not fit model gpt" $DT predict --data "$FM" --checkpoint "$TMP/g.st" -o "$TMP/x.csv"
expect_fail "predict into a missing directory names it" "$TMP/no/p.csv" $DT predict --data "$FM" --checkpoint "$TMP/mlp.st" -o "$TMP/no/p.csv"
expect_fail "eval --model against another checkpoint's model" "leave out --model" \
  $DT eval --checkpoint "$TMP/mlp.st" --model cnn
[ ! -e "$TMP/x.csv" ] && ok "no predictions file after a refusal" || bad "a refused predict left $TMP/x.csv"
if ! $PY -c "import torch" 2>/dev/null; then
  echo "note: $PY has no torch (apt-get install python3-torch): strict torch loads not checked"
  finish; exit
fi
$PY - "$TMP" <<'PY' && ok "torch load_state_dict(strict=True) takes the --save-weights files; logits = dtrain's" || bad "torch strict load"
import gzip, json, os, sys
import torch, torch.nn as nn
sys.path.insert(0, os.environ["DTRAIN_TOOLS"])
from torch_models import gpt, load_safetensors as load
tmp = sys.argv[1]
def rows(path): return [json.loads(l) for l in open(path)]
b = gzip.open("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz").read()
x = torch.frombuffer(bytearray(b[16:16 + 300 * 784]), dtype=torch.uint8).float().div(255).view(300, 1, 28, 28)
def check(model, path, preds, inp):
    model.load_state_dict(load(path), strict=True)  # raises on any missing or unexpected key
    model.eval()
    with torch.no_grad(): out = model(inp)
    want = torch.tensor([r["logits"] for r in rows(preds)]).view(out.shape)
    d = (out - want).abs().max().item()
    print(f"{path}: max |torch - dtrain| logit {d:.2e}")
    assert d < 1e-4, d
check(nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)), f"{tmp}/mlp.w", f"{tmp}/mlp.jsonl", x)
check(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(676, 10)),
      f"{tmp}/bn.w", f"{tmp}/bn.jsonl", x)
g = rows(f"{tmp}/g.jsonl")
check(gpt(1, 2, 16, 8), f"{tmp}/g.w", f"{tmp}/g.jsonl", torch.tensor([r["ids"] for r in g]))
PY
finish
